"""What an app's text becomes before it reaches a terminal: each control character that would
act on the terminal, and each bidirectional override, shown as an escape; the rest unchanged."""

from __future__ import annotations

import pytest

from wakeful.domain.shown import shown


@pytest.mark.parametrize(
    ("text", "line", "block"),
    [
        pytest.param(
            "copied \x1b]52;c;ZWNobyBwd25lZA==\x07!",
            "copied \\x1b]52;c;ZWNobyBwd25lZA==\\x07!",
            "copied \\x1b]52;c;ZWNobyBwd25lZA==\\x07!",
            id="OSC 52 clipboard write shown, not sent",
        ),
        pytest.param(
            "\x1b]0;wakeful: all good\x07",
            "\\x1b]0;wakeful: all good\\x07",
            "\\x1b]0;wakeful: all good\\x07",
            id="OSC 0 window title shown, not set",
        ),
        pytest.param(
            "\x1b[2K\r[sb-other] forged",
            "\\x1b[2K\\r[sb-other] forged",
            "\\x1b[2K\\r[sb-other] forged",
            id="erase-line and carriage return shown",
        ),
        pytest.param(
            "\x9b2K\x9d0;title\x9c",
            "\\x9b2K\\x9d0;title\\x9c",
            "\\x9b2K\\x9d0;title\\x9c",
            id="C1 CSI, OSC and ST shown",
        ),
        pytest.param(
            "a\x00b\x08c\x7fd\x0be\x0cf\x1bg",
            "a\\x00b\\x08c\\x7fd\\x0be\\x0cf\\x1bg",
            "a\\x00b\\x08c\\x7fd\\x0be\\x0cf\\x1bg",
            id="NUL, backspace, DEL, vertical tab, form feed shown",
        ),
        pytest.param("key\tvalue", "key\tvalue", "key\tvalue", id="tab kept"),
        pytest.param(
            "Traceback:\n  line 1\nError",
            "Traceback:\\n  line 1\\nError",
            "Traceback:\n  line 1\nError",
            id="newline shown in a line, kept in a block",
        ),
        pytest.param(
            "access = 'user\u202e \u2066// admin\u2069\u2066'",
            "access = 'user\\u202e \\u2066// admin\\u2069\\u2066'",
            "access = 'user\\u202e \\u2066// admin\\u2069\\u2066'",
            id="bidi override and isolates shown",
        ),
        pytest.param(
            "\u202a\u202b\u202c\u202d\u2067\u2068",
            "\\u202a\\u202b\\u202c\\u202d\\u2067\\u2068",
            "\\u202a\\u202b\\u202c\\u202d\\u2067\\u2068",
            id="every embedding and isolate shown",
        ),
        pytest.param(
            "\u200e\u200f\u061c",
            "\\u200e\\u200f\\u061c",
            "\\u200e\\u200f\\u061c",
            id="invisible direction marks LRM, RLM and ALM shown",
        ),
        pytest.param(
            "one\u2028two\u2029three",
            "one\\u2028two\\u2029three",
            "one\\u2028two\\u2029three",
            id="line and paragraph separators shown, even in a block",
        ),
        pytest.param(
            "GET /héllo 200 ✓ 日本語 \u00a0\u200d",
            "GET /héllo 200 ✓ 日本語 \u00a0\u200d",
            "GET /héllo 200 ✓ 日本語 \u00a0\u200d",
            id="plain text in any script unchanged",
        ),
        pytest.param(
            "C:\\path\\x1b is text",
            "C:\\path\\x1b is text",
            "C:\\path\\x1b is text",
            id="a backslash stays a backslash",
        ),
        pytest.param("", "", "", id="empty stays empty"),
    ],
)
def test_shown(text: str, line: str, block: str) -> None:
    assert shown(text) == line
    assert shown(text, multiline=True) == block


def test_a_block_s_later_lines_are_set_off_so_none_passes_for_a_line_of_wakeful_s() -> None:
    forged = "boom\n2026-12-02 03:40:00,000 INFO wakeful.deploy.service: deployed evil v2"
    assert shown(forged, multiline=True, indent=True) == (
        "boom\n  | 2026-12-02 03:40:00,000 INFO wakeful.deploy.service: deployed evil v2"
    )
    assert shown("one line", multiline=True, indent=True) == "one line"


def test_what_is_shown_holds_no_control_character_and_showing_it_again_changes_nothing() -> None:
    every = "".join(chr(code) for code in range(0x2100))
    line = shown(every)
    assert not [c for c in line if (ord(c) < 0x20 and c != "\t") or 0x7F <= ord(c) < 0xA0]
    assert not [c for c in line if 0x202A <= ord(c) <= 0x202E or 0x2066 <= ord(c) <= 0x2069]
    assert not [c for c in line if c in "\u200e\u200f\u061c\u2028\u2029"]
    assert shown(line) == line
    assert "\n" in shown(every, multiline=True)

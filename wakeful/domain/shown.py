"""Text an app controls, made safe to show on a person's terminal.

An app's output, its crash log and the values it sets reach terminals: `wakeful logs`, the
CLI's other lines, the control plane's own log, the ingress's plain-text error answers. A
terminal obeys the control characters in what it shows. ESC starts a sequence that can erase
a line, set the window title or (OSC 52) write the clipboard; a C1 control (U+0080-U+009F) can
start one on its own; a carriage return moves the cursor back over a prefix such as
`[sandbox] `. The bidirectional overrides and isolates (U+202A-U+202E, U+2066-U+2069) make a
line read differently from the characters it holds ("Trojan Source").

`shown` writes each of these as a visible escape, spelled as Python's `repr` spells it
(`\\x1b`, `\\r`, `\\u202e`), and leaves every other character alone: a tab, printable text in
any script. A backslash stays as it is, so text that already spells `\\x1b` looks like a shown
ESC: whoever needs the exact text reads the JSON forms (`wakeful logs --json`, an error
answer's JSON body), where `json.dumps` escapes these characters instead.
"""

from __future__ import annotations

TAB = 0x09
NEWLINE = 0x0A
CONTROLS = (*range(0x00, 0x20), 0x7F, *range(0x80, 0xA0))
"""C0, DEL and C1."""
BIDI = (*range(0x202A, 0x202F), *range(0x2066, 0x206A))
"""The embeddings and overrides (LRE, RLE, PDF, LRO, RLO) and isolates (LRI, RLI, FSI, PDI)."""


def _visible(code: int) -> str:
    if code == NEWLINE:
        return "\\n"
    if code == 0x0D:
        return "\\r"
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


_LINE = {code: _visible(code) for code in (*CONTROLS, *BIDI) if code != TAB}
_BLOCK = {code: escape for code, escape in _LINE.items() if code != NEWLINE}


def shown(text: str, *, multiline: bool = False) -> str:
    """`text` with each C0 control but tab, DEL, each C1 control and each bidirectional
    override or isolate written as a visible escape. By default the result is one line: a
    newline is shown as `\\n` too. `multiline`: newlines stay, for a block of lines (a boot
    log, a traceback)."""
    return text.translate(_BLOCK if multiline else _LINE)

"""Text an app controls, made safe to show on a person's terminal.

An app's output, its crash log and the values it sets reach terminals: `wakeful logs`, the
CLI's other lines, the control plane's own log, the ingress's plain-text error answers. A
terminal obeys the control characters in what it shows. ESC starts a sequence that can erase
a line, set the window title or (OSC 52) write the clipboard; a C1 control (U+0080-U+009F) can
start one on its own; a carriage return moves the cursor back over a prefix such as
`[sandbox] `. The bidirectional overrides and isolates (U+202A-U+202E, U+2066-U+2069) and the
direction marks (U+200E, U+200F, U+061C) make a line read differently from the characters it
holds ("Trojan Source"); U+2028 and U+2029 break a line where some viewers show them.

Shown in a block of lines (`multiline`), a newline stays; every line after the first is then
set off by `CONTINUED` when the caller asks (`indent`), so that text an app wrote (a crash
log in a rollout message or a log record) cannot pass for a line of wakeful's own.

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
BIDI = (*range(0x202A, 0x202F), *range(0x2066, 0x206A), 0x200E, 0x200F, 0x061C)
"""The embeddings and overrides (LRE, RLE, PDF, LRO, RLO), isolates (LRI, RLI, FSI, PDI) and
the invisible direction marks (LRM, RLM, ALM)."""
SEPARATORS = (0x2028, 0x2029)
"""LINE and PARAGRAPH SEPARATOR: some terminals and viewers break the line there."""


def _visible(code: int) -> str:
    if code == NEWLINE:
        return "\\n"
    if code == 0x0D:
        return "\\r"
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


_LINE = {code: _visible(code) for code in (*CONTROLS, *BIDI, *SEPARATORS) if code != TAB}
_BLOCK = {code: escape for code, escape in _LINE.items() if code != NEWLINE}


CONTINUED = "  | "
"""What sets off each line of a block after its first (`shown(..., indent=True)`)."""


def shown(text: str, *, multiline: bool = False, indent: bool = False) -> str:
    """`text` with each C0 control but tab, DEL, each C1 control, each bidirectional override,
    isolate or mark and each line or paragraph separator written as a visible escape. By
    default the result is one line: a newline is shown as `\\n` too. `multiline`: newlines
    stay, for a block of lines (a boot log, a traceback); with `indent`, every line after the
    first starts with `CONTINUED`."""
    if not multiline:
        return text.translate(_LINE)
    block = text.translate(_BLOCK)
    return block.replace("\n", "\n" + CONTINUED) if indent else block

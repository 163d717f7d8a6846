"""Text from outside (a model's reply or reasoning, a tool's arguments or result, an MCP
or attached server's words) as it may be shown on a terminal: control characters made
visible.

A terminal obeys the bytes it is sent. Rich and Textual pass ESC and the C1 controls
through to it (Rich drops only BEL, BS, VT, FF and CR), so a tool result holding
`ESC ] 52 ; c ; ...` would write the user's clipboard, `ESC ] 0 ; ...` retitle the
window and `ESC [ 2 J` clear the screen: the user approved running a tool, not that.
`visible` is the one sanitizer for multi-line text; it is applied where such text
enters the UI (the transcript, the tool blocks, the approval dialog, the tools screen,
the toasts) and where it is printed (`ssdmoe generate` on a terminal, the Markdown
export). What is stored and sent back to the model stays exact: only what is shown is
escaped. One-line messages use `errors.printable`, which also escapes newlines.
"""

from __future__ import annotations

import re

# C0 but tab and newline, DEL, C1: everything a terminal may take as (part of) a command.
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")
_ESCAPES = {chr(c): ascii(chr(c))[1:-1] for c in [*range(0x20), *range(0x7F, 0xA0)]}


def is_control(char: str) -> bool:
    """Whether `visible` escapes `char` (one character)."""
    return _CONTROL.fullmatch(char) is not None


def visible(text: str) -> str:
    """`text` with every control character but newline and tab shown as its Python escape
    (ESC as the four characters `\\x1b`, CR as `\\r`, U+009B as `\\x9b`); a CRLF line end
    is a newline. Idempotent on its own output, which holds no control character."""
    if not _CONTROL.search(text):
        return text
    return _CONTROL.sub(lambda m: _ESCAPES[m.group()], text.replace("\r\n", "\n"))

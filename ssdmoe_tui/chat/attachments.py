"""`@path` in a prompt attaches a text file: its content goes to the model with the
message, after what was typed.

The message the model sees (and the conversation stores, so the exact history, the
search and the exports have it) is the typed text, `@path` kept, followed by one block
per file:

    <attached file="notes/todo.txt">
    ...the file's text...
    </attached>

`split_attached` takes a stored message apart again for the screen (the typed text,
then a chip per file). A path is an `@` at the start of the text or after a space,
followed by anything up to the next space; relative paths are from the folder the app
was started in, `~` is the home folder. `@name` that names no file stays text (it may
be a mention; one with a `/` that names no file goes as text too, with one line saying
so, in the chips and when sent); a file too large, not UTF-8 text, or a folder is refused
in one line.
"""

from __future__ import annotations

import html
import os
import re
from dataclasses import dataclass
from pathlib import Path

from ssdmoe_tui.errors import SsdmoeError, printable
from ssdmoe_tui.units import human_bytes
from ssdmoe_tui.user_files import RefusedFile, read_regular

FILE_LIMIT = 256 << 10  # bytes per attached file
TOTAL_LIMIT = 1 << 20  # bytes for all the files of one message

_TOKEN = re.compile(r"(?:(?<=\s)|^)@(\S+)")
_BLOCK = re.compile(
    r'\n\n<attached file="([^"\n]*)">\n(.*?)\n</attached>(?=\n\n<attached |\Z)', re.S
)


class AttachmentError(SsdmoeError, ValueError):
    """One line naming the file and what is wrong with it."""


@dataclass(frozen=True)
class Attachment:
    name: str  # as typed after the @
    text: str

    @property
    def size(self) -> int:
        return len(self.text.encode())

    def chip(self) -> str:
        return f"📎 {self.name} ({human_bytes(self.size)})"


def at_words(text: str) -> tuple[str, ...]:
    """The `@word`s of a prompt as typed (no disk touched: the UI thread may call it)."""
    return tuple(_TOKEN.findall(text))


def mentioned(text: str, base: Path | None = None) -> list[str]:
    """The `@path` tokens of a prompt, in order, each once; punctuation after a path
    ("see @a.txt, then") is not part of it unless a file has that name."""
    seen: list[str] = []
    for name in at_words(text):
        bare = name.rstrip(",.;:!?)]}'\"")
        if bare != name and bare and not resolve(name, base).exists():
            name = bare
        if name not in seen:
            seen.append(name)
    return seen


def resolve(name: str, base: Path | None = None) -> Path:
    path = Path(os.path.expanduser(name))
    return path if path.is_absolute() else (base or Path.cwd()) / path


def read_attachment(name: str, base: Path | None = None) -> Attachment | None:
    """The file `@name` names, read; None when it names no file (plain text). Read
    through the one reader of user files (`user_files.read_regular`: regular files
    only, opened without blocking, the cap checked while reading), so a FIFO, a device
    or a link to /dev/zero is one line, never a hang or a MemoryError. Call it off the
    UI thread (it touches the disk)."""
    path = resolve(name, base)
    shown = printable(name)
    try:
        data = read_regular(path, FILE_LIMIT)
    except FileNotFoundError:
        return None
    except RefusedFile as e:
        if e.reason == "a folder, not a file":
            raise AttachmentError(f"@{shown} is a folder: attach its files one by one") from None
        if "-byte limit" in e.reason:
            raise AttachmentError(
                f"@{shown} is too large: an attachment can be up to {human_bytes(FILE_LIMIT)}"
            ) from None
        _refused(shown, e.reason)
    except OSError as e:
        _refused(shown, f"cannot read it ({e.strerror or e})")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise AttachmentError(f"@{shown} is not a text file (UTF-8)") from None
    if "\x00" in text:
        raise AttachmentError(f"@{shown} is not a text file (it holds NUL bytes)")
    return Attachment(name, text)


def _refused(shown: str, reason: str) -> None:
    raise AttachmentError(f"@{shown}: {printable(reason)}")


def attachments_of(text: str, base: Path | None = None) -> list[Attachment]:
    """The files a prompt attaches; AttachmentError (one line) for a bad one."""
    names = mentioned(text, base)
    found = [a for name in names if (a := read_attachment(name, base)) is not None]
    total = sum(a.size for a in found)
    if total > TOTAL_LIMIT:
        raise AttachmentError(
            f"the attached files come to {human_bytes(total)}: one message can carry "
            f"up to {human_bytes(TOTAL_LIMIT)}"
        )
    return found


def unmatched_paths(text: str, base: Path | None = None) -> list[str]:
    """The `@word`s written as paths (with a `/`) that name nothing on disk: they go as
    plain text, and the user is told so (a typo in a path must not pass unseen; a
    `@name` without `/` may be a mention and says nothing). Touches the disk."""
    return [n for n in mentioned(text, base) if "/" in n and not resolve(n, base).exists()]


def no_file_line(names: list[str]) -> str:
    """One line for `unmatched_paths`."""
    shown = ", ".join(f"@{printable(n)}" for n in names[:3]) + (" ..." if len(names) > 3 else "")
    verb = "names" if len(names) == 1 else "name"
    return f"{shown} {verb} no file: sent as text, nothing attached"


def with_attachments(text: str, files: list[Attachment]) -> str:
    """The message for the model: the typed text, then each file's block. The markers
    are escaped inside a block (`_escape_name`, `_escape_text`), so neither a quote in a
    name nor an `</attached>` in a file's text changes where the blocks are when the
    stored message is shown again (`split_attached`)."""
    blocks = "".join(
        f'\n\n<attached file="{_escape_name(a.name)}">\n{_escape_text(a.text)}\n</attached>'
        for a in files
    )
    return text + blocks


def split_attached(content: str) -> tuple[str, list[Attachment]]:
    """A stored message as typed, and its files (for the screen)."""
    first = next(_BLOCK.finditer(content), None)
    if first is None:
        return content, []
    tail = content[first.start() :]
    files = [
        Attachment(html.unescape(m.group(1)), _unescape_text(m.group(2)))
        for m in _BLOCK.finditer(tail)
    ]
    if "".join(m.group(0) for m in _BLOCK.finditer(tail)) != tail:
        return content, []  # not only blocks after the text: typed as it is
    return content[: first.start()], files


# Inside a block, `</attached>` gains one backslash (`<\/attached>`, `<\\/attached>`...) and
# loses it again on the way back: reversible, and no closing marker is left in a text.
_CLOSE = re.compile(r"<(\\*)/attached>")
_CLOSE_ESCAPED = re.compile(r"<(\\+)/attached>")


def _escape_text(text: str) -> str:
    return _CLOSE.sub(lambda m: "<\\" + m.group(1) + "/attached>", text)


def _unescape_text(text: str) -> str:
    return _CLOSE_ESCAPED.sub(lambda m: "<" + m.group(1)[1:] + "/attached>", text)


def _escape_name(name: str) -> str:
    """A name in the `file="..."` attribute: `&`, quotes and angle brackets as entities."""
    return html.escape(name, quote=True)


def complete(word: str, base: Path | None = None) -> tuple[str, list[str]]:
    """Path completion for `@word`: (the completed word, the candidates' names).
    One candidate: completed (a folder gets its "/"); several: to their common prefix."""
    head, _, stem = word.rpartition("/")
    folder = resolve(head or ".", base) if head else (base or Path.cwd())
    if word.startswith("/") and not head:
        folder = Path("/")
    try:
        names = sorted(
            e.name + ("/" if e.is_dir() else "")
            for e in os.scandir(folder)
            if e.name.startswith(stem) and (stem.startswith(".") or not e.name.startswith("."))
        )
    except OSError:
        return word, []
    if not names:
        return word, []
    prefix = os.path.commonprefix(names)
    done = (head + "/" if head or word.startswith("/") else "") + prefix
    return done, names

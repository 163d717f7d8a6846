"""Opening a file a user (or a download) put on disk: regular files only, never blocking,
never reading more than a cap.

A FIFO named `conversation.json` would block `open()` until a writer came; a symlink to
/dev/zero reads until memory runs out; a folder or a socket fails later with a reason
that misleads ("missing shard"). Every reader of a user file (conversations, the config,
the expert-index cache, traces, KV checkpoints, a model folder's config, tokenizer,
chat template and shards) goes through `open_regular` / `read_regular` /
`check_regular`, so the refusal is one line naming the file and what it actually is.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path
from typing import BinaryIO

from ssdmoe_tui.errors import SsdmoeError

KiB, MiB = 1 << 10, 1 << 20

# Caps, by reader: far above any real file, far below what would exhaust memory.
CONFIG_TOML_MAX = 1 * MiB
CONVERSATION_MAX = 256 * MiB  # a 1M-token history with its text is ~20 MiB
SMALL_STATE_MAX = 64 * KiB  # `.last_opened`, a lock label
INDEX_CACHE_MAX = 512 * MiB
MODEL_JSON_MAX = 16 * MiB  # config.json, generation_config.json, the shard index
TOKENIZER_FILE_MAX = 512 * MiB  # tokenizer.json of a 256k vocabulary is ~30 MiB
TEMPLATE_MAX = 4 * MiB
TEXT_FILE_MAX = 1024 * MiB  # a text to measure perplexity on (`ssdmoe eval --text`)

_OPEN_FLAGS = (
    os.O_RDONLY
    | getattr(os, "O_NONBLOCK", 0)
    | getattr(os, "O_CLOEXEC", 0)
    | getattr(os, "O_NOCTTY", 0)
)


class RefusedFile(SsdmoeError, OSError):
    """Not a regular file, or larger than its reader's cap. An `OSError` too (errno
    EINVAL, `strerror` = the reason), so a reader's `except OSError` reports it as any
    other unreadable file; `str()` is the whole line, naming the file."""

    def __init__(self, path: Path | str, reason: str) -> None:
        self.path = Path(path)
        self.reason = reason
        super().__init__(errno.EINVAL, reason, str(path))

    def __str__(self) -> str:
        return f"{self.path}: {self.reason}"


def _kind(mode: int) -> str | None:
    """What a non-regular file is, in words (None: a regular file)."""
    if stat.S_ISREG(mode):
        return None
    if stat.S_ISDIR(mode):
        return "a folder, not a file"
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe), not a regular file"
    if stat.S_ISCHR(mode):
        return "a character device, not a regular file"
    if stat.S_ISBLK(mode):
        return "a block device, not a regular file"
    if stat.S_ISSOCK(mode):
        return "a socket, not a regular file"
    return "not a regular file"


def _link_note(path: Path) -> str:
    try:
        if path.is_symlink():
            return f" (a link to {os.readlink(path)})"
    except OSError:
        pass
    return ""


def _size_reason(size: int, max_bytes: int) -> str:
    return f"{size:,} bytes, over the {max_bytes:,}-byte limit for this file"


def _refuse_os(path: Path, e: OSError) -> OSError:
    """ELOOP and friends become a `RefusedFile` with the real reason; a missing file
    stays `FileNotFoundError` (readers tell "not there" from "not readable")."""
    if e.errno == errno.ELOOP:
        return RefusedFile(path, "a symbolic link loop")
    if e.errno == errno.ENXIO:  # a socket or a FIFO-like device with nothing behind it
        return RefusedFile(path, "a socket or device, not a regular file")
    return e


def check_regular(path: Path | str, max_bytes: int | None = None) -> os.stat_result:
    """`stat` of a regular file (symlinks followed), without opening it: a special file,
    a link loop or an over-cap size is a `RefusedFile`; a missing one FileNotFoundError."""
    path = Path(path)
    try:
        st = os.stat(path)
    except OSError as e:
        raise _refuse_os(path, e) from None
    kind = _kind(st.st_mode)
    if kind is not None:
        raise RefusedFile(path, kind + _link_note(path))
    if max_bytes is not None and st.st_size > max_bytes:
        raise RefusedFile(path, _size_reason(st.st_size, max_bytes))
    return st


def open_regular(path: Path | str, max_bytes: int | None = None) -> BinaryIO:
    """A binary file object for a regular file, opened without blocking (a FIFO swapped
    in after the check cannot stall us: O_NONBLOCK, then fstat). Caller closes it."""
    path = Path(path)
    check_regular(path, max_bytes)
    try:
        fd = os.open(path, _OPEN_FLAGS)
    except OSError as e:
        raise _refuse_os(path, e) from None
    try:
        st = os.fstat(fd)
        kind = _kind(st.st_mode)
        if kind is not None:
            raise RefusedFile(path, kind + _link_note(path))
        if max_bytes is not None and st.st_size > max_bytes:
            raise RefusedFile(path, _size_reason(st.st_size, max_bytes))
        if hasattr(os, "set_blocking"):
            os.set_blocking(fd, True)  # a regular file: ordinary reads from here on
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_regular(path: Path | str, max_bytes: int) -> bytes:
    """The whole of a regular file, refused past `max_bytes` (also when it grows while
    being read: at most `max_bytes + 1` bytes are ever read)."""
    with open_regular(path, max_bytes) as f:
        data = f.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise RefusedFile(path, f"over the {max_bytes:,}-byte limit for this file")
    return data


def read_regular_text(path: Path | str, max_bytes: int) -> str:
    """`read_regular` decoded as UTF-8 (UnicodeDecodeError for the caller to name)."""
    return read_regular(path, max_bytes).decode("utf-8")

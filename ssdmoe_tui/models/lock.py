"""One loaded model per machine: two ssdmoe processes streaming experts would fight over RAM
and SSD bandwidth, so the second one is told who holds the model instead.

The lock is `flock` on `model.lock` in one folder per user and machine, whatever the
cache or data folders (XDG_CACHE_HOME, SSDMOE_HOME) say: `$SSDMOE_LOCK_DIR` if set (tests
give each run its own), else `<tmp>/ssdmoe-locks-<uid>` (made 0700 and checked to be
ours; else the cache folder). The kernel drops the lock when the holder exits, however
it exits, so a crash never leaves a stale lock. The file's content (pid, command, model)
is only a label for the error message; the holder removes the file when it releases it
(the inode is checked after locking, so a file removed meanwhile is never trusted), and
a label that cannot be written (disk full) removes it too, with one line saying so. On
platforms without `fcntl` (MLX does not run there) the lock is a no-op.
"""

from __future__ import annotations

import errno
import json
import os
import shlex
import stat
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from ssdmoe_tui.errors import SsdmoeError
from ssdmoe_tui.paths import cache_dir
from ssdmoe_tui.user_files import SMALL_STATE_MAX, read_regular

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

LOCK_NAME = "model.lock"


@dataclass(frozen=True)
class LockHolder:
    pid: int | None
    model: str
    command: str
    since: float | None = None


class ModelLockedError(SsdmoeError):
    """Another process holds the model lock."""

    def __init__(self, holder: LockHolder | None, path: Path):
        self.holder = holder
        self.path = path
        if holder is None or holder.pid is None:
            who = f"another process (see {path})"
        else:
            who = f"pid {holder.pid} ({holder.command or 'unknown command'})"
        model = (
            f" has {holder.model} loaded" if holder and holder.model else " holds the model lock"
        )
        super().__init__(
            f"another ssdmoe is running: {who}{model}; quit it first (one model at a time)"
        )


LOCK_DIR_ENV = "SSDMOE_LOCK_DIR"


def lock_dir() -> Path:
    """The machine-wide folder of this user's ssdmoe locks (see the module docstring)."""
    override = os.environ.get(LOCK_DIR_ENV)
    if override:
        return Path(override)
    uid = os.getuid() if hasattr(os, "getuid") else 0
    folder = Path(tempfile.gettempdir()) / f"ssdmoe-locks-{uid}"
    try:
        folder.mkdir(mode=0o700, exist_ok=True)
        st = os.lstat(folder)
        if stat.S_ISDIR(st.st_mode) and st.st_uid == uid and not st.st_mode & 0o022:
            return folder
    except OSError:
        pass
    return cache_dir()  # someone else's or unusable: the per-user cache folder still works


def lock_path() -> Path:
    return lock_dir() / LOCK_NAME


SECRET_OPTIONS = ("--api-key",)  # their values never go into the label (it is shown)
_HIDDEN = "***"


def _secret_option(arg: str) -> bool:
    """`--api-key`, or any prefix of it an argument parser might once have taken
    (`--api-k`, `--api`): parsers refuse abbreviations now, but a label written by a
    process whose parser did not must not show the key either."""
    name = arg.split("=", 1)[0]
    return (
        name.startswith("--") and len(name) > 2 and any(o.startswith(name) for o in SECRET_OPTIONS)
    )


def redact_argv(argv: list[str]) -> list[str]:
    """`argv` with the value of every secret option (and of its prefixes) as `***`."""
    out = list(argv)
    for i, arg in enumerate(out):
        if not _secret_option(arg):
            continue
        if "=" in arg:
            out[i] = arg.split("=", 1)[0] + "=" + _HIDDEN
        elif i + 1 < len(out):
            out[i + 1] = _HIDDEN
    return out


def redact_command(text: str) -> str:
    """A command line (a lock label) as it may be shown: secrets hidden."""
    try:
        return shlex.join(redact_argv(shlex.split(text)))
    except ValueError:  # unbalanced quotes: a damaged label; show none of it
        return "(command not shown)"


def _command() -> str:
    argv = list(sys.argv) or ["python"]
    argv[0] = Path(argv[0]).name or argv[0]
    text = shlex.join(redact_argv(argv))
    return text if len(text) <= 120 else text[:117] + "..."


def read_holder(path: Path | None = None) -> LockHolder | None:
    """The label the current holder wrote, if any (it may be mid-write: then None)."""
    path = path or lock_path()
    try:
        data = json.loads(read_regular(Path(path), SMALL_STATE_MAX) or b"null")
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict):
        return None
    pid = data.get("pid")
    return LockHolder(
        pid=pid if isinstance(pid, int) else None,
        model=str(data.get("model") or ""),
        command=redact_command(str(data.get("command") or "")),
        since=data.get("since") if isinstance(data.get("since"), int | float) else None,
    )


class ModelLock:
    """Held until `release()` (or the end of a `with` block, or process exit)."""

    def __init__(self, path: Path, fd: int | None, model: str):
        self.path = path
        self.model = model
        self._fd = fd

    @property
    def held(self) -> bool:
        return self._fd is not None

    def relabel(self, model: str) -> None:
        """Record a different model (switching models keeps the lock)."""
        if self._fd is None:
            raise SsdmoeError("model lock already released")
        self.model = model
        _write_label(self._fd, model, self.path)

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is None:
            return
        try:
            if _same_file(fd, self.path):
                os.unlink(self.path)  # still ours: nobody else trusts a removed inode
            else:
                os.ftruncate(fd, 0)
        except OSError:
            pass
        try:
            if fcntl is not None:
                fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)

    def __enter__(self) -> ModelLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def __repr__(self) -> str:
        return f"ModelLock({str(self.path)!r}, model={self.model!r}, held={self.held})"


def _write_label(fd: int, model: str, path: Path | None = None) -> None:
    from ssdmoe_tui.atomic import DiskFullError, is_disk_full

    label = {"pid": os.getpid(), "model": model, "command": _command(), "since": time.time()}
    data = json.dumps(label).encode("utf-8")
    try:
        os.ftruncate(fd, 0)
        os.lseek(fd, 0, os.SEEK_SET)
        if os.write(fd, data) != len(data):
            raise OSError(errno.ENOSPC, "short write")
    except OSError as e:
        if path is not None and is_disk_full(e):
            raise DiskFullError(path, len(data)) from None
        raise


def _same_file(fd: int, path: Path) -> bool:
    try:
        return os.path.samestat(os.fstat(fd), os.stat(path))
    except OSError:
        return False


def acquire_model_lock(model_desc: str, *, path: Path | None = None) -> ModelLock:
    """Take the machine-wide model lock or raise `ModelLockedError` naming the holder.

    Never blocks. Within one process a second acquire also fails (flock locks belong to
    the open file), so release before loading through another lock.
    """
    path = Path(path) if path is not None else lock_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    for _ in range(20):  # the holder may remove the file between our open and our lock
        fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o644)
        if fcntl is None:
            break
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            holder = None
            for _ in range(5):  # the holder may be between truncate and write
                holder = read_holder(path)
                if holder is not None:
                    break
                time.sleep(0.02)
            raise ModelLockedError(holder, path) from None
        except BaseException:
            os.close(fd)
            raise
        if _same_file(fd, path):
            break
        os.close(fd)  # locked a file its holder had just removed: try the new one
    else:
        raise SsdmoeError(f"cannot take the model lock {path}: it keeps being replaced")
    try:
        _write_label(fd, model_desc, path)
    except BaseException:
        if _same_file(fd, path):
            path.unlink(missing_ok=True)  # no 0-byte lock file left behind
        os.close(fd)
        raise
    return ModelLock(path, fd, model_desc)

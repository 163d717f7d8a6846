"""Atomic file writes: temp file in the same folder, fsync, rename, fsync the folder.

A crash at any point leaves either the old file or the new one, never a torn one. A
killed writer can leave its temp file behind: every temp file this project writes is
named `.<target>.<random>.p<writer pid>.tmp[.ext]`, so `remove_orphan_temps` can tell a
live writer's file (its pid runs) from an orphan, and start-up removes the orphans.
A full disk is reported as `DiskFullError` ("disk full: ... needs N bytes"), and the
temp file is removed, so the previous file stays as it was.

`atomic_folder` does the same for a whole folder (a checkpoint): built as
`.<target>.p<pid>.partial` beside it, renamed when complete.

Every file written here is 0600 and every folder it creates 0700: what goes through it
(conversations, KV checkpoints, the server's prompt history, exports, indexes, the
config) is derived from a user's prompts or private to them, whatever the umask.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from ssdmoe_tui.errors import SsdmoeError

# `.name.<random>.p<pid>.tmp` or `.name.<random>.p<pid>.tmp.safetensors`; the older
# unlabelled forms (`.name.<random>.tmp`, `.kv-*.safetensors.tmp`) have no pid.
TEMP_PATTERN = re.compile(r"^\..+?(?:\.p(?P<pid>\d{1,10}))?\.tmp(?:\.[A-Za-z0-9]{1,16}){0,2}$")
# A temp without a pid (or whose pid may be a reused one) is an orphan after this long.
STALE_TEMP_S = 3600.0
_DISK_FULL = (errno.ENOSPC, errno.EDQUOT)


class DiskFullError(SsdmoeError, OSError):
    """Not enough room to write a file; the message names it and the bytes it needs."""

    def __init__(self, path: Path, needed: int | None) -> None:
        self.path = Path(path)
        self.needed = needed
        free = free_bytes(self.path.parent)
        need = f"needs {needed:,} bytes" if needed is not None else "needs more room"
        have = f", {free:,} free" if free is not None else ""
        super().__init__(errno.ENOSPC, f"disk full: {self.path} {need}{have}")

    def __str__(self) -> str:
        return self.strerror or "disk full"


def free_bytes(folder: Path) -> int | None:
    """Bytes an unprivileged writer can still use in `folder`'s file system."""
    try:
        st = os.statvfs(folder)
    except (OSError, AttributeError):
        return None
    return st.f_bavail * st.f_frsize


def is_disk_full(exc: BaseException, folder: Path | None = None, needed: int | None = None) -> bool:
    """True for ENOSPC/EDQUOT, and for a writer that hides the errno (MLX raises
    RuntimeError "[write] Unable to write ...") when `folder` has less than `needed`."""
    if isinstance(exc, DiskFullError):
        return True
    if isinstance(exc, OSError) and exc.errno in _DISK_FULL:
        return True
    if (
        folder is not None
        and needed is not None
        and not isinstance(exc, OSError | KeyboardInterrupt)
    ):
        free = free_bytes(folder)
        return free is not None and free < needed
    return False


def _pid_alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        return True
    except OSError:
        return False
    return True


def is_orphan_temp(
    name: str, mtime: float, now: float | None = None, stale_s: float = STALE_TEMP_S
) -> bool:
    """A temp file nobody is writing: its writer's pid is gone, or (no pid in the name,
    or the pid may have been reused) it has not changed for `stale_s`."""
    m = TEMP_PATTERN.match(name)
    if m is None:
        return False
    age = (time.time() if now is None else now) - mtime
    pid = m.group("pid")
    if pid is not None and int(pid) != os.getpid() and not _pid_alive(int(pid)):
        return True
    return age >= stale_s


def remove_orphan_temps(
    folder: Path, *, depth: int = 1, stale_s: float = STALE_TEMP_S
) -> list[Path]:
    """Delete the temp files killed writers left in `folder` and its sub-folders down to
    `depth` levels (1: the conversations of the sessions folder). A file a live process
    is writing is left alone; so is anything that is not named as our temp files are."""
    removed: list[Path] = []
    now = time.time()
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return removed
    for entry in entries:
        try:
            if entry.is_dir(follow_symlinks=False):
                if depth > 0:
                    removed += remove_orphan_temps(
                        Path(entry.path), depth=depth - 1, stale_s=stale_s
                    )
                continue
            if not entry.is_file(follow_symlinks=False):
                continue
            mtime = entry.stat(follow_symlinks=False).st_mtime
            if is_orphan_temp(entry.name, mtime, now, stale_s):
                os.unlink(entry.path)
                removed.append(Path(entry.path))
        except OSError:
            continue
    return removed


def remove_orphan_temps_at_startup() -> list[Path]:
    """Start-up housekeeping: the orphan temp files under the data folder (conversations,
    exports, repacked experts), the cache (expert indexes, native reader) and the config."""
    from ssdmoe_tui import paths

    removed: list[Path] = []
    for root, depth in (
        (paths.sessions_dir(), 1),
        (paths.data_dir(), 2),
        (paths.cache_dir(), 2),
        (paths.config_dir(), 1),
    ):
        removed += remove_orphan_temps(root, depth=depth)
    # A conversation folder whose first save was killed is empty: rmdir only removes
    # empty folders, and a save racing it re-creates its folder (atomic_write_via).
    try:
        folders = [
            e.path for e in os.scandir(paths.sessions_dir()) if e.is_dir(follow_symlinks=False)
        ]
    except OSError:
        folders = []
    for folder in folders:
        try:
            os.rmdir(folder)
            removed.append(Path(folder))
        except OSError:
            pass
    return removed


def _fsync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


FILE_MODE = 0o600
DIR_MODE = 0o700

# Test hook: called with the temp file after `write` and before the fsync and rename, so a
# test can stop (or kill) a writer at exactly the point a crash leaves a temp file behind.
_pause_point: Callable[[Path], None] | None = None


def private_dirs(folder: Path, *, tighten: bool = False) -> Path:
    """Create `folder` and its missing parents as 0700 (pathlib's `parents=True` gives the
    parents the umask's mode). `tighten`: an existing `folder` of ours is set to 0700 too
    (the server's checkpoint folders written 0755 by older versions)."""
    folder = Path(folder)
    missing = []
    p = folder
    while not p.exists() and p != p.parent:
        missing.append(p)
        p = p.parent
    for d in reversed(missing):
        try:
            os.mkdir(d, DIR_MODE)
        except FileExistsError:
            pass
    if not folder.is_dir():
        raise NotADirectoryError(errno.ENOTDIR, "not a folder", str(folder))
    if tighten:
        try:
            st = folder.stat()
            if st.st_uid == os.getuid() and st.st_mode & 0o077:
                os.chmod(folder, DIR_MODE)
        except (OSError, AttributeError):  # AttributeError: no getuid (Windows)
            pass
    return folder


def atomic_write_via(
    path: Path, write: Callable[[Path], None], suffix: str = "", needed: int | None = None
) -> None:
    """Call `write(tmp_path)` to produce the file, then move it over `path` atomically.
    `needed` (bytes, if known) makes a full disk say how much room the file needs. The
    file ends 0600 even when `write` replaced the temp file (MLX's writers do)."""
    path = Path(path)
    private_dirs(path.parent)
    fd, tmp = tempfile.mkstemp(
        prefix=f".{path.name}.", suffix=f".p{os.getpid()}.tmp{suffix}", dir=path.parent
    )
    os.close(fd)
    tmp_path = Path(tmp)
    try:
        write(tmp_path)
        os.chmod(tmp_path, FILE_MODE)
        if _pause_point is not None:
            _pause_point(tmp_path)
        with open(tmp_path, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp_path, path)
        _fsync_dir(path.parent)
    except BaseException as e:
        tmp_path.unlink(missing_ok=True)
        if not isinstance(e, DiskFullError) and is_disk_full(e, path.parent, needed):
            raise DiskFullError(path, needed) from None
        raise


def atomic_write_bytes(path: Path, data: bytes) -> None:
    atomic_write_via(Path(path), lambda p: p.write_bytes(data), needed=len(data))


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(Path(path), text.encode("utf-8"))


def _partial_name(target: Path, pid: int) -> str:
    return f".{target.name}.p{pid}.partial"


def sweep_partial_folders(target: Path) -> list[Path]:
    """Remove the half-written folders killed writers of `target` left beside it
    (`.<name>.p<pid>.partial` whose pid no longer runs); a live writer's stays."""
    target = Path(target)
    pattern = re.compile(rf"^\.{re.escape(target.name)}\.p(\d{{1,10}})\.partial$")
    removed: list[Path] = []
    try:
        entries = list(os.scandir(target.parent))
    except OSError:
        return removed
    for entry in entries:
        m = pattern.match(entry.name)
        if m is None or int(m.group(1)) == os.getpid() or _pid_alive(int(m.group(1))):
            continue
        import shutil

        shutil.rmtree(entry.path, ignore_errors=True)
        removed.append(Path(entry.path))
    return removed


@contextlib.contextmanager
def atomic_folder(target: Path, *, replace: bool = False) -> Iterator[Path]:
    """Build a folder under a temporary name beside `target` and rename it to `target`
    once the block succeeds: a crash or an error leaves no half-made `target` (the
    next writer sweeps a killed one's `.partial`). `replace`: an existing `target` is
    removed just before the rename (the caller decided it may be); otherwise an
    existing `target` is an error before anything is written."""
    import shutil

    target = Path(target)
    if target.exists() and not replace:
        raise FileExistsError(errno.EEXIST, "already exists", str(target))
    private_dirs(target.parent)
    sweep_partial_folders(target)
    tmp = target.with_name(_partial_name(target, os.getpid()))
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(DIR_MODE)
    try:
        yield tmp
        if replace:
            shutil.rmtree(target, ignore_errors=True)
        os.rename(tmp, target)
        _fsync_dir(target.parent)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise

"""Loaded models per machine, within its memory: two ssdmoe processes streaming experts
share RAM and SSD bandwidth, so a second one loads only when both declared budgets fit
(as ollama keeps several models loaded within memory), and is told the numbers otherwise.

Every holder has its own claim file, `model-<pid>-<random>.lock`, in one folder per user
and machine, whatever the cache or data folders (XDG_CACHE_HOME, SSDMOE_HOME) say:
`$SSDMOE_LOCK_DIR` if set (tests give each run its own), else `<tmp>/ssdmoe-locks-<uid>`
(made 0700 and checked to be ours; else the cache folder). Files are 0600. The holder
keeps an exclusive `flock` on its file; the kernel drops it when the holder exits,
however it exits, so a claim whose file is not locked is stale and is removed by the next
process that looks. A claim is written in full under a temporary name and renamed into
place while locked, so a reader never sees a half-made claim. The file's content is a
label: pid, command (secrets hidden), model and the bytes it declared (resident weights +
expert cache + KV budget), and for `ssdmoe serve` the URL it answers on and whether it
wants an API key (never the key): the app lists those servers in F4 and attaches to
them (`served_models`). It is read with a size cap. Checking the others and claiming
happen under `claims.mutex` (a flock held for milliseconds), so two processes starting
together cannot both take the last of the memory.

The rule: with no other holder a model always loads (the expert cache adapts); with
others, the new claim loads when its bytes plus every holder's declared bytes fit in what
`available_memory_bytes` reports now (conservative: what the holders already use counts
twice, so it errs towards refusing). A holder that declared nothing (or a label that
cannot be read) holds the whole machine. On platforms without `fcntl` (MLX does not run
there) the lock is a no-op.
"""

from __future__ import annotations

import errno
import json
import math
import os
import secrets
import shlex
import stat
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ssdmoe_tui.errors import SsdmoeError
from ssdmoe_tui.memory import available_memory_bytes
from ssdmoe_tui.paths import cache_dir
from ssdmoe_tui.units import human_bytes
from ssdmoe_tui.user_files import SMALL_STATE_MAX, read_regular

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

MUTEX_NAME = "claims.mutex"
CLAIM_PREFIX = "model-"
CLAIM_SUFFIX = ".lock"
_TEMP_PREFIX = ".claim-"
MUTEX_WAIT_S = 10.0  # the mutex is held for milliseconds; past this something is wrong


@dataclass(frozen=True)
class LockHolder:
    pid: int | None
    model: str
    command: str
    since: float | None = None
    need_bytes: int | None = None  # declared memory; None: the whole machine
    # `ssdmoe serve`: where it answers (http://127.0.0.1:PORT) once it accepts requests,
    # and whether it wants an API key (never the key itself); "" for other holders
    url: str = ""
    key_required: bool = False


class ModelLockedError(SsdmoeError):
    """Other processes hold models and this one does not fit beside them."""

    def __init__(
        self,
        holder: LockHolder | None,
        path: Path,
        *,
        need_bytes: int | None = None,
        holders: tuple[LockHolder, ...] = (),
        available_bytes: int | None = None,
    ):
        self.holder = holder
        self.holders = holders or ((holder,) if holder is not None else ())
        self.path = path
        if (
            need_bytes is not None
            and available_bytes is not None
            and self.holders
            and all(h.need_bytes is not None for h in self.holders)
        ):
            held = sum(h.need_bytes or 0 for h in self.holders)
            who = " and ".join(f"pid {h.pid} ({h.model or 'a model'})" for h in self.holders)
            super().__init__(
                f"not enough memory for a second model: needs {human_bytes(need_bytes)}, "
                f"{human_bytes(held)} held by {who}, {human_bytes(available_bytes)} available; "
                "quit it or lower the expert cache"
            )
            return
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


def _server_url(value: object) -> str:
    """A label's `url` if it is one, exactly as `options.server_url` writes it (a plain
    http URL with a port, no path) and on this machine's loopback (`is_loopback_url`):
    a damaged, odd or foreign label advertises nothing, so F4 never lists it and the
    app's API key never goes there."""
    from ssdmoe_tui.errors import BadValueError
    from ssdmoe_tui.options import is_loopback_url, server_url

    if not isinstance(value, str) or len(value) > 300:
        return ""
    try:
        ok = server_url(value, "lock claim") == value and is_loopback_url(value)
    except BadValueError:
        return ""
    return value if ok else ""


# A declared need above this is no claim's (a machine of 1 PiB): the claim is damaged.
MAX_NEED_BYTES = 1 << 50


def _need_bytes(value: object) -> int | None:
    """A label's `need_bytes` if it is a sound one (an int in [0, MAX_NEED_BYTES]); else
    None, which counts as "the whole machine": a negative number must not cancel the
    other claims, and a damaged one must not let a second model in."""
    if type(value) is int and 0 <= value <= MAX_NEED_BYTES:
        return value
    return None


def _text(value: object, limit: int = 300) -> str:
    return value[:limit] if isinstance(value, str) else ""


def read_holder(path: Path) -> LockHolder | None:
    """The label a holder wrote (bounded read), or None if it cannot be read."""
    try:
        data = json.loads(read_regular(Path(path), SMALL_STATE_MAX) or b"null")
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict):
        return None
    pid, since = data.get("pid"), data.get("since")
    return LockHolder(
        pid=pid if type(pid) is int and pid > 0 else None,
        model=_text(data.get("model")),
        command=redact_command(_text(data.get("command"))),
        since=since if type(since) in (int, float) and math.isfinite(since) else None,
        need_bytes=_need_bytes(data.get("need_bytes")),
        url=_server_url(data.get("url")),
        key_required=data.get("key_required") is True,
    )


@dataclass(frozen=True)
class Served:
    """What a serving holder advertises in its claim (`ModelLock.advertise`)."""

    url: str
    key_required: bool = False


def _label(model: str, need_bytes: int | None, served: Served | None = None) -> bytes:
    label: dict[str, object] = {
        "pid": os.getpid(),
        "model": model,
        "command": _command(),
        "since": time.time(),
        "need_bytes": need_bytes,
    }
    if served is not None:
        label["url"] = served.url
        label["key_required"] = served.key_required
    return json.dumps(label).encode("utf-8")


def _write_label(fd: int, data: bytes, path: Path) -> None:
    from ssdmoe_tui.atomic import DiskFullError, is_disk_full

    try:
        os.ftruncate(fd, 0)
        os.lseek(fd, 0, os.SEEK_SET)
        if os.write(fd, data) != len(data):
            raise OSError(errno.ENOSPC, "short write")
    except OSError as e:
        if is_disk_full(e):
            raise DiskFullError(path, len(data)) from None
        raise


def _open(path: Path) -> int:
    flags = os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOFOLLOW", 0)
    return os.open(path, flags, 0o600)


class _Mutex:
    """`claims.mutex`: held while the claims are read and one is made or changed."""

    def __init__(self, folder: Path):
        self.path = folder / MUTEX_NAME
        self.fd: int | None = None

    def __enter__(self) -> _Mutex:
        self.fd = _open(self.path)
        if fcntl is None:
            return self
        deadline = time.monotonic() + MUTEX_WAIT_S
        while True:
            try:
                fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return self
            except BlockingIOError:
                if time.monotonic() > deadline:
                    os.close(self.fd)
                    raise SsdmoeError(
                        f"cannot take the model lock: {self.path} stayed locked "
                        f"for {MUTEX_WAIT_S:.0f} s"
                    ) from None
                time.sleep(0.01)

    def __exit__(self, *exc: object) -> None:
        if self.fd is not None:
            os.close(self.fd)  # closing drops the flock
            self.fd = None


def _ensure_folder(folder: Path) -> None:
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)


def live_holders(
    folder: Path | None = None, *, exclude: Path | None = None
) -> list[tuple[Path, LockHolder | None]]:
    """The claims whose holder is alive (their file is flocked); stale ones are removed.
    Call under the mutex for a consistent answer."""
    folder = folder or lock_dir()
    out: list[tuple[Path, LockHolder | None]] = []
    try:
        names = sorted(os.listdir(folder))
    except FileNotFoundError:
        return out
    for name in names:
        claim = name.startswith(CLAIM_PREFIX) and name.endswith(CLAIM_SUFFIX)
        if not (claim or name.startswith(_TEMP_PREFIX)):
            continue
        path = folder / name
        if exclude is not None and path == exclude:
            continue
        try:
            fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | os.O_NONBLOCK)
        except OSError:
            continue
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                continue  # a folder or a device named like a claim is none: left alone
            if fcntl is not None:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    if claim:
                        out.append((path, read_holder(path)))
                    continue
            # Nobody holds it: its holder died (or is a temp name being made right now
            # by a process that has not locked it yet: only old temp files go).
            if claim or time.time() - os.fstat(fd).st_mtime > 60:
                path.unlink(missing_ok=True)
        finally:
            os.close(fd)
    return out


def _check_fits(
    folder: Path,
    model: str,
    need_bytes: int | None,
    exclude: Path | None,
    available: Callable[[], int] | None,
) -> None:
    held = live_holders(folder, exclude=exclude)
    if not held:
        return
    holders = tuple(h for _, h in held if h is not None)
    first = held[0]
    if need_bytes is None or len(holders) < len(held) or any(h.need_bytes is None for h in holders):
        raise ModelLockedError(first[1], first[0])
    avail = available() if available is not None else available_memory_bytes()
    if need_bytes + sum(h.need_bytes or 0 for h in holders) > avail:
        raise ModelLockedError(
            holders[0], first[0], need_bytes=need_bytes, holders=holders, available_bytes=avail
        )


class ModelLock:
    """Held until `release()` (or the end of a `with` block, or process exit)."""

    def __init__(self, path: Path, fd: int | None, model: str, need_bytes: int | None):
        self.path = path
        self.model = model
        self.need_bytes = need_bytes
        self.served: Served | None = None
        self._fd = fd

    @property
    def held(self) -> bool:
        return self._fd is not None

    def relabel(
        self,
        model: str,
        need_bytes: int | None = None,
        *,
        available: Callable[[], int] | None = None,
    ) -> None:
        """Record a different model (switching models keeps the claim); a new memory
        figure is checked against the other holders first (ModelLockedError)."""
        if self._fd is None:
            raise SsdmoeError("model lock already released")
        with _Mutex(self.path.parent):
            _check_fits(self.path.parent, model, need_bytes, self.path, available)
            _write_label(self._fd, _label(model, need_bytes, self.served), self.path)
        self.model, self.need_bytes = model, need_bytes

    def advertise(self, url: str, *, key_required: bool = False) -> None:
        """Say in the claim where this holder serves its model (`ssdmoe serve`, once it
        accepts requests), so the app on this machine can attach to it (`served_models`).
        Whether a key is needed is said; the key never is."""
        if self._fd is None:
            raise SsdmoeError("model lock already released")
        if not _server_url(url):
            raise SsdmoeError(
                f"{url!r} is not a loopback server URL (http://127.0.0.1:PORT): the app "
                "lists only servers it reaches on this machine's loopback"
            )
        served = Served(url, key_required)
        with _Mutex(self.path.parent):
            _write_label(self._fd, _label(self.model, self.need_bytes, served), self.path)
        self.served = served

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is None:
            return
        try:
            self.path.unlink(missing_ok=True)
        except OSError:
            pass
        os.close(fd)  # drops the flock

    def __enter__(self) -> ModelLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def __repr__(self) -> str:
        return f"ModelLock({str(self.path)!r}, model={self.model!r}, held={self.held})"


def acquire_model_lock(
    model_desc: str,
    *,
    need_bytes: int | None = None,
    folder: Path | None = None,
    available: Callable[[], int] | None = None,
) -> ModelLock:
    """Claim room for a model or raise `ModelLockedError` (one line: who holds what and,
    when every holder declared its bytes, the numbers). `need_bytes`: resident weights +
    expert cache + KV budget; None claims the whole machine. Never blocks (beyond the
    mutex's milliseconds). `available`: the free-memory figure (tests pass their own)."""
    folder = Path(folder) if folder is not None else lock_dir()
    _ensure_folder(folder)
    with _Mutex(folder):
        _check_fits(folder, model_desc, need_bytes, None, available)
        token = secrets.token_hex(4)
        temp = folder / f"{_TEMP_PREFIX}{os.getpid()}-{token}"
        path = folder / f"{CLAIM_PREFIX}{os.getpid()}-{token}{CLAIM_SUFFIX}"
        fd = _open(temp)
        try:
            if fcntl is not None:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            _write_label(fd, _label(model_desc, need_bytes), path)
            os.replace(temp, path)  # the flock stays with the inode
        except BaseException:
            temp.unlink(missing_ok=True)
            os.close(fd)
            raise
    return ModelLock(path, fd, model_desc, need_bytes)


def served_models(folder: Path | None = None) -> list[LockHolder]:
    """The live holders that serve their model over HTTP on this machine (their claim
    carries a URL), oldest first; stale claims are removed on the way."""
    folder = Path(folder) if folder is not None else lock_dir()
    if not folder.is_dir():
        return []
    with _Mutex(folder):
        held = live_holders(folder)
    found = [h for _, h in held if h is not None and h.url]
    return sorted(found, key=lambda h: h.since or 0.0)

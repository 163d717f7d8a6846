"""Batched expert reads from safetensors shards straight into preallocated buffers.

The engine hands over int64 arrays (fd, offset, length, destination address) for every
expert slice it needs and gets them read in parallel. Two implementations:

* ``NativeReader``: ``native/ssdmoe_reader.c`` through ctypes (the call releases the
  GIL); a persistent pthread pool, no per-request Python objects. The package build
  compiles it (the ``ssdmoe_tui.engine.experts._ssdmoe_reader`` extension, flags in
  ``native/cflags.txt``); ``SSDMOE_READER_LIB`` points at another build (``make sanitize``).
  Only a source checkout whose build made no library (no compiler then, or the source
  edited since) builds one at run time, into the user cache.
* ``PythonReader``: ``os.preadv`` on a thread pool; the fallback when no compiler exists.

A request may also widen: its bytes are 16-bit floats (``WIDEN_BF16``, ``WIDEN_F16``, a
``kinds`` array beside the others) written to the destination as float32, twice the bytes
read, exactly as numpy's ``astype(np.float32)``. The engine's CPU slots hold bf16 scales and
biases as float32; widening in the reading threads keeps that work off the engine thread
and needs no staging copy (issue 43).

``direct=True`` bypasses the page cache (Linux ``O_DIRECT`` through aligned bounce
buffers, macOS ``F_NOCACHE``). A filesystem that refuses it (``direct_active`` turns
False and ``direct_fallback_reason`` says why) is read buffered instead: bytes are the same.
"""

from __future__ import annotations

import ctypes
import errno as errno_mod
import hashlib
import importlib.util
import itertools
import mmap
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from abc import ABC, abstractmethod
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from ssdmoe_tui.errors import BadValueError, SsdmoeError

ABI_VERSION = 2  # must match SSDMOE_ABI_VERSION in ssdmoe_reader.h
SHORT_READ_BASE = 1 << 40  # must match SSDMOE_SHORT_READ_BASE
ALIGN = 4096
_BOUNCE_MAX = 8 << 20
_MAX_CHUNK = 1 << 30
# Request kinds (SSDMOE_COPY, SSDMOE_WIDEN_BF16, SSDMOE_WIDEN_F16 in ssdmoe_reader.h).
COPY, WIDEN_BF16, WIDEN_F16 = 0, 1, 2
#: The kind that widens a safetensors dtype to float32 (`ExpertCache`'s float32 slots).
WIDEN_KIND = {"BF16": WIDEN_BF16, "F16": WIDEN_F16}

#: The C source in a source checkout (editable install); absent from an installed wheel.
PACKAGE_NATIVE_DIR = Path(__file__).resolve().parents[3] / "native"
EXTENSION = "ssdmoe_tui.engine.experts._ssdmoe_reader"
LIB_ENV = "SSDMOE_READER_LIB"
_SOURCES = ("ssdmoe_reader.c", "ssdmoe_reader.h", "cflags.txt")
_LIB_STEM = "libssdmoe_reader"


class ReadError(SsdmoeError, OSError):
    """A request failed; the message names the file, offset, length and cause."""

    def __init__(
        self,
        path: str,
        offset: int,
        length: int,
        cause: str,
        err: int | None = None,
        got: int | None = None,
    ) -> None:
        super().__init__(f"cannot read {length} bytes at offset {offset} of {path}: {cause}")
        self.errno = err
        self.path = path
        self.offset = offset
        self.length = length
        self.got = got


class NativeReaderUnavailable(SsdmoeError):
    """The native library could not be built or loaded (one line saying why)."""


def buffer_address(buf) -> int:
    """Address of a writable buffer (e.g. ``memoryview(mlx_array)``, bytearray, mmap)."""
    arr = np.frombuffer(buf, dtype=np.uint8)
    if not arr.flags.writeable:
        raise ValueError("buffer is read-only")
    return int(arr.ctypes.data) if arr.size else 0


# --------------------------------------------------------------------------- building


def _lib_suffix() -> str:
    return ".dylib" if sys.platform == "darwin" else ".so"


def _source_hash(src_dir: Path) -> str:
    h = hashlib.sha256()
    for name in _SOURCES:
        h.update((src_dir / name).read_bytes())
    return h.hexdigest()[:16]


def compile_flags(src_dir: Path) -> list[str]:
    """The one set of C flags (native/cflags.txt), shared with setup.py and the Makefile."""
    return (src_dir / "cflags.txt").read_text().split()


def _compiler() -> str:
    """$CC when set (no second guess), else the first of cc/clang/gcc on PATH."""
    cc = os.environ.get("CC")
    if cc:
        found = shutil.which(cc)
        if not found:
            raise NativeReaderUnavailable(f"C compiler $CC={cc} not found")
        return found
    for name in ("cc", "clang", "gcc"):
        found = shutil.which(name)
        if found:
            return found
    raise NativeReaderUnavailable("no C compiler (cc/clang/gcc) on PATH to build the native reader")


def build_native_library(src_dir: Path, out: Path) -> Path:
    """Compile ``src_dir/ssdmoe_reader.c`` into ``out`` atomically (temp file + rename)."""
    cc = _compiler()
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(
        prefix=f".{out.name}.", suffix=f".p{os.getpid()}.tmp", dir=out.parent
    )
    os.close(fd)
    flags = [*compile_flags(src_dir), "-shared", "-fPIC"]
    cmd = [cc, *flags, "-o", tmp, str(src_dir / "ssdmoe_reader.c")]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        if proc.returncode != 0:
            first = (proc.stderr or proc.stdout).strip().splitlines()
            why = first[0] if first else f"exit status {proc.returncode}"
            raise NativeReaderUnavailable(f"building the native reader with {cc} failed: {why}")
        os.replace(tmp, out)
    except OSError as exc:
        raise NativeReaderUnavailable(f"cannot build the native reader with {cc}: {exc}") from exc
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return out


def _try_load(path: Path) -> ctypes.CDLL | None:
    try:
        lib = ctypes.CDLL(str(path))
        lib.ssdmoe_abi_version.restype = ctypes.c_int
        if lib.ssdmoe_abi_version() != ABI_VERSION:
            return None
    except (OSError, AttributeError):
        return None
    return lib


def built_extension() -> Path | None:
    """The library the package build made (found without importing it), if any."""
    try:
        spec = importlib.util.find_spec(EXTENSION)
    except (ImportError, ValueError):
        return None
    return Path(spec.origin) if spec is not None and spec.origin else None


def native_library_path(src_dir: Path | None = None) -> Path:
    """Which library to load: $SSDMOE_READER_LIB, else the package build's extension
    (unless the checkout's source is newer), else a run-time build of the checkout's source
    into the user cache, keyed by a hash of the source and flags."""
    env = os.environ.get(LIB_ENV)
    if env:
        if not Path(env).is_file():
            raise NativeReaderUnavailable(f"{LIB_ENV}={env}: no such file")
        return Path(env)
    src_dir = src_dir or PACKAGE_NATIVE_DIR
    source = (src_dir / "ssdmoe_reader.c").is_file()
    if src_dir == PACKAGE_NATIVE_DIR:  # the package's own library, when its build made one
        ext = built_extension()
        if ext is not None and _try_load(ext):
            newest = max((src_dir / n).stat().st_mtime for n in _SOURCES) if source else 0
            if ext.stat().st_mtime >= newest:
                return ext
    if not source:
        raise NativeReaderUnavailable(
            "the native reader was not built with this install (no compiler at install "
            "time?) and its source is not here to build it"
        )
    from ssdmoe_tui import paths  # only needed for a run-time build

    cached = paths.cache_dir() / "native" / f"{_LIB_STEM}-{_source_hash(src_dir)}{_lib_suffix()}"
    if cached.exists() and _try_load(cached):
        return cached
    return build_native_library(src_dir, cached)


_VP, _I64, _INT = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
# The functions of native/ssdmoe_reader.h this module calls: name -> (argtypes, restype).
_SIGNATURES: dict[str, tuple[list, type | None]] = {
    "ssdmoe_reader_create": ([_INT, _INT], _VP),
    "ssdmoe_reader_destroy": ([_VP], None),
    "ssdmoe_reader_queue_depth": ([_VP], _INT),
    "ssdmoe_open": ([_VP, ctypes.c_char_p, _INT], _INT),
    "ssdmoe_fd_is_direct": ([_VP, _INT], _INT),
    "ssdmoe_direct_open_errno": ([_VP], _INT),
    "ssdmoe_direct_fallbacks": ([_VP], _I64),
    "ssdmoe_close": ([_VP, _INT], _INT),
    "ssdmoe_read_batch": ([_VP, _INT, _VP, _VP, _VP, _VP, _VP], _INT),
    "ssdmoe_read_batch_kinds": ([_VP, _INT, _VP, _VP, _VP, _VP, _VP, _VP], _INT),
}


def load_native_library(src_dir: Path | None = None) -> ctypes.CDLL:
    """Find or build the library and declare its signatures."""
    path = native_library_path(src_dir)
    lib = _try_load(path)
    if lib is None:
        raise NativeReaderUnavailable(f"cannot load {path} (wrong ABI or platform)")
    for name, (argtypes, restype) in _SIGNATURES.items():
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = argtypes, restype
    return lib


_native_lock = threading.Lock()
_native_cache: ctypes.CDLL | NativeReaderUnavailable | None = None


def _native_lib() -> ctypes.CDLL:
    """The package's library, built at most once per process (failures are remembered)."""
    global _native_cache
    with _native_lock:
        if _native_cache is None:
            try:
                _native_cache = load_native_library()
            except NativeReaderUnavailable as exc:
                _native_cache = exc
        if isinstance(_native_cache, NativeReaderUnavailable):
            raise _native_cache
        return _native_cache


# --------------------------------------------------------------------------- readers


def _cause(status: int) -> tuple[str, int | None, int | None]:
    """(text, errno, bytes got) for a failed request status."""
    if status <= -SHORT_READ_BASE:
        got = -status - SHORT_READ_BASE
        return f"short read: file ended after {got} bytes", None, got
    err = -status
    return f"{os.strerror(err)} (errno {err})", err, None


SPLIT_MIN_BYTES = 128 << 10  # no request is split below this


def split_requests(
    fds: np.ndarray,
    offsets: np.ndarray,
    lengths: np.ndarray,
    dests: np.ndarray,
    want: int,
    min_piece: int = SPLIT_MIN_BYTES,
    kinds: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray | None]:
    """Cut large requests into pieces so a batch holds about `want` requests.

    A layer with one or two misses hands the reader 6-18 requests, a few of them large,
    so most of the pool's threads idle while those few run: the disk delivers its
    bandwidth only with many requests in flight. Pieces are multiples of 4096 bytes
    (aligned pieces of an aligned request stay aligned) and at least `min_piece`; the
    bytes and their destinations are the same, only in more, smaller reads (a widening
    request's piece lands at twice its offset: float32 out of 16-bit). Returns the five
    arrays `read_batch` takes (`kinds` as given: None stays None)."""
    n = len(lengths)
    if n == 0 or n >= want:
        return fds, offsets, lengths, dests, kinds
    piece = max(min_piece, -(-int(lengths.sum()) // want))
    piece = -(-piece // ALIGN) * ALIGN
    counts = np.maximum(1, -(-lengths // piece))
    if (counts == 1).all():
        return fds, offsets, lengths, dests, kinds
    rep = np.repeat(np.arange(n), counts)
    first = np.repeat(np.cumsum(counts) - counts, counts)
    start = (np.arange(len(rep)) - first) * piece
    scale = 1 if kinds is None else np.where(kinds[rep] == COPY, 1, 2)
    return (
        fds[rep],
        offsets[rep] + start,
        np.minimum(piece, lengths[rep] - start),
        dests[rep] + start * scale,
        None if kinds is None else kinds[rep],
    )


class Reader(ABC):
    """Reads batches of (fd, offset, length, dest address) requests; see module doc."""

    name: str = "base"
    queue_depth: int
    direct: bool
    fallback_reason: str | None = None

    def __init__(self, queue_depth: int, direct: bool) -> None:
        if queue_depth < 1:
            raise ValueError(f"queue depth must be >= 1, got {queue_depth}")
        self.queue_depth = queue_depth
        self.direct = direct
        self.direct_fallback_reason: str | None = None
        self._paths: dict[int, str] = {}
        self._borrowed: dict[int, str] = {}  # another reader's handles (`borrow`)
        self._direct_fds: set[int] = set()

    @property
    def direct_active(self) -> bool:
        """True when direct was asked for and every opened file honours it."""
        return self.direct and self.direct_fallback_reason is None

    @abstractmethod
    def open(self, path: str | Path) -> int:
        """Open a shard for `read_batch`; returns its handle (an fd)."""

    @abstractmethod
    def read_batch(
        self,
        fds: np.ndarray,
        offsets: np.ndarray,
        lengths: np.ndarray,
        dests: np.ndarray,
        kinds: np.ndarray | None = None,
    ) -> int:
        """Read every request; total bytes read, or ReadError for the first that failed.
        `kinds` (None: all COPY): WIDEN_BF16/WIDEN_F16 requests write their `lengths`
        bytes of 16-bit floats as float32 (2 x lengths bytes at a 4-aligned dest)."""

    @abstractmethod
    def close(self) -> None:
        """Release threads and file handles."""

    def __enter__(self) -> Reader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def borrow(self, other: Reader) -> None:
        """Read `other`'s open handles too (buffered: an O_DIRECT twin is `other`'s own):
        their files' names for errors; they stay `other`'s to close."""
        self._borrowed = other._paths

    def _path(self, fd: int) -> str:
        return self._paths.get(fd) or self._borrowed.get(fd, f"<fd {fd}>")

    def _error(self, fd: int, offset: int, length: int, status: int) -> ReadError:
        if length < 0 or offset < 0:
            return ReadError(self._path(fd), offset, length, "negative offset or length")
        text, err, got = _cause(status)
        return ReadError(self._path(fd), offset, length, text, err, got)

    def _note_direct_refused(self, path: str, err: int) -> None:
        if self.direct_fallback_reason is None:
            self.direct_fallback_reason = (
                f"direct I/O refused for {path} ({os.strerror(err)}); reading it buffered"
            )


class _Staging:
    """Request arrays handed to C, reused across calls, with their addresses cached."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.fds = np.zeros(capacity, dtype=np.intc)
        self.offsets = np.zeros(capacity, dtype=np.int64)
        self.lengths = np.zeros(capacity, dtype=np.int64)
        self.dests = np.zeros(capacity, dtype=np.int64)
        self.kinds = np.zeros(capacity, dtype=np.intc)
        self.status = np.zeros(capacity, dtype=np.int64)
        self.fds_p = self.fds.ctypes.data
        self.offsets_p = self.offsets.ctypes.data
        self.lengths_p = self.lengths.ctypes.data
        self.dests_p = self.dests.ctypes.data
        self.kinds_p = self.kinds.ctypes.data
        self.status_p = self.status.ctypes.data


class NativeReader(Reader):
    name = "native"

    def __init__(self, queue_depth: int = 16, direct: bool = False, lib=None) -> None:
        super().__init__(queue_depth, direct)
        self._lib = lib or _native_lib()
        handle = self._lib.ssdmoe_reader_create(queue_depth, 1 if direct else 0)
        if not handle:
            raise MemoryError("cannot create the native reader")
        self._h: int | None = handle
        self.queue_depth = self._lib.ssdmoe_reader_queue_depth(handle)
        self._lock = threading.Lock()
        self._staging: _Staging | None = None

    def open(self, path: str | Path) -> int:
        path = str(path)
        fd = self._lib.ssdmoe_open(self._handle(), os.fsencode(path), -1)
        if fd < 0:
            raise OSError(-fd, os.strerror(-fd), path)
        self._paths[fd] = path
        if self.direct:
            if self._lib.ssdmoe_fd_is_direct(self._h, fd):
                self._direct_fds.add(fd)
            else:
                err = self._lib.ssdmoe_direct_open_errno(self._h) or errno_mod.EINVAL
                self._note_direct_refused(path, err)
        return fd

    @property
    def direct_active(self) -> bool:
        if self.direct and self._h and self._lib.ssdmoe_direct_fallbacks(self._h):
            if self.direct_fallback_reason is None:
                self.direct_fallback_reason = "direct reads refused (EINVAL); reading buffered"
        return super().direct_active

    def _handle(self) -> int:
        if not self._h:
            raise ValueError("reader is closed")
        return self._h

    def _stage(self, n: int) -> _Staging:
        if self._staging is None or self._staging.capacity < n:
            self._staging = _Staging(max(n, 2 * (self._staging.capacity if self._staging else 32)))
        return self._staging

    def read_batch(
        self,
        fds: np.ndarray,
        offsets: np.ndarray,
        lengths: np.ndarray,
        dests: np.ndarray,
        kinds: np.ndarray | None = None,
    ) -> int:
        n = len(fds)
        if not (len(offsets) == len(lengths) == len(dests) == n):
            raise ValueError("fds, offsets, lengths and dests must have the same length")
        if kinds is not None and len(kinds) != n:
            raise ValueError("kinds must have one entry per request")
        if n == 0:
            return 0
        with self._lock:  # the staging arrays are shared; the C side serializes anyway
            st = self._stage(n)
            # Copying into persistent arrays with cached addresses costs ~1 us; asking
            # numpy for fresh addresses (`.ctypes.data`) costs more than the call itself.
            st.fds[:n] = fds
            st.offsets[:n] = offsets
            st.lengths[:n] = lengths
            st.dests[:n] = dests
            if kinds is None:
                failed = self._lib.ssdmoe_read_batch(
                    self._handle(), n, st.fds_p, st.offsets_p, st.lengths_p, st.dests_p,
                    st.status_p,
                )  # fmt: skip
            else:
                st.kinds[:n] = kinds
                failed = self._lib.ssdmoe_read_batch_kinds(
                    self._handle(), n, st.fds_p, st.offsets_p, st.lengths_p, st.dests_p,
                    st.kinds_p, st.status_p,
                )  # fmt: skip
            if failed == 0:
                return int(st.lengths[:n].sum())
            if failed < 0:
                raise OSError(-failed, os.strerror(-failed))
            lens, status = st.lengths[:n], st.status[:n]
            i = int(np.flatnonzero((status != lens) | (lens < 0))[0])
            raise self._error(int(st.fds[i]), int(st.offsets[i]), int(lens[i]), int(status[i]))

    def close(self) -> None:
        if self._h:
            with self._lock:
                self._lib.ssdmoe_reader_destroy(self._h)  # closes every fd from open()
                self._h = None
            self._paths.clear()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass


class PythonReader(Reader):
    """``os.preadv`` on ``queue_depth`` threads; O_DIRECT through per-thread mmap buffers."""

    name = "python"

    def __init__(self, queue_depth: int = 16, direct: bool = False) -> None:
        super().__init__(queue_depth, direct)
        self._pool = (
            ThreadPoolExecutor(queue_depth, thread_name_prefix="ssdmoe-read")
            if queue_depth > 1
            else None
        )
        self._dfd: dict[int, int] = {}  # buffered fd -> O_DIRECT twin
        self._local = threading.local()
        self._closed = False

    def open(self, path: str | Path) -> int:
        if self._closed:
            raise ValueError("reader is closed")
        path = str(path)
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        self._paths[fd] = path
        if self.direct:
            o_direct = getattr(os, "O_DIRECT", 0)
            if o_direct:
                try:
                    self._dfd[fd] = os.open(path, os.O_RDONLY | o_direct)
                    self._direct_fds.add(fd)
                except OSError as exc:
                    self._note_direct_refused(path, exc.errno or errno_mod.EINVAL)
            elif sys.platform == "darwin":
                import fcntl

                try:
                    fcntl.fcntl(fd, getattr(fcntl, "F_NOCACHE", 48), 1)
                    self._direct_fds.add(fd)
                except OSError as exc:
                    self._note_direct_refused(path, exc.errno or errno_mod.EINVAL)
            else:
                self._note_direct_refused(path, errno_mod.ENOTSUP)
        return fd

    def _bounce(self, size: int) -> tuple[mmap.mmap, int]:
        """This thread's page-aligned buffer for O_DIRECT, grown on demand."""
        cur = getattr(self._local, "bounce", None)
        if cur is None or len(cur[0]) < size:
            m = mmap.mmap(-1, max(size, ALIGN))
            self._local.bounce = (m, ctypes.addressof(ctypes.c_char.from_buffer(m)))
        return self._local.bounce

    def _read_buffered(self, fd: int, off: int, length: int, dest: int) -> int:
        done = 0
        while done < length:
            n = min(length - done, _MAX_CHUNK)
            buf = (ctypes.c_char * n).from_address(dest + done)
            try:
                got = os.preadv(fd, [buf], off + done)
            except InterruptedError:
                continue
            except OSError as exc:
                return -(exc.errno or errno_mod.EIO)
            if got == 0:
                return -(SHORT_READ_BASE + done)
            done += got
        return done

    def _read_direct(self, dfd: int, off: int, length: int, dest: int) -> int:
        end = off + length
        pos = off - off % ALIGN
        stop = -(-end // ALIGN) * ALIGN
        bounce, baddr = self._bounce(min(stop - pos, _BOUNCE_MAX))
        size = len(bounce)
        done = 0
        while done < length:
            chunk = min(stop - pos, size)
            view = memoryview(bounce)[:chunk]
            try:
                got = os.preadv(dfd, [view], pos)
            except InterruptedError:
                continue
            except OSError as exc:
                return -(exc.errno or errno_mod.EIO)
            finally:
                view.release()
            start = off + done
            upto = min(pos + got, end)
            if upto > start:
                ctypes.memmove(dest + done, baddr + (start - pos), upto - start)
                done += upto - start
            if got == 0 or got % ALIGN:
                break
            pos += got
        return length if done >= length else -(SHORT_READ_BASE + done)

    def _read_widened(self, fd: int, off: int, length: int, dest: int, kind: int) -> int:
        """The pure-Python twin of the native widening: the bytes into this thread's
        staging buffer (kept: a fresh one page-faults), then numpy's exact astype."""
        if kind not in (WIDEN_BF16, WIDEN_F16) or length % 2 or dest % 4:
            return -errno_mod.EINVAL
        if length == 0:
            return 0
        if not dest:
            return -errno_mod.EFAULT
        stage = getattr(self._local, "widen", None)
        if stage is None or stage.nbytes < length:
            stage = self._local.widen = np.empty(max(length, 64 << 10) // 2, dtype=np.uint16)
        got = self._read_one(fd, off, length, stage.ctypes.data)
        if got != length:
            return got
        count = length // 2
        src = stage[:count]
        out = np.ctypeslib.as_array((ctypes.c_uint32 * count).from_address(dest))
        if kind == WIDEN_BF16:  # bf16 is the top half of a float32: exact
            np.left_shift(src, 16, out=out, dtype=np.uint32)
        else:
            np.copyto(out.view(np.float32), src.view(np.float16))
        return length

    def _read_one(self, fd: int, off: int, length: int, dest: int) -> int:
        if off < 0 or length < 0:
            return -errno_mod.EINVAL
        if length == 0:
            return 0
        if not dest:
            return -errno_mod.EFAULT
        dfd = self._dfd.get(fd)
        if dfd is not None:
            got = self._read_direct(dfd, off, length, dest)
            if got != -errno_mod.EINVAL:
                return got
            self._dfd.pop(fd, None)  # refused at read time: buffered from now on
            self._direct_fds.discard(fd)
            self._note_direct_refused(self._path(fd), errno_mod.EINVAL)
        return self._read_buffered(fd, off, length, dest)

    def read_batch(
        self,
        fds: np.ndarray,
        offsets: np.ndarray,
        lengths: np.ndarray,
        dests: np.ndarray,
        kinds: np.ndarray | None = None,
    ) -> int:
        if self._closed:
            raise ValueError("reader is closed")
        fl = np.asarray(fds).tolist()
        ol = np.asarray(offsets).tolist()
        ll = np.asarray(lengths).tolist()
        dl = np.asarray(dests).tolist()
        n = len(fl)
        if not (len(ol) == len(ll) == len(dl) == n):
            raise ValueError("fds, offsets, lengths and dests must have the same length")
        kl = [COPY] * n if kinds is None else np.asarray(kinds).tolist()
        if len(kl) != n:
            raise ValueError("kinds must have one entry per request")
        status = [0] * n
        counter = itertools.count()  # next() is atomic under the GIL

        def work() -> None:
            for i in counter:
                if i >= n:
                    return
                if kl[i] == COPY:
                    status[i] = self._read_one(fl[i], ol[i], ll[i], dl[i])
                else:
                    status[i] = self._read_widened(fl[i], ol[i], ll[i], dl[i], kl[i])

        workers = min(self.queue_depth, n)
        if self._pool is None or workers <= 1:
            work()
        else:
            for fut in [self._pool.submit(work) for _ in range(workers)]:
                fut.result()
        for i in range(n):
            if status[i] != ll[i] or ll[i] < 0:
                raise self._error(fl[i], ol[i], ll[i], status[i])
        return sum(ll)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._pool is not None:
            self._pool.shutdown(wait=True)
        for fd in list(self._dfd.values()) + list(self._paths):
            try:
                os.close(fd)
            except OSError:
                pass
        self._dfd.clear()
        self._paths.clear()


def open_reader(queue_depth: int = 16, direct: bool = False, prefer: str = "auto") -> Reader:
    """The native reader when it builds/loads, else the Python one (``fallback_reason`` says
    why). ``prefer`` or env ``SSDMOE_READER`` = ``native`` | ``python`` forces a choice."""
    env = os.environ.get("SSDMOE_READER")
    choice = env or prefer
    if choice not in ("auto", "native", "python"):
        what = "SSDMOE_READER" if env else "reader"
        raise BadValueError(f"{what} must be auto, native or python, got {choice!r}")
    if choice == "python":
        return PythonReader(queue_depth, direct)
    try:
        return NativeReader(queue_depth, direct)
    except NativeReaderUnavailable as exc:
        if choice == "native":
            raise
        reader = PythonReader(queue_depth, direct)
        reader.fallback_reason = str(exc)
        return reader

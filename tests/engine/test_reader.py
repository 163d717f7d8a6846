"""The expert reader: native and Python readers return the file's bytes into MLX buffers."""

from __future__ import annotations

import os
import shutil
import sys
import threading
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest

from ssdmoe_tui.engine.experts import iostats, reader
from ssdmoe_tui.engine.experts.reader import (
    NativeReader,
    NativeReaderUnavailable,
    PythonReader,
    ReadError,
    buffer_address,
    open_reader,
)
from ssdmoe_tui.errors import BadValueError, user_message

FILE_SIZE = 3 * 1024 * 1024 + 1234  # not a multiple of 4096: exercises the O_DIRECT tail


@pytest.fixture(autouse=True)
def _home(tmp_path, monkeypatch):
    monkeypatch.setenv("SSDMOE_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("SSDMOE_READER", raising=False)


@pytest.fixture(scope="module")
def data_file(tmp_path_factory) -> tuple[Path, bytes]:
    path = tmp_path_factory.mktemp("reader") / "shard.bin"
    data = np.random.default_rng(7).integers(0, 256, FILE_SIZE, dtype=np.uint8).tobytes()
    path.write_bytes(data)
    return path, data


def make_reader(kind: str, qd: int = 4, direct: bool = False) -> reader.Reader:
    return open_reader(qd, direct=direct, prefer=kind)


def random_requests(rng, n: int, file_size: int, max_len: int = 300_000):
    lengths = rng.integers(0, max_len, n)
    lengths[::7] = 0  # zero-length requests mixed in
    offsets = np.array([rng.integers(0, file_size - ln + 1) for ln in lengths], dtype=np.int64)
    return offsets, lengths.astype(np.int64)


def read_into_mlx(rd: reader.Reader, path: Path, offsets, lengths) -> tuple[np.ndarray, int]:
    """Packs the requests back to back (unaligned destinations) into one MLX array."""
    total = int(lengths.sum())
    arr = mx.zeros((total + 1,), dtype=mx.uint8)
    mx.eval(arr)
    base = buffer_address(memoryview(arr))
    dests = base + np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    fd = rd.open(path)
    fds = np.full(len(offsets), fd, dtype=np.int64)
    got = rd.read_batch(fds, offsets, lengths, dests)
    return np.array(arr)[:total], got


def expected(data: bytes, offsets, lengths) -> np.ndarray:
    return np.frombuffer(
        b"".join(data[o : o + n] for o, n in zip(offsets.tolist(), lengths.tolist(), strict=True)),
        dtype=np.uint8,
    )


@pytest.mark.parametrize("kind", ["native", "python"])
@pytest.mark.parametrize("direct", [False, True])
@pytest.mark.parametrize("qd", [1, 8])
def test_random_reads_match_file(data_file, kind, direct, qd):
    path, data = data_file
    rng = np.random.default_rng(qd * 10 + direct)
    offsets, lengths = random_requests(rng, 60, len(data))
    # the file's last bytes, an aligned block and a one-byte read
    offsets = np.concatenate([offsets, [len(data) - 5000, 8192, 4095]]).astype(np.int64)
    lengths = np.concatenate([lengths, [5000, 4096, 1]]).astype(np.int64)
    with make_reader(kind, qd, direct) as rd:
        assert rd.name == kind
        out, got = read_into_mlx(rd, path, offsets, lengths)
    assert got == int(lengths.sum())
    assert np.array_equal(out, expected(data, offsets, lengths))


def test_native_and_python_agree_on_same_buffer(data_file):
    path, data = data_file
    offsets, lengths = random_requests(np.random.default_rng(3), 200, len(data), 40_000)
    results = []
    for kind in ("native", "python"):
        with make_reader(kind, 16) as rd:
            results.append(read_into_mlx(rd, path, offsets, lengths)[0])
    assert np.array_equal(results[0], results[1])
    assert np.array_equal(results[0], expected(data, offsets, lengths))


@pytest.mark.parametrize("kind", ["native", "python"])
def test_aligned_direct_read_straight_into_aligned_buffer(data_file, kind):
    path, data = data_file
    buf = np.zeros(64 * 1024 + 2 * 4096, dtype=np.uint8)
    start = (-buf.ctypes.data) % 4096  # 4096-aligned destination: no bounce buffer
    with make_reader(kind, 2, direct=True) as rd:
        fd = rd.open(path)
        rd.read_batch(
            np.array([fd]),
            np.array([65536]),
            np.array([65536]),
            np.array([buf.ctypes.data + start]),
        )
    assert bytes(buf[start : start + 65536]) == data[65536 : 2 * 65536]


@pytest.mark.parametrize("kind", ["native", "python"])
def test_zero_length_and_empty_batches(data_file, kind):
    path, _ = data_file
    with make_reader(kind) as rd:
        fd = rd.open(path)
        empty = np.array([], dtype=np.int64)
        assert rd.read_batch(empty, empty, empty, empty) == 0
        # zero length succeeds even at EOF and with a null destination
        z = np.zeros(3, dtype=np.int64)
        assert rd.read_batch(np.full(3, fd), np.array([0, FILE_SIZE, FILE_SIZE + 99]), z, z) == 0


@pytest.mark.parametrize("kind", ["native", "python"])
@pytest.mark.parametrize("direct", [False, True])
def test_short_read_past_eof_names_file(data_file, kind, direct):
    path, data = data_file
    buf = bytearray(10_000)
    with make_reader(kind, 4, direct) as rd:
        fd = rd.open(path)
        offsets = np.array([0, len(data) - 100], dtype=np.int64)
        lengths = np.array([100, 1000], dtype=np.int64)
        dests = np.array([buffer_address(buf), buffer_address(buf) + 5000], dtype=np.int64)
        with pytest.raises(ReadError) as err:
            rd.read_batch(np.full(2, fd), offsets, lengths, dests)
    e = err.value
    assert isinstance(e, OSError)
    assert str(path) in str(e) and "short read" in str(e)
    assert e.offset == len(data) - 100 and e.length == 1000 and e.got == 100
    assert str(len(data) - 100) in str(e) and "1000 bytes" in str(e)
    assert bytes(buf[5000:5100]) == data[-100:]  # what existed was still read
    assert user_message(e) == str(e)  # already one line, no class-name prefix


INT64_MAX = 2**63 - 1


@pytest.mark.parametrize("kind", ["native", "python"])
@pytest.mark.parametrize("direct", [False, True])
@pytest.mark.parametrize(
    ("offset", "length"), [(INT64_MAX - 10, 100), (INT64_MAX - 4096, 4096), (INT64_MAX, 1)]
)
def test_offsets_near_int64_max_are_refused_in_one_line(data_file, kind, direct, offset, length):
    """The C reader checks ranges before adding (issue 11: UBSan saw off + len overflow)."""
    path, _ = data_file
    buf = bytearray(length)
    with make_reader(kind, 4, direct) as rd:
        fd = rd.open(path)
        with pytest.raises(ReadError) as err:
            rd.read_batch(
                np.array([fd]), np.array([offset]), np.array([length]),
                np.array([buffer_address(buf)]),
            )  # fmt: skip
    text = user_message(err.value)
    assert str(path) in text and str(offset) in text and "\n" not in text


@pytest.mark.parametrize("kind", ["native", "python"])
def test_bad_fd_raises_read_error(kind):
    buf = bytearray(16)
    with make_reader(kind) as rd:
        with pytest.raises(ReadError) as err:
            rd.read_batch(
                np.array([987_654]), np.array([0]), np.array([16]), np.array([buffer_address(buf)])
            )
    assert err.value.errno == 9  # EBADF
    assert "<fd 987654>" in str(err.value) and "offset 0" in str(err.value)


@pytest.mark.parametrize("kind", ["native", "python"])
def test_first_failure_reported_and_others_read(data_file, tmp_path, kind):
    """A failing request in the middle of a batch names its own file; the rest still land."""
    path, data = data_file
    small = tmp_path / "small.bin"
    small.write_bytes(b"abc")
    out = np.zeros(3000, dtype=np.uint8)
    with make_reader(kind, 8) as rd:
        fd, fd_small = rd.open(path), rd.open(small)
        fds = np.array([fd, fd_small, fd])
        offsets = np.array([10, 0, 2000])
        lengths = np.array([1000, 1000, 1000])
        dests = out.ctypes.data + np.array([0, 1000, 2000])
        with pytest.raises(ReadError, match="small.bin") as err:
            rd.read_batch(fds, offsets, lengths, dests)
    assert err.value.got == 3
    assert bytes(out[:1000]) == data[10:1010] and bytes(out[2000:]) == data[2000:3000]


def o_direct_refused(path: Path) -> bool:
    o_direct = getattr(os, "O_DIRECT", 0)
    if not o_direct:
        return False
    try:
        os.close(os.open(path, os.O_RDONLY | o_direct))
    except OSError:
        return True
    return False


def check_direct_reads(path: Path, data: bytes, offsets, lengths) -> None:
    refused = o_direct_refused(path)
    for kind in ("native", "python"):
        with make_reader(kind, 4, direct=True) as rd:
            out, _ = read_into_mlx(rd, path, np.array(offsets), np.array(lengths))
            assert np.array_equal(out, expected(data, np.array(offsets), np.array(lengths)))
            assert rd.direct_active is not refused
            if refused:
                assert str(path) in (rd.direct_fallback_reason or "")


def test_direct_on_tmpfs_keeps_bytes_right(tmp_path):
    """tmpfs refused O_DIRECT before Linux 6.6: either way the bytes are right."""
    folder = Path("/dev/shm") if Path("/dev/shm").is_dir() else tmp_path
    path = folder / f"ssdmoe-test-{os.getpid()}.bin"
    data = os.urandom(50_000)
    path.write_bytes(data)
    try:
        check_direct_reads(path, data, [1, 4096, 30_001], [5000, 4096, 19_999])
    finally:
        path.unlink()


def test_direct_refused_falls_back_to_buffered():
    """procfs refuses O_DIRECT (Linux); macOS F_NOCACHE is always accepted on files."""
    path = Path("/proc/version") if sys.platform.startswith("linux") else Path(__file__)
    data = path.read_bytes()
    check_direct_reads(path, data, [0, 3, len(data) - 10], [len(data), 10, 10])
    if sys.platform.startswith("linux"):
        assert o_direct_refused(path)


def test_concurrent_batches_from_threads_share_one_native_reader(data_file):
    path, data = data_file
    errors: list[BaseException] = []
    with make_reader("native", 8) as rd:
        fd = rd.open(path)

        def run(seed: int) -> None:
            try:
                rng = np.random.default_rng(seed)
                for _ in range(20):
                    offsets, lengths = random_requests(rng, 24, len(data), 20_000)
                    buf = np.zeros(int(lengths.sum()) + 1, dtype=np.uint8)
                    dests = buf.ctypes.data + np.concatenate([[0], np.cumsum(lengths)[:-1]])
                    rd.read_batch(np.full(len(offsets), fd), offsets, lengths, dests)
                    assert np.array_equal(buf[:-1], expected(data, offsets, lengths))
            except BaseException as exc:  # reported below
                errors.append(exc)

        threads = [threading.Thread(target=run, args=(s,)) for s in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert not errors, errors


def test_env_forces_python(monkeypatch):
    monkeypatch.setenv("SSDMOE_READER", "python")
    with open_reader(4) as rd:
        assert rd.name == "python" and rd.queue_depth == 4 and rd.fallback_reason is None
    monkeypatch.setenv("SSDMOE_READER", "bogus")
    with pytest.raises(BadValueError, match="SSDMOE_READER must be .* got 'bogus'"):
        open_reader()  # a one-line user error naming the variable, not a bare ValueError


def copy_sources(dest: Path) -> Path:
    dest.mkdir(parents=True)
    for name in ("ssdmoe_reader.c", "ssdmoe_reader.h", "cflags.txt"):
        shutil.copy(reader.PACKAGE_NATIVE_DIR / name, dest / name)
    return dest


def test_runtime_build_goes_to_the_cache_keyed_by_source(tmp_path, data_file, monkeypatch):
    """A checkout without a built library (or with an edited source) builds one into the
    user cache with native/cflags.txt (-Werror included), never into the source folder."""
    monkeypatch.delenv(reader.LIB_ENV, raising=False)
    src = copy_sources(tmp_path / "pkg")
    lib = reader.load_native_library(src)
    built = Path(lib._name)
    assert built.parent == tmp_path / "home" / "cache" / "native"
    assert reader._source_hash(src) in built.name and not list(src.glob("*.so"))
    path, data = data_file
    with NativeReader(2, lib=lib) as rd:
        buf = bytearray(100)
        fd = rd.open(path)
        rd.read_batch(
            np.array([fd]), np.array([7]), np.array([100]), np.array([buffer_address(buf)])
        )
    assert bytes(buf) == data[7:107]
    with open(src / "ssdmoe_reader.c", "a") as f:
        f.write("\n/* edited */\n")
    again = Path(reader.load_native_library(src)._name)
    assert again != built and again.parent == built.parent
    # the flags really are the one set: a warning is an error
    with open(src / "ssdmoe_reader.c", "a") as f:
        f.write("static int unused_function(void) { return 0; }\n")
    with pytest.raises(NativeReaderUnavailable, match="unused"):
        reader.load_native_library(src)


def test_installed_package_uses_the_build_extension(monkeypatch):
    """The package build compiled the reader (setup.py); with no override that is the
    library loaded."""
    monkeypatch.delenv(reader.LIB_ENV, raising=False)
    ext = reader.built_extension()
    assert ext is not None and ext.is_file(), "package build made no native reader"
    assert reader.native_library_path() == ext


def test_env_points_the_reader_at_a_given_library(tmp_path, monkeypatch):
    env = os.environ.get(reader.LIB_ENV)
    if env is None:  # make one (make sanitize sets it to the ASan/UBSan build)
        env = str(reader.build_native_library(reader.PACKAGE_NATIVE_DIR, tmp_path / "lib.so"))
        monkeypatch.setenv(reader.LIB_ENV, env)
    else:  # the process-wide library is the one asked for
        assert Path(reader._native_lib()._name) == Path(env)
    assert Path(reader.load_native_library()._name) == Path(env)
    monkeypatch.setenv(reader.LIB_ENV, str(tmp_path / "missing.so"))
    with pytest.raises(NativeReaderUnavailable, match="SSDMOE_READER_LIB=.*missing.so"):
        reader.load_native_library()


def test_missing_compiler_is_one_line_and_falls_back(tmp_path, monkeypatch, data_file):
    monkeypatch.delenv(reader.LIB_ENV, raising=False)
    src = copy_sources(tmp_path / "pkg")
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    with pytest.raises(NativeReaderUnavailable) as err:
        reader.load_native_library(src)
    assert "no-such-cc" in str(err.value) and "\n" not in str(err.value)
    # open_reader falls back to Python and says why; forcing native raises
    monkeypatch.setattr(reader, "PACKAGE_NATIVE_DIR", src)
    monkeypatch.setattr(reader, "_native_cache", None)
    rd = open_reader(2)
    assert isinstance(rd, PythonReader) and "no-such-cc" in (rd.fallback_reason or "")
    rd.close()
    with pytest.raises(NativeReaderUnavailable):
        open_reader(2, prefer="native")


def test_iostats_counters(data_file):
    path, data = data_file
    before = iostats.requested_read_bytes()
    with open(path, "rb") as f:
        f.read()
    after = iostats.requested_read_bytes()
    if sys.platform.startswith("linux"):
        assert after - before >= len(data)
        assert isinstance(iostats.device_read_bytes(), int)
    rss, peak = iostats.rss_bytes(), iostats.peak_rss_bytes()
    assert rss is not None and peak is not None and 0 < rss <= peak


@pytest.mark.parametrize("kind", ["native", "python"])
def test_open_missing_file_names_it(tmp_path, kind):
    missing = tmp_path / "nope.safetensors"
    with make_reader(kind, 4) as rd:
        assert rd.queue_depth == 4
        with pytest.raises(FileNotFoundError) as err:
            rd.open(missing)
    assert str(missing) in user_message(err.value)

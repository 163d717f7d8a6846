"""Micro benchmark of the expert reader: random 1.75 MiB reads (one expert's slice in a
large MoE) from a 2 GiB file, at several queue depths, for both readers.

Each run starts with a cold page cache: `echo 3 > /proc/sys/vm/drop_caches` as root, else
`posix_fadvise(DONTNEED)` on the file (works for clean pages without root); if neither
works the numbers are marked "warm". The device column (bytes the disk actually read,
from /proc/self/io) shows whether the reads really went to the device.

    python scripts/bench_reader.py [--size-gib 2] [--direct] [--warm] [--dir /path/on/ssd]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from ssdmoe_tui.engine.experts import iostats  # noqa: E402
from ssdmoe_tui.engine.experts.reader import buffer_address, open_reader  # noqa: E402

MIB = 1 << 20
GIB = 1 << 30


def make_file(path: Path, size: int) -> None:
    rng = np.random.default_rng(0)
    chunk = 64 * MIB
    with open(path, "wb") as f:
        left = size
        while left > 0:
            n = min(chunk, left)
            f.write(rng.integers(0, 256, n, dtype=np.uint8).tobytes())
            left -= n
        f.flush()
        os.fsync(f.fileno())


def drop_cache(path: Path) -> str:
    """'drop_caches', 'fadvise' or 'warm' (could not evict)."""
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return "drop_caches"
    except OSError:
        pass
    if hasattr(os, "posix_fadvise"):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            return "fadvise"
        finally:
            os.close(fd)
    return "warm"


def dest_buffer(nbytes: int):
    """Preallocated destination, an MLX array when MLX is importable (as in the engine)."""
    try:
        import mlx.core as mx

        arr = mx.zeros((nbytes,), dtype=mx.uint8)
        mx.eval(arr)
        return arr, buffer_address(memoryview(arr))
    except ImportError:
        arr = np.zeros(nbytes, dtype=np.uint8)
        return arr, arr.ctypes.data


def warm_cache(path: Path) -> str:
    with open(path, "rb") as f:
        while f.read(64 * MIB):
            pass
    return "warm"


def run_one(
    kind: str,
    qd: int,
    direct: bool,
    path: Path,
    size: int,
    req: int,
    total: int,
    batch: int,
    warm: bool = False,
) -> tuple[float, int, str, str]:
    rng = np.random.default_rng(qd)
    n = max(batch, total // req // batch * batch)
    offsets = rng.integers(0, size - req, n, dtype=np.int64)
    lengths = np.full(n, req, dtype=np.int64)
    _keep, base = dest_buffer(batch * req)
    dests = base + np.arange(batch, dtype=np.int64) * req
    with open_reader(qd, direct=direct, prefer=kind) as rd:
        fd = rd.open(path)
        fds = np.full(batch, fd, dtype=np.int64)
        how = warm_cache(path) if warm else drop_cache(path)
        dev0 = iostats.device_read_bytes() or 0
        t0 = time.perf_counter()
        for i in range(0, n, batch):
            rd.read_batch(fds, offsets[i : i + batch], lengths[i : i + batch], dests)
        dt = time.perf_counter() - t0
        dev = (iostats.device_read_bytes() or 0) - dev0
        note = "" if not direct or rd.direct_active else "(direct refused)"
    return n * req / dt / GIB, dev, how, note


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    ap.add_argument("--size-gib", type=float, default=2.0)
    ap.add_argument("--req-mib", type=float, default=1.75)
    ap.add_argument("--total-mib", type=int, default=512, help="bytes read per configuration")
    ap.add_argument("--batch", type=int, default=32, help="requests per read_batch call")
    ap.add_argument("--qd", default="1,4,8,16")
    ap.add_argument("--readers", default="native,python")
    ap.add_argument("--direct", action="store_true", help="also run with direct I/O")
    ap.add_argument(
        "--warm", action="store_true", help="read from the page cache (reader overhead only)"
    )
    ap.add_argument("--dir", default=None, help="folder for the temp file (default: $TMPDIR)")
    args = ap.parse_args()

    size = int(args.size_gib * GIB)
    req = int(args.req_mib * MIB)
    qds = [int(q) for q in args.qd.split(",")]
    with tempfile.TemporaryDirectory(dir=args.dir, prefix="ssdmoe-bench-") as tmp:
        path = Path(tmp) / "shard.bin"
        t0 = time.perf_counter()
        make_file(path, size)
        print(f"file: {path} ({size / GIB:.2f} GiB, written in {time.perf_counter() - t0:.1f}s)")
        print(f"requests: {req / MIB:.2f} MiB at random offsets, {args.batch} per batch")
        print(f"{'reader':8} {'direct':6} {'qd':>3} {'GiB/s':>7} {'device MiB':>10}  cache")
        for direct in [False, True] if args.direct else [False]:
            for kind in args.readers.split(","):
                for qd in qds:
                    gibs, dev, how, note = run_one(
                        kind,
                        qd,
                        direct,
                        path,
                        size,
                        req,
                        args.total_mib * MIB,
                        args.batch,
                        args.warm,
                    )
                    print(
                        f"{kind:8} {str(direct):6} {qd:3d} {gibs:7.2f} {dev / MIB:10.0f}  {how} {note}",
                        flush=True,
                    )


if __name__ == "__main__":
    main()

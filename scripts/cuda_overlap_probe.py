"""Does a copy queued on a second MLX stream overlap the compute of the first on MLX-CUDA?

Issue 43's warm 4k prefill: `SSDMOE_PREFILL_STAGE=ahead` (engine/model/prestage.py)
queues each layer's copy of its slots' rows (host-placed memory -> device) on a second
stream while the layer before computes, and measured the same as staging in place on
an H100 (0.786-0.800x resident against 0.792-0.793x, docs/benchmarks.md 2026-12-06 sixth
session). Either the copy does not run beside the compute, or it was not what bound the
chunk. This probe times, with no model, a layer-sized compute (quantized matmuls of a
4096-token chunk over 128 experts' worth of weights), a layer-sized copy (a gather of
128 slot rows of 2.53 MiB from host-placed slots that the CPU wrote, as the reader
leaves them; `prestage.gather_rows` gathers the same bytes per component), each alone,
then both queued together on one stream and on two. `overlap_share_of_copy` = (one
stream - two streams) / copy: near 1 the copy ran beside the compute, near 0 it did not
(MLX serialized the streams, or the compute's kernels left the copy's kernel no SMs).

    python3 scripts/cuda_overlap_probe.py [--rounds 7] [--rows 128] [--placement host]

One JSON line per case (median ms over the rounds) and a summary line. Under MLX-CUDA
with host-placed slots it also times the other way to move the same rows: migrating
their pages to the GPU with `cuMemPrefetchAsync` on a CUDA stream of its own (the copy
engines' DMA, no SMs), alone (`migrate_gb_s` against `copy_gb_s`) and while the compute
runs (`migrate_overlap_share`), the way back likewise (`return_gb_s`,
`return_overlap_share`), and the CPU writing those rows with their pages on the host or
left on the GPU (`cpu_write_gb_s`: what a refill costs with and without the way back). On
the CPU it runs too, small, with no migration (each MLX stream is a thread there), which
is how it is tried.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import statistics
import time

import mlx.core as mx
import numpy as np

from ssdmoe_tui.engine.experts import device_memory as dm
from ssdmoe_tui.engine.experts.reader import buffer_address

H, INTER, GS, BITS = 2048, 768, 64, 4  # Qwen3-30B-A3B expert: 2.53 MiB with scales


class _Migrator:
    """`cuda_slot_probe.Prefetcher`'s page moves of slot rows, on a non-blocking CUDA
    stream of their own."""

    def __init__(self, slots: mx.array, rows: np.ndarray) -> None:
        from cuda_slot_probe import Prefetcher  # scripts/, beside this file

        self.pf = Prefetcher()
        lib = ctypes.CDLL("libcuda.so.1")
        self.wait = lib.cuStreamSynchronize
        self.wait.argtypes = [ctypes.c_void_p]
        self.stream = ctypes.c_void_p()
        rc = lib.cuStreamCreate(ctypes.byref(self.stream), 1)  # CU_STREAM_NON_BLOCKING
        if rc:
            raise RuntimeError(f"cuStreamCreate -> {rc}")
        row = int(slots.nbytes) // slots.shape[0]
        base = buffer_address(memoryview(slots))
        self.ranges = [(base + int(r) * row, row) for r in rows]

    def start(self, to_gpu: bool) -> None:
        self.pf.to(self.ranges, host=not to_gpu, stream=self.stream)

    def finish(self) -> None:
        self.wait(self.stream)


# The timed moves: (name, pages start on the GPU, what is timed). A long chunk staged by
# migration would send layer l+1's rows to the GPU while layer l computes, compute from
# them in place, and send them back before the reader refills the slots: the way back
# beside the compute, and the CPU's write to pages left on the GPU (the page faults that
# made `managed` slots slow) against pages sent back, price that design.
_MOVES = (
    ("to_gpu", False, "move"),
    ("to_host", True, "move"),
    ("to_gpu_with_compute", False, "move+compute"),
    ("to_host_with_compute", True, "move+compute"),
    ("cpu_write_host_pages", False, "write"),
    ("cpu_write_gpu_pages", True, "write"),
)


def _migrate_ms(slots: mx.array, rows: np.ndarray, compute, rounds: int) -> dict:  # noqa: ANN001
    """Median ms of each move in `_MOVES`: the rows' pages to the GPU or back, alone and
    while `compute` runs, and the CPU writing the rows (as the reader refills slots) with
    their pages on the host or on the GPU (placed there before each timed round)."""
    m = _Migrator(slots, rows)
    out: dict[str, list[float]] = {name: [] for name, _, _ in _MOVES}
    for _ in range(rounds):
        for name, on_gpu, what in _MOVES:
            m.start(on_gpu)
            m.finish()
            mx.synchronize()
            t0 = time.perf_counter()
            if what == "write":
                for ptr, size in m.ranges:
                    ctypes.memset(ptr, 2, size)
            elif what == "move+compute":
                y = compute()
                mx.async_eval(y)
                m.start(not on_gpu)
                mx.eval(y)
                m.finish()
            else:
                m.start(not on_gpu)
                m.finish()
            out[name].append((time.perf_counter() - t0) * 1e3)
    return {name: statistics.median(ms) for name, ms in out.items()}


def _slots(n: int, placement: str) -> mx.array:
    """`n` slot rows of one expert's packed gate+up+down weights (uint32), placed, then
    written by the CPU as the reader writes them: under `host` placement that is what
    puts the pages in host memory (the zeros were made by a GPU kernel, and a preferred
    location moves no page by itself); under `managed` they migrate to the GPU on first
    use, as a freshly read slot's do."""
    words = 3 * INTER * H * BITS // 32 + 3 * INTER * H // GS  # weights + scales/biases
    a = mx.zeros((n, words), dtype=mx.uint32)
    mx.eval(a)
    base = buffer_address(memoryview(a))
    if dm.is_cuda():
        got = dm.place_slots([(base, int(a.nbytes))], placement)
        print(json.dumps({"placement": got.placement, "note": got.note}))
    ctypes.memset(base, 1, int(a.nbytes))  # the CPU's write, page by page
    return a


def _weights(experts: int) -> tuple[mx.array, mx.array, mx.array]:
    w = mx.random.normal((experts, INTER, H)).astype(mx.bfloat16)
    q, s, b = mx.quantize(w, group_size=GS, bits=BITS)
    mx.eval(q, s, b)
    return q, s, b


def _compute(x: mx.array, q, s, b, idx: mx.array) -> mx.array:  # noqa: ANN001
    """One projection of every (token, k) row, rows sorted by expert as mlx-lm's
    SwitchGLU sorts a long chunk's (`sorted_indices`: the kernel a prefill runs)."""
    return mx.gather_qmm(
        x, q, s, b, rhs_indices=idx, transpose=True, group_size=GS, bits=BITS,
        sorted_indices=True,
    )  # fmt: skip


def _time(fn, rounds: int) -> float:  # noqa: ANN001
    out = []
    for _ in range(rounds):
        mx.synchronize()
        t0 = time.perf_counter()
        mx.eval(fn())
        mx.synchronize()
        out.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--rows", type=int, default=128, help="rows copied (a layer's union)")
    ap.add_argument("--slots", type=int, default=512, help="slot rows in the placed bank")
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--k", type=int, default=8)
    ap.add_argument("--experts", type=int, default=128)
    ap.add_argument("--placement", default="host", choices=("host", "managed"))
    ap.add_argument("--repeat", type=int, default=3, help="matmul passes per compute")
    a = ap.parse_args()

    slots = _slots(a.slots, a.placement)
    picked = np.random.default_rng(0).choice(a.slots, a.rows, replace=False)
    rows = mx.array(picked)
    q, s, b = _weights(a.experts)
    n = a.tokens * a.k
    x = mx.random.normal((n, 1, H)).astype(mx.bfloat16)
    idx = mx.array(np.sort(np.random.default_rng(1).integers(0, a.experts, n)).astype(np.uint32))
    mx.eval(x, idx)
    side = mx.new_stream(mx.default_device())

    def compute() -> mx.array:
        # `repeat` projections (gate, up, down are three): their sum, one output
        return sum(_compute(x, q, s, b, idx) for _ in range(a.repeat))

    def copy() -> mx.array:
        return slots[rows]

    def one_stream() -> list[mx.array]:
        return [compute(), copy()]

    def two_streams() -> list[mx.array]:
        y = compute()
        with mx.stream(side):
            c = copy()
        return [y, c]

    for fn in (compute, copy, one_stream, two_streams):  # compile, not timed
        mx.eval(fn())
    got = {
        name: _time(fn, a.rounds)
        for name, fn in (
            ("compute", compute),
            ("copy", copy),
            ("one_stream", one_stream),
            ("two_streams", two_streams),
        )
    }
    copied = a.rows * int(slots.nbytes) // a.slots
    for name, ms in got.items():
        print(json.dumps({"case": name, "ms": round(ms, 3)}))
    summary = {
        "device": str(mx.default_device()),
        "copied_mib": round(copied / 2**20, 1),
        "copy_gb_s": round(copied / got["copy"] / 1e6, 2),
        # the serial baseline is the one-stream run (the same evals, so fixed costs cancel)
        "overlap_share_of_copy": round((got["one_stream"] - got["two_streams"]) / got["copy"], 3),
        "two_streams_over_longer": round(got["two_streams"] / max(got["compute"], got["copy"]), 3),
    }
    if dm.is_cuda() and a.placement == "host":
        mig = _migrate_ms(slots, picked, compute, a.rounds)
        summary["migrate_ms"] = {k: round(v, 3) for k, v in mig.items()}
        summary["migrate_gb_s"] = round(copied / mig["to_gpu"] / 1e6, 2)
        for way in ("to_gpu", "to_host"):
            key = "migrate_overlap_share" if way == "to_gpu" else "return_overlap_share"
            summary[key] = round(
                (got["compute"] + mig[way] - mig[f"{way}_with_compute"]) / mig[way], 3
            )
        summary["return_gb_s"] = round(copied / mig["to_host"] / 1e6, 2)
        summary["cpu_write_gb_s"] = {
            where: round(copied / mig[f"cpu_write_{where}_pages"] / 1e6, 2)
            for where in ("host", "gpu")
        }
    print(json.dumps(summary))


if __name__ == "__main__":
    main()

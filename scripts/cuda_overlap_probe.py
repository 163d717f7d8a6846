"""Does a copy queued on a second MLX stream overlap the compute of the first on MLX-CUDA?

Issue 43's warm 4k prefill: `SSDMOE_PREFILL_STAGE=ahead` (engine/model/prestage.py)
queues each layer's copy of its slots' rows (host-placed memory -> device) on a second
stream while the layer before computes, and measured the same as staging in place on
an H100 (0.786-0.800x resident against 0.792-0.793x, docs/benchmarks.md 2026-12-06 sixth
session). Either the copy does not run beside the compute, or it was not what bound the
chunk. This probe times, with no model, a layer-sized compute (quantized matmuls of a
4096-token chunk over 128 experts' worth of weights), a layer-sized copy (a gather of
128 rows of 2.53 MiB from host-placed slots, as `prestage.gather_rows` does), each
alone, then both queued together on one stream and on two. If two streams take about
max(compute, copy) the copy overlaps; about their sum, it does not.

    python3 scripts/cuda_overlap_probe.py [--rounds 7] [--rows 128] [--placement host]

One JSON line per case (median ms over the rounds) and a summary line. Under MLX-CUDA
with host-placed slots it also times the other way to move the same rows: migrating
their pages to the GPU with `cuMemPrefetchAsync` (the copy engines' DMA, not a kernel
reading over the bus) and back, the rate a prefill that computed from migrated slots
would get (`migrate_gb_s` against `copy_gb_s`). On the CPU it runs too (both streams
share the cores: no overlap to expect; no migration), which is how it is tried.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import mlx.core as mx
import numpy as np

from ssdmoe_tui.engine.experts import device_memory as dm
from ssdmoe_tui.engine.experts.reader import buffer_address

H, INTER, GS, BITS = 2048, 768, 64, 4  # Qwen3-30B-A3B expert: 2.53 MiB with scales


def _migrate_ms(slots: mx.array, rows: np.ndarray, rounds: int) -> dict:
    """Median ms to prefetch `rows` of `slots` (one range each) to the GPU, then back."""
    from cuda_slot_probe import Prefetcher  # scripts/, beside this file

    pf = Prefetcher()
    row = int(slots.nbytes) // slots.shape[0]
    base = buffer_address(memoryview(slots))
    ranges = [(base + int(r) * row, row) for r in rows]
    out: dict[str, list[float]] = {"to_gpu": [], "to_host": []}
    for _ in range(rounds):
        for name, host in (("to_gpu", False), ("to_host", True)):
            t0 = time.perf_counter()
            pf.to(ranges, host=host)
            pf.sync()
            out[name].append((time.perf_counter() - t0) * 1e3)
    return {name: statistics.median(ms) for name, ms in out.items()}


def _slots(n: int, placement: str) -> mx.array:
    """`n` slot rows of one expert's packed gate+up+down weights (uint32), placed."""
    words = 3 * INTER * H * BITS // 32 + 3 * INTER * H // GS  # weights + scales/biases
    a = mx.zeros((n, words), dtype=mx.uint32)
    mx.eval(a)
    if dm.is_cuda():
        got = dm.place_slots([(buffer_address(memoryview(a)), int(a.nbytes))], placement)
        print(json.dumps({"placement": got.placement, "note": got.note}))
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
    saved = got["compute"] + got["copy"] - got["two_streams"]
    summary = {
        "device": str(mx.default_device()),
        "copied_mib": round(copied / 2**20, 1),
        "copy_gb_s": round(copied / got["copy"] / 1e6, 2),
        "overlap_share_of_copy": round(saved / got["copy"], 3),
        "two_over_one_stream": round(got["two_streams"] / got["one_stream"], 3),
    }
    if dm.is_cuda() and a.placement == "host":
        mig = _migrate_ms(slots, picked, a.rounds)
        summary["migrate_ms"] = {k: round(v, 3) for k, v in mig.items()}
        summary["migrate_gb_s"] = round(copied / mig["to_gpu"] / 1e6, 2)
    print(json.dumps(summary))


if __name__ == "__main__":
    main()

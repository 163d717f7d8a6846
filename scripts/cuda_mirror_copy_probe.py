"""The slot mirror's two ways of moving rows, checked and timed without a model.

`SlotMirror.sync` (engine/experts/mirror.py) copies the rows a read filled from the host
banks into the device mirror: `direct` (row_copy.py: the CUDA driver's `cuMemcpyAsync`
on MLX-CUDA, one copy per run of rows and component) or `mlx` (a gather and a scatter
through MLX per component and bank). This builds banks of the Qwen3-30B-A3B expert's
nine components (2.53 MiB a slot; `--slots` of them, placed as the cache places them,
`device`: host-preferred, mapped for the GPU), writes random rows into them from the
CPU as the reader does, and per way: checks that the mirror's rows equal the host
rows after a sync (and that untouched rows stay as they were), then times a decode
layer's sync (`--rows` scattered rows: 1-3 misses) and a catch-up (`--catchup` rows),
medians over `--rounds`. One JSON line per way and size; a mismatch exits 1.

    python3 scripts/cuda_mirror_copy_probe.py [--slots 512] [--rounds 15]

On the CPU it runs too (memmove against MLX's gather / scatter), which is how it is tried.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import mlx.core as mx
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from ssdmoe_tui.engine.experts import device_memory as dm  # noqa: E402
from ssdmoe_tui.engine.experts.mirror import SlotMirror  # noqa: E402
from ssdmoe_tui.engine.experts.reader import buffer_address  # noqa: E402
from ssdmoe_tui.engine.experts.slack import slot_array  # noqa: E402

H, INTER, GS = 2048, 768, 64  # Qwen3-30B-A3B expert, 4-bit: 2.53 MiB with scales


def components() -> dict[str, tuple[tuple[int, ...], mx.Dtype]]:
    out = {}
    for name, (o, i) in {
        "gate_proj": (INTER, H),
        "up_proj": (INTER, H),
        "down_proj": (H, INTER),
    }.items():
        out[f"{name}.weight"] = ((o, i // 8), mx.uint32)
        out[f"{name}.scales"] = ((o, i // GS), mx.bfloat16)
        out[f"{name}.biases"] = ((o, i // GS), mx.bfloat16)
    return out


def fill(banks, rows: np.ndarray, rng) -> None:  # noqa: ANN001
    """Random bytes into `rows` of the host banks, written by the CPU (as the reader)."""
    for a in banks[0].values():
        row_bytes = int(a.nbytes) // a.shape[0]
        view = np.frombuffer(memoryview(a), dtype=np.uint8)
        for r in rows.tolist():
            view[r * row_bytes : (r + 1) * row_bytes] = rng.integers(0, 255, row_bytes, np.uint8)


def same(mirror: SlotMirror, banks, rows: np.ndarray) -> bool:  # noqa: ANN001
    idx = mx.array(rows.astype(np.uint32))

    def raw(a: mx.array) -> np.ndarray:  # the bytes (bfloat16 has no numpy dtype)
        return np.array(mx.view(a[idx], mx.uint16 if a.dtype == mx.bfloat16 else a.dtype))

    return all(np.array_equal(raw(mirror.banks[0][n]), raw(a)) for n, a in banks[0].items())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    ap.add_argument("--slots", type=int, default=512)
    ap.add_argument("--rows", type=int, default=2)
    ap.add_argument("--catchup", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=15)
    args = ap.parse_args()
    rng = np.random.default_rng(7)
    banks = [{n: slot_array(args.slots, s, d) for n, (s, d) in components().items()}]
    buffers = [(buffer_address(memoryview(a)), int(a.nbytes)) for a in banks[0].values()]
    placed = dm.place_slots(buffers, "device" if dm.is_cuda() else None, share=0.1)
    fill(banks, np.arange(args.slots), rng)
    ok = True
    for way in ("direct", "mlx"):
        mirror = SlotMirror(banks, args.slots, copy=way)
        mirror.mark(np.arange(args.slots))
        mirror.sync()
        mx.synchronize()
        ok_all = same(mirror, banks, np.arange(args.slots))
        for size in (args.rows, args.catchup):
            times = []
            good = ok_all
            for _ in range(args.rounds):
                rows = np.sort(rng.choice(args.slots, size=size, replace=False))
                fill(banks, rows, rng)
                mirror.mark(rows)
                t0 = time.perf_counter()
                mirror.sync()
                mx.synchronize()  # `mlx` queues its copies: both timed to their end
                times.append(time.perf_counter() - t0)
                good = good and same(mirror, banks, rows)
            ms = statistics.median(times) * 1e3
            mib = size * mirror.row_bytes / 2**20
            print(json.dumps({
                "way": way, "copier": mirror.copier, "note": mirror.copy_note,
                "placement": placed.placement, "rows": size, "mib": round(mib, 2),
                "median_ms": round(ms, 3), "gb_s": round(mib * 2**20 / (ms / 1e3) / 1e9, 2),
                "rows_equal": good,
            }), flush=True)  # fmt: skip
            ok = ok and good
        mirror.close()
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())

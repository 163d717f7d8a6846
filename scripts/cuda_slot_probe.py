"""Measure what a freshly read expert slot costs the GPU, per managed-memory placement.

Run on the MLX-CUDA machine (docs/benchmarks.md, "Slot placement on MLX-CUDA"):

    python3 scripts/cuda_slot_probe.py [--slots 2400] [--tokens 6] [--layers 40] [--k 8]

It mimics the engine's decode step without a model: per MoE layer, a host sync of
the running activation (the router sync), a batched native read of K missed experts
(Qwen3.5-35B-A3B's expert: 3 projections x weight/scales/biases, 1.69 MiB) from a
page-cached file straight into slot arrays, then the three `gather_qmm` calls on
those slots. Placements: `managed` (MLX's default), `host` (preferred location host,
mapped for the GPU), `prefetch` (slots moved to the host before the read and to the
GPU after it, in bulk). Also times the same compute on slots already read ("hit"),
which is what a cache hit costs under each placement. Prints one JSON line per run.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import time

import mlx.core as mx
import numpy as np

from ssdmoe_tui.engine.experts import device_memory as dm
from ssdmoe_tui.engine.experts.reader import NativeReader, buffer_address

H, INTER, GS, BITS = 2048, 512, 64, 4  # Qwen3.5-35B-A3B expert shape


def shapes():
    # name -> (shape, dtype) per expert, as mlx-community stores them
    out = {}
    for proj, (o, i) in {"gate": (INTER, H), "up": (INTER, H), "down": (H, INTER)}.items():
        out[f"{proj}.weight"] = ((o, i * BITS // 32), mx.uint32)
        out[f"{proj}.scales"] = ((o, i // GS), mx.bfloat16)
        out[f"{proj}.biases"] = ((o, i // GS), mx.bfloat16)
    return out


def make_file(path: str, n_experts: int, stride: int) -> None:
    if os.path.exists(path) and os.path.getsize(path) == n_experts * stride:
        return
    rng = np.random.default_rng(0)
    with open(path, "wb") as f:
        for _ in range(n_experts):
            b = rng.integers(0, 255, size=stride, dtype=np.uint8)
            # keep scales/biases finite: small bf16 values in every odd byte pair
            b[1::2] = 0x3C
            f.write(b.tobytes())


class Prefetcher:
    def __init__(self) -> None:
        lib = ctypes.CDLL("libcuda.so.1")
        self.f = lib.cuMemPrefetchAsync_v2
        self.f.argtypes = [
            ctypes.c_uint64,
            ctypes.c_size_t,
            dm._MemLocation,
            ctypes.c_uint,
            ctypes.c_void_p,
        ]
        self.f.restype = ctypes.c_int
        self.sync = lib.cuCtxSynchronize
        self.sync.restype = ctypes.c_int

    def to(self, ranges, host: bool, stream=None) -> None:  # noqa: ANN001 - a CUstream
        loc = dm._MemLocation(dm._LOC_HOST, 0) if host else dm._MemLocation(dm._LOC_DEVICE, 0)
        for p, n in ranges:
            rc = self.f(p, n, loc, 0, stream)
            if rc:
                raise RuntimeError(f"cuMemPrefetchAsync_v2 -> {rc}")


def run(placement: str, args, path: str) -> dict:
    sh = shapes()
    names = list(sh)
    pools = {n: mx.zeros((args.slots, *s), dtype=d) for n, (s, d) in sh.items()}
    mx.eval(list(pools.values()))
    strides = [int(pools[n].nbytes) // args.slots for n in names]
    bases = [buffer_address(memoryview(pools[n])) for n in names]
    pf = None
    if placement == "host":
        res = dm.place_slots(
            [(b, int(pools[n].nbytes)) for b, n in zip(bases, names, strict=True)], "host"
        )
        assert res.placement == "host", res
    elif placement == "prefetch":
        pf = Prefetcher()
    reader = NativeReader(queue_depth=16)
    fd = reader.open(path)
    expert_bytes = sum(strides)
    n_file = os.path.getsize(path) // expert_bytes
    comp_off = np.cumsum([0, *strides[:-1]])
    rng = np.random.default_rng(1)
    x = mx.ones((1, 1, 1, H), dtype=mx.bfloat16) * 0.01

    def layer(x, slots, read: bool, t: dict):
        t0 = time.perf_counter()
        mx.eval(x)
        t["sync"] += time.perf_counter() - t0
        if read:
            exp = rng.choice(n_file, size=len(slots), replace=False)
            fds = np.full(len(slots) * len(names), fd, dtype=np.int64)
            offs = (exp[:, None] * expert_bytes + comp_off[None, :]).ravel().astype(np.int64)
            lens = (
                np.broadcast_to(np.array(strides, np.int64), (len(slots), len(names)))
                .ravel()
                .copy()
            )
            dests = (
                np.array(bases, np.int64)[None, :]
                + slots[:, None] * np.array(strides, np.int64)[None, :]
            ).ravel()
            t1 = time.perf_counter()
            ranges = list(zip(dests.tolist(), lens.tolist(), strict=True))
            if pf is not None:
                pf.to(ranges, host=True)
                pf.sync()
            reader.read_batch(fds, offs, lens, dests)
            if pf is not None:
                pf.to(ranges, host=False)
            t["read"] += time.perf_counter() - t1
            t["bytes"] += int(lens.sum())
        idx = mx.array(slots.astype(np.uint32)).reshape(1, 1, -1)

        def proj(p, v):
            return mx.gather_qmm(
                v,
                pools[f"{p}.weight"],
                pools[f"{p}.scales"],
                pools[f"{p}.biases"],
                rhs_indices=idx,
                transpose=True,
                group_size=GS,
                bits=BITS,
            )

        xe = mx.expand_dims(x, (-2, -3)).reshape(1, 1, 1, 1, H)
        h = mx.sigmoid(proj("gate", xe)) * proj("up", xe)
        y = proj("down", h)
        return x + 1e-3 * y.sum(axis=-3).reshape(1, 1, 1, H)

    out = {"placement": placement, "slots": args.slots, "k": args.k, "layers": args.layers}
    for mode in ("miss", "hit"):
        t = {"sync": 0.0, "read": 0.0, "bytes": 0}
        fixed = [rng.choice(args.slots, size=args.k, replace=False) for _ in range(args.layers)]
        for tok in range(args.tokens + 1):
            if tok == 1:
                t = {"sync": 0.0, "read": 0.0, "bytes": 0}
                t_start = time.perf_counter()
            for li in range(args.layers):
                slots = (
                    rng.choice(args.slots, size=args.k, replace=False)
                    if mode == "miss"
                    else fixed[li]
                )
                x = layer(x, slots, mode == "miss", t)
        t0 = time.perf_counter()
        mx.eval(x)
        t["sync"] += time.perf_counter() - t0
        total = time.perf_counter() - t_start
        n = args.tokens
        out[mode] = {
            "ms_per_token": round(1e3 * total / n, 2),
            "sync_ms": round(1e3 * t["sync"] / n, 2),
            "read_ms": round(1e3 * t["read"] / n, 2),
            "mib_per_token": round(t["bytes"] / n / 2**20, 1),
        }
    reader.close()
    pools.clear()
    mx.clear_cache()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(allow_abbrev=False)
    ap.add_argument("--slots", type=int, default=2400)
    ap.add_argument("--tokens", type=int, default=6)
    ap.add_argument("--layers", type=int, default=40)
    ap.add_argument("--k", type=int, default=8)
    ap.add_argument("--file", default="/root/slot_probe.bin")
    ap.add_argument("--placements", default="managed,host,prefetch,managed")
    args = ap.parse_args()
    stride = sum(int(np.prod(s)) * d.size for s, d in shapes().values())
    make_file(args.file, 600, stride)
    with open(args.file, "rb") as f:  # into the page cache: the probe times placement, not the disk
        while f.read(1 << 24):
            pass
    print(
        json.dumps(
            {
                "mlx": mx.__version__,
                "device": str(mx.default_device()),
                "cuda": dm.is_cuda(),
                "expert_bytes": stride,
            }
        ),
        flush=True,
    )
    for p in args.placements.split(","):
        try:
            print(json.dumps(run(p, args, args.file)), flush=True)
        except Exception as e:  # noqa: BLE001 - a probe reports and goes on
            print(json.dumps({"placement": p, "error": repr(e)}), flush=True)


if __name__ == "__main__":
    main()

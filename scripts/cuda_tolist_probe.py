"""What reading a batch step's tokens to the host costs on MLX-CUDA while the next step runs.

Issue 43's batches (docs/benchmarks.md, 2026-12-07 tenth and eleventh sessions): at B = 8
the engine's step reads its 8 tokens (`tolist`) in 1.5-7.3 ms after its sync, with the
next step already queued; 0.14-0.7 ms at B = 4; at B = 1 and 2 the step's whole rest was
0.2-0.35 ms. MLX-CUDA (0.32) gives arrays of up to 8 bytes a slot of its small pool, in managed
memory the host reads in place, and larger ones device memory: the first host read of
those (`Buffer::raw_ptr`) allocates managed memory and copies into it with a synchronous
`cudaMemcpy`. Whether that copy waits behind the work queued on the GPU is this probe's
question, with no model, in the engine's order: a B-token array (an argmax, as a sampler
makes) is queued, a stand-in for the next step (a chain of matmuls) is built on it and
queued, the array is waited for (the step's sync), then read, the host's time of the
read timed. Ways:

- `direct`: the array as the sampler leaves it, the stand-in's input as the next decode
  step's is (an embedding row gathered by each token): what the engine and BatchGenerator
  read;
- `unconsumed`: `direct` with a stand-in that does not read the tokens (the only way the
  first run had, 2026-12-07 eleventh session: ~50 us at B = 4-16, while the engine's
  read took 1.5-7.3 ms at B = 8, so the probe missed what the engine does);
- `host_input`: `direct`, the stand-in also reading a B-value array made on the host each
  step (MLX-CUDA puts those in managed memory, as the batch's per-row arrays made from
  Python lists are): does the host's read of managed memory wait behind kernels using
  another managed array?
- `cpu_copy`: a copy made on the CPU stream, queued with the array (MLX's CPU worker
  thread then does the device read as soon as the array is ready; the main thread reads
  managed memory): `SSDMOE_BATCH_HOST_COPY=on`, which lost in the engine;
- `pairs`: copies of 2 tokens (8 bytes) each, made on the device with the array: MLX-CUDA
  gives those its managed small pool, read in place (`SSDMOE_BATCH_HOST_COPY=pairs`);
  these two ways make their copies with the engine's own `batch.host_copies`;
- `idle`: `direct` with nothing queued behind it (the floor).

    python3 scripts/cuda_tolist_probe.py [--rounds 30] [--busy-ms 20] [--json OUT]

One JSON object: per way and B, the median and 90th percentile of the read in us, and
the queued work's own time. On the CPU it runs too (small, everything in one memory: a
read costs next to nothing there), which is how it is tried.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import mlx.core as mx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from ssdmoe_tui.engine.run.batch import host_copies  # noqa: E402 - after the path

WAYS = ("idle", "unconsumed", "direct", "host_input", "cpu_copy", "pairs")


def _busy(n: int, size: int, toks: mx.array | None = None, extra: mx.array | None = None
          ) -> mx.array:  # fmt: skip
    """A chain of `n` matmuls of `size` squared: the next step's stand-in, queued lazily;
    with `toks`, it starts from their rows of the matrix (an embedding lookup; plus
    `extra`'s rows if given), so it waits for them, and is the same chain whatever the
    way (the lookup adds nothing to its values)."""
    a = mx.random.normal((size, size)).astype(mx.bfloat16)
    x = a
    if toks is not None:
        rows = toks.astype(mx.int32) % size
        if extra is not None:
            rows = rows + extra % size
        x = a + a[rows % size].sum() * 0
    for _ in range(n):
        x = (x @ a) * 0.01
    return x


def _tokens(b: int, vocab: int) -> mx.array:
    """B tokens as a greedy sampler makes them (uint32, on the default stream)."""
    return mx.argmax(mx.random.normal((b, vocab)), axis=-1).astype(mx.uint32)


def _one(way: str, b: int, vocab: int, n: int, size: int) -> float:
    """Seconds the host spends reading B tokens, the way given."""
    toks = _tokens(b, vocab)
    # the engine's own copies (`SSDMOE_BATCH_HOST_COPY` on / pairs), else the array itself
    reads = host_copies(toks, {"cpu_copy": "cpu", "pairs": "pairs"}.get(way, "direct"))
    busy = None
    if way == "idle":
        mx.eval(toks, *reads)
    else:  # the engine's order: the next step queued on the lazy tokens, then its sync
        mx.async_eval(toks, *reads)
        extra = mx.array(list(range(b)), dtype=mx.int32) if way == "host_input" else None
        busy = _busy(n, size, None if way == "unconsumed" else toks, extra)
        mx.async_eval(busy)
        mx.eval(toks, *reads)
    t = time.perf_counter()
    for r in reads:
        r.tolist()
    dt = time.perf_counter() - t
    if busy is not None:
        mx.eval(busy)
    return dt


def _busy_ms(n: int, size: int, rounds: int = 5) -> float:
    times = []
    for _ in range(rounds):
        x = _busy(n, size)  # lazy: nothing runs before the clock starts
        t = time.perf_counter()
        mx.eval(x)
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e3


def _calibrate(size: int, target_ms: float) -> int:
    """Matmuls in the chain for about `target_ms` of device time (at least 1)."""
    _busy_ms(4, size)  # a fresh MLX-CUDA compiles the chain's kernels in the first
    per = _busy_ms(4, size) / 4
    return max(1, round(target_ms / per)) if per > 0 else 1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--busy-ms", type=float, default=20.0, help="the queued work's time")
    ap.add_argument("--size", type=int, default=2048, help="the queued matmuls' side")
    ap.add_argument("--vocab", type=int, default=151936)
    ap.add_argument("--batch", default="1,2,4,8,16")
    ap.add_argument("--json", help="also write the result here")
    args = ap.parse_args()
    bs = [int(x) for x in args.batch.split(",")]
    n = _calibrate(args.size, args.busy_ms)
    for way in WAYS:  # every shape once before the clock (a fresh MLX-CUDA compiles)
        for b in bs:
            _one(way, b, args.vocab, n, args.size)
    reads: dict[str, dict[int, list[float]]] = {w: {b: [] for b in bs} for w in WAYS}
    for _ in range(args.rounds):  # ways and sizes interleaved: drift spreads over all
        for b in bs:
            for way in WAYS:
                reads[way][b].append(_one(way, b, args.vocab, n, args.size))
    out = {
        "device": str(mx.default_device()),
        "mlx": mx.__version__,
        "rounds": args.rounds,
        "busy_matmuls": n,
        "busy_ms": round(_busy_ms(n, args.size), 3),
        "read_us": {
            way: {
                str(b): {
                    "median": round(statistics.median(v) * 1e6, 1),
                    "p90": round(sorted(v)[int(0.9 * (len(v) - 1))] * 1e6, 1),
                }
                for b, v in per.items()
            }
            for way, per in reads.items()
        },
    }
    text = json.dumps(out)
    print(text)
    print("| B | " + " | ".join(f"{w} us (p90)" for w in WAYS) + " |")
    print("|---" * (len(WAYS) + 1) + "|")
    for b in bs:
        cells = [
            f"{out['read_us'][w][str(b)]['median']} ({out['read_us'][w][str(b)]['p90']})"
            for w in WAYS
        ]
        print(f"| {b} | " + " | ".join(cells) + " |")
    if args.json:
        with open(args.json, "w") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

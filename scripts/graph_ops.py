"""The primitives in one batched decode step's graph: the engine's against mlx-lm's
`BatchGenerator`, every expert held (issue 43: on a host-bound GPU step each node costs
its build and its launch, so the engine beats BatchGenerator only by building less).

Each `mx.eval` / `mx.async_eval` of a batch of B rows is written with `mx.export_to_dot`
and its nodes counted by primitive; the step's graph is the most frequent large one.
On the CPU `mx.fast` ops (rope, attention, RMS norm) expand into their pieces, so the
totals are larger than on a GPU; the difference between the two sides is what counts.

    python scripts/graph_ops.py --out /tmp/graph_ops --layers 8 --batch 2
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

MIN_NODES = 20  # smaller graphs are a step's token reads, not its forward pass


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--dtype", default=None, help="e.g. bfloat16: the qmm guard's dtypes")
    args = ap.parse_args()

    import mlx.core as mx
    from batch_vs_mlx import build

    from ssdmoe_tui.bench.batch import row_prompts
    from ssdmoe_tui.bench.batch_compare import ResidentBatch, engine_batch
    from ssdmoe_tui.bench.bench import fixed_prompt
    from ssdmoe_tui.bench.quick import graph_ops
    from ssdmoe_tui.engine.model.loader import load_streamed
    from ssdmoe_tui.engine.run.runner import Runner

    args.out.mkdir(parents=True, exist_ok=True)
    model = build(args.out / f"model-{args.layers}-{args.hidden}", args.hidden, args.layers)
    sm = load_streamed(model, expert_cache="64G", dtype=args.dtype)
    sm.tokenizer.eos_token_ids = set()  # exactly N tokens a row
    runner = Runner(sm)
    resident = ResidentBatch(model, sm.dtype, runner.k)
    base = fixed_prompt(sm.tokenizer, 16)[:16]
    prompts = row_prompts(base, args.batch)
    for _ in range(2):  # warm-up: every layer frozen, both sides' shapes seen
        engine_batch(runner, prompts, 8)
        resident.batch(prompts, 8)

    graphs: list[collections.Counter] = []

    def count(arrays: list) -> None:
        arrays = [a for a in arrays if isinstance(a, mx.array)]
        if arrays:
            graphs.append(graph_ops(*arrays))

    def flat(xs: tuple) -> list:
        out: list = []
        for x in xs:
            out += flat(x) if isinstance(x, (list, tuple)) else [x]
        return out

    plain_eval, plain_async = mx.eval, mx.async_eval

    def counted_eval(*a):  # noqa: ANN202 - mx.eval's own signature
        count(flat(a))
        return plain_eval(*a)

    def counted_async(*a):  # noqa: ANN202
        count(flat(a))
        return plain_async(*a)

    result: dict = {
        "layers": args.layers,
        "batch": args.batch,
        "dtype": str(sm.dtype).removeprefix("mlx.core."),
        "all_frozen": sm.cache.all_frozen,
    }
    mx.eval, mx.async_eval = counted_eval, counted_async
    try:
        for side, run in (
            ("engine", lambda: engine_batch(runner, prompts, 12)),
            ("batch_generator", lambda: resident.batch(prompts, 12)),
        ):
            graphs.clear()
            run()
            # the step's graph: the most frequent of the large ones (not the token reads)
            sizes = collections.Counter(n for g in graphs if (n := sum(g.values())) > MIN_NODES)
            size, _ = max(sizes.items(), key=lambda kv: (kv[1], kv[0]))
            step = next(g for g in graphs if sum(g.values()) == size)
            result[side] = {"nodes": size, "ops": dict(step.most_common())}
    finally:
        mx.eval, mx.async_eval = plain_eval, plain_async
    (args.out / "graph_ops.json").write_text(json.dumps(result, indent=1))
    e, b = result["engine"], result["batch_generator"]
    print(f"B = {args.batch}, {args.layers} layers: engine {e['nodes']} nodes a step, "
          f"BatchGenerator {b['nodes']}")  # fmt: skip
    for op in sorted(set(e["ops"]) | set(b["ops"])):
        d = e["ops"].get(op, 0) - b["ops"].get(op, 0)
        if d:
            print(f"  {op}: {d:+d}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

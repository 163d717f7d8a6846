"""The engine's batched decode against mlx-lm's resident `BatchGenerator`, one process
(issue 32; docs/benchmarks.md "Batched decode against BatchGenerator").

Every expert held (the engine's cache holds all of them: no layer syncs, the batch step
pipelines) beside mlx-lm's `BatchGenerator` on the model loaded whole, B = 1, 2, 4, 8:
rounds alternate the two (the order of B and of the two flips each round) and the
figures are medians over the rounds, so the load of a shared machine falls on both
alike. Aggregate decode tok/s over the steady window (every step decodes all B rows).
Also the batch-invariant mode (`BatchRunner(invariant=True)`: every row in the B = 1
shapes) with `--invariant-mode`.

`--bg-streamed` adds a third side: `BatchGenerator` over the engine's own model (its
frozen streamed layers, experts in the cache's slots). Against the engine's batch only the
loop around the model differs; against `BatchGenerator` over mlx-lm's model only the layer
and where its weights sit. So a gap on the GPU is placed: in the loop (host work per step)
or in the layer (the device's work). `--host-split` times each side's forward calls
(graph building, `TimedModel`) and reads the engine's build/sync split (BatchFigures):
JSON `summary[].host_ms_per_step[kind]` = {step, model, build, queue, sync, deliver,
to_host, leave, other} ms per step of the window (on a GPU, a host-bound pipelined step:
build + queue ~ step, sync ~ 0; a device-bound one: sync large; on the CPU `queue` is the
compute itself; `deliver`: the tokens handed to the rows after the sync, `to_host` of it
reading them, `leave` of it rows that ended leaving (the window's last step); `other`: the
step outside those four; the H100 of 2026-12-07 put 8-10 ms of a 31 ms B = 8 step there, 2
at B = 4, 0.3 at B = 1 and 2: this split places it).
`--bg-detok` puts each `BatchGenerator` row's token through its own streaming
detokenizer every step, as mlx_lm.server's loop does and the engine's batch always does
(JSON `bg_detokenizes`): the loops then do the same work a server needs.

`--invariance` then runs every batched row alone (ours: `Runner.generate`; mlx-lm's:
`stream_generate`) and records, for each row that differs, the top-2 log-prob margin at
its first differing token (bench/batch_compare.py).

CPU (this VM; a small qwen3_moe built into OUT/model, or `--model` any checkpoint, e.g.
the trained demo `~/.cache/ssdmoe/demo` ...):

    python scripts/batch_vs_mlx.py --out /tmp/bvm --rounds 7 --invariance

H200: scripts/gpu_batch.sh (the Qwen3-30B-A3B shape at /root/q30).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def build(out: Path, hidden: int, layers: int) -> Path:
    """A small qwen3_moe (random weights) with 32 experts, K = 4, written once."""
    if (out / "config.json").exists():
        return out
    from ssdmoe_tui.models.demo import write_checkpoint
    from tests.helpers.checkpoints import QWEN3_MOE

    cfg = dict(QWEN3_MOE, num_hidden_layers=layers, num_experts=32, num_experts_per_tok=4,
               hidden_size=hidden, head_dim=32, num_attention_heads=max(hidden // 64, 2),
               num_key_value_heads=2, moe_intermediate_size=hidden // 2,
               vocab_size=2048)  # fmt: skip
    return write_checkpoint(cfg, out, seed=3, group_size=32, max_shard_bytes=256 << 20)


# --host-split's figures, ms per step (BatchRun.host_split)
SPLIT_PARTS = ("step", "model", "build", "queue", "sync", "deliver", "to_host", "leave",
               "other")  # fmt: skip


def median(xs: list[float]) -> float | None:
    xs = [x for x in xs if x is not None]
    return round(statistics.median(xs), 3) if xs else None


def _detokenizer(wrapper) -> dict:  # noqa: ANN001 - mlx-lm's TokenizerWrapper
    """The tokenizer's and the streaming detokenizer's classes, and transformers' version
    (a slow Python tokenizer costs each row's step on the host)."""
    import transformers

    return {
        "tokenizer": type(wrapper._tokenizer).__name__,
        "detokenizer": type(wrapper.detokenizer).__name__,
        "transformers": transformers.__version__,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--model", type=Path, default=None, help="checkpoint (default: build one)")
    ap.add_argument("--demo", action="store_true", help="the trained demo model")
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--batch", default="1,2,4,8")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--prompt-tokens", type=int, default=32)
    ap.add_argument("--decode-tokens", type=int, default=32)
    ap.add_argument("--expert-cache", default="64G", help="the engine's (default: every expert)")
    ap.add_argument("--k", type=int, default=None, help="K (default: the trained K)")
    ap.add_argument("--dtype", default=None)
    ap.add_argument("--invariance", action="store_true", help="rows alone: first-flip margins")
    ap.add_argument(
        "--bg-detok",
        action="store_true",
        help="BatchGenerator's rows detokenized every step too, as mlx_lm.server does",
    )
    ap.add_argument("--invariant-mode", action="store_true", help="also BatchRunner(invariant)")
    ap.add_argument(
        "--invariant-batch", default=None, help="B's of the invariant mode (default: all > 1)"
    )
    ap.add_argument("--no-speed", action="store_true", help="invariance only")
    ap.add_argument(
        "--bg-streamed", action="store_true", help="also BatchGenerator over the engine's model"
    )
    ap.add_argument("--host-split", action="store_true", help="time the forward calls per step")
    ap.add_argument(
        "--deadline-s",
        type=float,
        default=1e9,
        help="stop starting rounds this long after the warm-up",
    )
    ap.add_argument("--tag", default="", help="a label in the JSON (e.g. the routing)")
    args = ap.parse_args()
    t_begin = time.perf_counter()

    import mlx.core as mx

    from ssdmoe_tui.bench.batch import row_prompts
    from ssdmoe_tui.bench.batch_compare import (
        ResidentBatch,
        TimedModel,
        engine_alone,
        engine_batch,
        invariance_rows,
    )
    from ssdmoe_tui.bench.bench import fixed_prompt
    from ssdmoe_tui.engine.model.loader import load_streamed
    from ssdmoe_tui.engine.run.batch import host_read_way
    from ssdmoe_tui.engine.run.runner import Runner

    args.out.mkdir(parents=True, exist_ok=True)
    if args.demo:
        from ssdmoe_tui.models.demo import ensure_demo_model

        model = ensure_demo_model()
    else:
        model = args.model or build(args.out / "model", args.hidden, args.layers)
    bs = [int(x) for x in args.batch.split(",")]
    inv_bs = (
        [b for b in bs if b > 1]
        if args.invariant_batch is None
        else [int(x) for x in args.invariant_batch.split(",")]
    )
    sm = load_streamed(model, expert_cache=args.expert_cache, dtype=args.dtype)
    sm.tokenizer.eos_token_ids = set()  # exactly N tokens a row
    runner = Runner(sm, k=args.k)
    k = runner.k
    resident = ResidentBatch(model, sm.dtype, k)
    if args.host_split:  # both sides' forward calls timed alike (~1 us a call)
        sm.model = TimedModel(sm.model)
        resident.model = TimedModel(resident.model)
    # BatchGenerator over the engine's own model (frozen layers after the warm-up)
    streamed = ResidentBatch.over(sm.model, sm.tokenizer) if args.bg_streamed else None
    base = fixed_prompt(sm.tokenizer, args.prompt_tokens)[: args.prompt_tokens]
    n = args.decode_tokens
    print(f"model {model}: {sm.cache.capacity} slots, all frozen after warm-up: ", end="")
    # warm-up (kernels compiled, every layer's experts read, frozen), not timed
    for b in bs:
        engine_batch(runner, row_prompts(base, b), min(n, 8))
        if args.invariant_mode and b in inv_bs:
            engine_batch(runner, row_prompts(base, b), min(n, 8), invariant=True)
        resident.batch(row_prompts(base, b), min(n, 8))
    if streamed is not None:  # after the engine's warm-up: every layer frozen by now
        for b in bs:
            streamed.batch(row_prompts(base, b), min(n, 8))
    print(sm.cache.all_frozen, flush=True)
    # the rounds' budget counts from here: on a fresh MLX-CUDA machine the warm-up above
    # compiles for minutes (the H200 on 2026-12-05: 188 s, and a budget counted from the
    # start ran 0 rounds); the step's own timeout bounds the whole call
    t_begin = time.perf_counter()
    result: dict = {
        "model": str(model),
        "tag": args.tag,
        "k": k,
        "dtype": str(sm.dtype).removeprefix("mlx.core."),
        "device": str(mx.default_device()),
        "expert_cache": args.expert_cache,
        "all_frozen": sm.cache.all_frozen,
        # the engine detokenizes each row every step (BatchGenerator here does not): which
        # tokenizer and streaming detokenizer that is, on this machine's transformers
        "detokenizer": _detokenizer(sm.tokenizer),
        "bg_detokenizes": args.bg_detok,
        # how the engine's loop reads each step's tokens ($SSDMOE_BATCH_HOST_COPY)
        "host_read": host_read_way(),
        "prompt_tokens": len(base),
        "decode_tokens": n,
        "rounds": [],
    }
    out_json = args.out / f"batch_vs_mlx{('-' + args.tag) if args.tag else ''}.json"

    def save() -> None:
        tmp = out_json.with_suffix(".tmp")
        tmp.write_text(json.dumps(result, indent=1))
        tmp.replace(out_json)

    kinds = (["engine", "mlx"] + (["invariant"] if args.invariant_mode else [])
             + (["mlx_streamed"] if streamed is not None else []))  # fmt: skip
    tokens_equal: dict[int, bool] = {}
    for rnd in range(0 if args.no_speed else args.rounds):
        if time.perf_counter() - t_begin > args.deadline_s:
            print(f"deadline: {rnd} rounds", flush=True)
            break
        order = bs if rnd % 2 == 0 else bs[::-1]
        row: dict = {}
        for b in order:
            ps = row_prompts(base, b)
            for kind in kinds if (rnd + b) % 2 == 0 else kinds[::-1]:
                if kind == "invariant" and b not in inv_bs:
                    continue
                if kind == "mlx":
                    r = resident.batch(ps, n, detok=args.bg_detok)
                elif kind == "mlx_streamed":
                    r = streamed.batch(ps, n, detok=args.bg_detok)
                else:
                    r = engine_batch(runner, ps, n, invariant=kind == "invariant")
                row[f"{kind}:{b}"] = r.aggregate_tok_s
                row[f"cpu_ms/{kind}:{b}"] = r.cpu_ms_per_token
                if args.host_split:
                    row[f"split/{kind}:{b}"] = r.host_split()
                if kind == "engine":
                    eng_tokens = r.tokens
                elif kind == "mlx" and rnd == 0:
                    tokens_equal[b] = None  # set below when both exist
                    mlx_tokens = r.tokens
            if rnd == 0:
                tokens_equal[b] = eng_tokens == mlx_tokens
        result["rounds"].append(row)
        line = "  ".join(
            f"{key} {v:.1f}"
            for key, v in sorted(row.items())
            if v and not key.startswith(("cpu", "split"))
        )
        print(f"round {rnd}: {line}", flush=True)
        save()

    summary = []
    for b in bs:
        med = {kind: median([r.get(f"{kind}:{b}") for r in result["rounds"]]) for kind in kinds}
        cpu = {
            kind: median([r.get(f"cpu_ms/{kind}:{b}") for r in result["rounds"]]) for kind in kinds
        }

        def ratios(a: str, z: str, b: int = b) -> list[float]:
            return [r[f"{a}:{b}"] / r[f"{z}:{b}"] for r in result["rounds"]
                    if r.get(f"{a}:{b}") and r.get(f"{z}:{b}")]  # fmt: skip

        split = None
        if args.host_split:
            split = {
                kind: {
                    part: median(
                        [(r.get(f"split/{kind}:{b}") or {}).get(part) for r in result["rounds"]]
                    )
                    for part in SPLIT_PARTS
                }
                for kind in kinds
            }
        summary.append({
            "batch": b,
            "engine_tok_s": med["engine"],
            "mlx_batch_generator_tok_s": med["mlx"],
            "engine_vs_mlx": median(ratios("engine", "mlx")),
            "invariant_tok_s": med.get("invariant"),
            "cpu_ms_per_token": cpu,  # the process's CPU time (steadier on a loaded CPU)
            "mlx_streamed_tok_s": med.get("mlx_streamed"),  # --bg-streamed
            "engine_vs_mlx_streamed": median(ratios("engine", "mlx_streamed")),
            "mlx_streamed_vs_mlx": median(ratios("mlx_streamed", "mlx")),
            # --host-split: {kind: {step, model, build, queue, sync, deliver, to_host, leave,
            # other}}
            "host_ms_per_step": split,
            "tokens_equal_mlx": tokens_equal.get(b),
        })  # fmt: skip
    one = {s["batch"]: s for s in summary}.get(1)
    for s in summary:
        for key, name in (("engine_tok_s", "engine"), ("mlx_batch_generator_tok_s", "mlx"),
                          ("invariant_tok_s", "invariant")):  # fmt: skip
            ref = one and one.get("engine_tok_s" if name == "invariant" else key)
            s[f"{name}_vs_b1"] = round(s[key] / ref, 3) if s.get(key) and ref else None
    result["summary"] = summary
    save()
    if summary and result["rounds"]:
        print(f"\nmedians of {len(result['rounds'])} rounds, K={k}, {result['dtype']}, "
              f"{len(base)}-token prompts, {n} tokens a row, engine cache {args.expert_cache}")  # fmt: skip
        print("| B | engine tok/s | BatchGenerator tok/s | engine / BG | engine vs B=1 | "
              "BG vs B=1 | invariant tok/s | invariant vs engine B=1 | tokens = BG | "
              "CPU ms/token engine / BG |")  # fmt: skip
        print("|---|---|---|---|---|---|---|---|---|---|")
        for s in summary:
            print(f"| {s['batch']} | {s['engine_tok_s']} | {s['mlx_batch_generator_tok_s']} | "
                  f"{s['engine_vs_mlx']} | {s['engine_vs_b1']} | {s['mlx_vs_b1']} | "
                  f"{s['invariant_tok_s']} | {s['invariant_vs_b1']} | "
                  f"{s['tokens_equal_mlx']} | {s['cpu_ms_per_token']['engine']} / "
                  f"{s['cpu_ms_per_token']['mlx']} |")  # fmt: skip
        if streamed is not None:
            print("\n| B | BG over the engine's model tok/s | engine / it | it / BG | "
                  "CPU ms/token it |\n|---|---|---|---|---|")  # fmt: skip
            for s in summary:
                print(f"| {s['batch']} | {s['mlx_streamed_tok_s']} | "
                      f"{s['engine_vs_mlx_streamed']} | {s['mlx_streamed_vs_mlx']} | "
                      f"{s['cpu_ms_per_token'].get('mlx_streamed')} |")  # fmt: skip
        if args.host_split:
            print("\nms per step (window medians): step / in the model's forward call "
                  "/ build / queue / sync wait / deliver (to host, leave) / other (BatchGenerator: "
                  "build = its forward call, no deliver: other holds its tokens' read)")  # fmt: skip
            for s in summary:
                cells = []
                for kind, v in (s["host_ms_per_step"] or {}).items():
                    extra = (f" / {v['build']} / {v['queue']} / {v['sync']} / {v['deliver']}"
                             f" ({v['to_host']}, {v['leave']}) / {v['other']}"
                             if v.get("build") is not None else "")  # fmt: skip
                    cells.append(f"{kind} {v['step']} / {v['model']}{extra}")
                print(f"B={s['batch']}: " + "; ".join(cells))

    if args.invariance:
        # one set of rows for every B (B's rows: the first B), so each runs alone once
        inv: dict = {}
        ps_max = row_prompts(base, max(bs))
        alone_ours = [engine_alone(runner, p, n) for p in ps_max]
        alone_mlx = [resident.alone(p, n) for p in ps_max]
        for b in bs:
            if time.perf_counter() - t_begin > args.deadline_s + 120:
                print(f"deadline: invariance stops before B={b}", flush=True)
                break
            ps = ps_max[:b]
            ours = engine_batch(runner, ps, n, record=True)
            theirs = resident.batch(ps, n, record=True)
            alone_b, mlx_b = alone_ours[:b], alone_mlx[:b]
            inv[str(b)] = {
                "engine": invariance_rows(alone_b, ours),
                "mlx_batch_generator": invariance_rows(mlx_b, theirs),
                "engine_alone_equals_stream_generate": sum(  # (exactness: every row)
                    a[0] == m[0] for a, m in zip(alone_b, mlx_b, strict=True)
                ),
            }
            if args.invariant_mode and b in inv_bs:
                mode = engine_batch(runner, ps, n, invariant=True, record=True)
                inv[str(b)]["engine_invariant_mode"] = invariance_rows(alone_b, mode)
            result["invariance"] = inv  # kept as each B finishes (a timeout keeps what ran)
            save()
            e, m = inv[str(b)]["engine"], inv[str(b)]["mlx_batch_generator"]
            print(f"B={b}: rows equal alone: engine {e['rows_equal_alone']}/{b}, "
                  f"BatchGenerator {m['rows_equal_alone']}/{b}"
                  + "".join(f"; engine row {f['row']} flips at {f['token']} (margin alone "
                            f"{f['alone_margin']}, batched {f['batched_margin']})"
                            for f in e["first_flips"])
                  + "".join(f"; BG row {f['row']} flips at {f['token']} (margin alone "
                            f"{f['alone_margin']}, batched {f['batched_margin']})"
                            for f in m["first_flips"]), flush=True)  # fmt: skip
        # the scale of a flip's margin: bf16's spacing at the size of the logits
        top = [
            float(mx.abs(resident.model(mx.array(p)[None])[0, -1].astype(mx.float32)).max())
            for p in ps_max
        ]
        scale = max(top)
        inv["logit_max_abs"] = round(scale, 4)
        inv["bf16_spacing_at_logit_max"] = 2.0 ** (math.floor(math.log2(scale)) - 7)
        result["invariance"] = inv
        save()
    result["wall_s"] = round(time.perf_counter() - t_begin, 1)
    save()
    print(f"wrote {out_json} ({result['wall_s']} s)")
    runner.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())

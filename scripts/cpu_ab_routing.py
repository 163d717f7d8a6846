"""Streamed (trace-routed) against resident mlx-lm decode, alternating in one process.

On a shared machine the load changes between a bench's configurations and its resident
baseline minutes later; alternating short rounds of each in one process and taking the
median of the per-round ratios is steadier (docs/benchmarks.md, "Real routing", CPU):

    python scripts/cpu_ab_routing.py --model DIR --routing-trace TRACE \\
        --expert-cache 430M --rounds 5 --tokens 16
"""

from __future__ import annotations

import argparse
import json
import statistics
import time


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    ap.add_argument("--model", required=True)
    ap.add_argument("--routing-trace", required=True)
    ap.add_argument("--expert-cache", default="430M")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--tokens", type=int, default=16)
    args = ap.parse_args()

    import mlx.core as mx
    from mlx_lm import load, stream_generate

    from ssdmoe_tui.engine.model.loader import cast_model, load_streamed, set_model_k
    from ssdmoe_tui.engine.policy.trace_routing import attach
    from ssdmoe_tui.engine.run.runner import Runner

    sm = load_streamed(args.model, expert_cache=args.expert_cache)
    routing = attach(sm, args.routing_trace)
    sm.tokenizer.eos_token_ids = set()
    runner = Runner(sm, k=routing.k)
    model, tok = load(args.model)
    cast_model(model, sm.dtype)  # same activation dtype as the engine
    set_model_k(model, routing.k)
    prompt = list(range(100, 132))
    rows = []
    for r in range(args.rounds):
        t0 = time.perf_counter()
        res_tps = list(stream_generate(model, tok, prompt, max_tokens=args.tokens))[
            -1
        ].generation_tps
        st = runner.generate(prompt, max_tokens=args.tokens).stats
        rows.append({"round": r, "resident_tok_s": round(res_tps, 3),
                     "streamed_tok_s": round(st.decode_tok_s, 3),
                     "ratio": round(st.decode_tok_s / res_tps, 3),
                     "streamed_hit": round(st.hit_rate, 3),
                     "seconds": round(time.perf_counter() - t0, 1)})  # fmt: skip
        print(json.dumps(rows[-1]), flush=True)
    ratios = [x["ratio"] for x in rows]
    print(json.dumps({"median_ratio": statistics.median(ratios), "ratios": ratios,
                      "expert_cache_slots": sm.cache.capacity, "routing": routing.label,
                      "k": routing.k, "device": str(mx.default_device())}))  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

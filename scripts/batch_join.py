"""A long prompt joining rows that decode: how long it stalls them (issue 43, item 2).

B rows (the bench's prompt rotated by i/B) decode greedily; once steady, a JOIN-token
prompt joins them. Measured per run (bench/batch.py `join_probe`): the longest gap between
two tokens of a decoding row while the joiner prefills, the rows' median gap before it
joined, the longest stall (one chunk, or the joiner's first token, between two decode
steps) and when the joiner's first token came. Two ways of chunking the join, in
alternating rounds on one engine (a loaded machine's load falls on both alike):

- `tokens`: chunks of at most 128 tokens (`join_budget_s=None`, what main did before);
- `budget`: chunks sized to JOIN_BUDGET_S of measured time per step (the default now);
- `budget-S` for each S of `--budgets` (seconds): the same at another budget (what a
  budget leaves of the longest stall, which also holds the chunks' noise).

CPU (the trained demo, every expert held; `--expert-cache 4M` streams part of it):

    python scripts/batch_join.py --demo --rounds 3 --out /tmp/bj.json
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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    ap.add_argument("--model", type=Path, default=None)
    ap.add_argument("--demo", action="store_true", help="the trained demo model")
    ap.add_argument("--expert-cache", default="64G")
    ap.add_argument("--batch", type=int, default=4, help="rows decoding when it joins")
    ap.add_argument("--prompt-tokens", type=int, default=32)
    ap.add_argument("--join-tokens", type=int, default=1024)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", type=Path, default=None, help="JSON (every run and the medians)")
    ap.add_argument("--budgets", default="", help="more budgets to compare, e.g. 0.2,0.15")
    ap.add_argument("--no-tokens", action="store_true", help="leave the 128-token chunks out")
    args = ap.parse_args()
    if (args.model is None) == (not args.demo):
        ap.error("give --model DIR or --demo")

    from ssdmoe_tui.engine.run.join_chunks import JOIN_BUDGET_S

    kinds: dict[str, float | None] = {"tokens": None, "budget": JOIN_BUDGET_S}
    if args.no_tokens:
        del kinds["tokens"]
    for b in filter(None, args.budgets.split(",")):
        try:
            v = float(b)
        except ValueError:
            v = math.nan
        if not 0 < v < math.inf:
            ap.error(f"--budgets: {b!r} is not a positive number of seconds")
        kinds[f"budget-{v:g}"] = v

    from ssdmoe_tui.bench.batch import join_probe, row_prompts
    from ssdmoe_tui.bench.bench import fixed_prompt
    from ssdmoe_tui.engine.model.loader import load_streamed
    from ssdmoe_tui.engine.run.runner import Runner

    if args.demo:
        from ssdmoe_tui.models.demo import ensure_demo_model

        model = ensure_demo_model()
    else:
        model = args.model
    sm = load_streamed(model, expert_cache=args.expert_cache)
    sm.tokenizer.eos_token_ids = set()
    runner = Runner(sm)
    rows = row_prompts(fixed_prompt(sm.tokenizer, args.prompt_tokens), args.batch)
    # another text than the rows' (so its experts are not theirs): the prompt reversed
    join = fixed_prompt(sm.tokenizer, args.join_tokens)[::-1]
    offsets = [0] * args.batch
    join_probe(runner, rows, join[:64], offsets)  # warm-up, not kept
    runs: dict[str, list[dict]] = {k: [] for k in kinds}
    t0 = time.perf_counter()
    for rnd in range(args.rounds):
        for kind in list(kinds) if rnd % 2 == 0 else list(kinds)[::-1]:
            r = join_probe(runner, rows, join, offsets, join_budget_s=kinds[kind])
            runs[kind].append(r)
            print(f"round {rnd} {kind}: longest gap {r['max_token_gap_s']} s (median before "
                  f"{r['median_token_gap_before_s']} s), stall {r['max_join_stall_s']} s, "
                  f"{r['chunks']} chunks, first token after {r['join_first_token_s']} s",
                  flush=True)  # fmt: skip
    summary = {
        kind: {
            key: round(statistics.median(r[key] for r in rs), 4)
            for key in (
                "max_token_gap_s",
                "median_token_gap_before_s",
                "max_join_stall_s",
                "join_first_token_s",
                "chunks",
            )  # fmt: skip
        }
        for kind, rs in runs.items()
    }
    print(json.dumps(summary, indent=1))
    if args.out:
        args.out.write_text(json.dumps({
            "model": str(model), "expert_cache": args.expert_cache, "batch": args.batch,
            "prompt_tokens": args.prompt_tokens, "join_tokens": len(join),
            "rounds": args.rounds, "wall_s": round(time.perf_counter() - t0, 1),
            "runs": runs, "summary": summary,
        }, indent=1))  # fmt: skip
    runner.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())

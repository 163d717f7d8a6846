"""Paired engine timing of expert-cache policies (docs/cache-policy.md, "Real routing:
the trained demo"): one engine per policy, loaded once in this process, each decoding
300 trace-routed tokens in turn, rotating order, 8 counted rounds after one warm-up.

On a shared machine the bench's fresh-engine runs spread 2x; pairing the policies round
by round and taking medians of the per-round ratios (wall and process CPU time) is what
can still rank them. Usage: python scripts/policy_pairs.py TRACE BUDGET [POLICY,...]
(e.g. a demo trace and 540K); prints JSON.
"""

from __future__ import annotations

import json
import statistics as st
import sys
import time

from ssdmoe_tui.engine.run.open import open_engine
from ssdmoe_tui.engine.run.runner import Snapshot, TokenEvent
from ssdmoe_tui.engine.run.sampling import greedy
from ssdmoe_tui.options import EngineOptions

STEPS, ROUNDS = 300, 9  # the first round is not counted


def _one(runner, prompt: list[int]) -> tuple[float, float, float]:
    """(wall ms, CPU ms) per decode step and the decode hit rate of one run."""
    marks = {}
    for ev in runner.stream(prompt, max_tokens=STEPS + 1, sampler=greedy()):
        if isinstance(ev, TokenEvent) and ev.stats.generated_tokens in (1, STEPS + 1):
            marks[ev.stats.generated_tokens] = (
                time.perf_counter(), time.process_time(), Snapshot.take(runner.sm)
            )  # fmt: skip
    (w0, c0, s0), (w1, c1, s1) = marks[1], marks[STEPS + 1]
    return (w1 - w0) / STEPS * 1e3, (c1 - c0) / STEPS * 1e3, (s1 - s0).hit_rate


def main(trace: str, budget: str, policies: list[str]) -> dict:
    runners = {
        p: open_engine(EngineOptions(expert_cache=budget, policy=p, routing_trace=trace))
        for p in policies
    }
    for r in runners.values():
        r.sm.tokenizer.eos_token_ids = set()  # exactly STEPS tokens, as the bench
    prompt = list(range(10, 42))
    res: dict[str, list[tuple[float, float, float]]] = {p: [] for p in policies}
    for rnd in range(ROUNDS):
        n = rnd % len(policies)
        for p in policies[n:] + policies[:n]:
            one = _one(runners[p], prompt)
            if rnd:
                res[p].append(one)
    base = res[policies[0]]
    out = {}
    for p, rows in res.items():
        out[p] = {
            "slots": runners[p].sm.cache.capacity,
            "hit_rate_median": round(st.median(x[2] for x in rows), 4),
            "wall_ms_median": round(st.median(x[0] for x in rows), 2),
            "cpu_ms_median": round(st.median(x[1] for x in rows), 2),
            "wall_vs_first": round(
                st.median(a[0] / b[0] for a, b in zip(rows, base, strict=True)), 3
            ),
            "cpu_vs_first": round(
                st.median(a[1] / b[1] for a, b in zip(rows, base, strict=True)), 3
            ),
        }
    return out


if __name__ == "__main__":
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    pols = (sys.argv[3] if len(sys.argv) > 3 else "cycle-lfu,lru,reuse,predict").split(",")
    print(json.dumps(main(sys.argv[1], sys.argv[2], pols), indent=1))

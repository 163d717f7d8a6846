"""Run under `mlx.launch` by tests/test_distributed.py: greedy tokens of several
checkpoints on an expert-parallel engine, printed by rank 0 as one JSON object.

usage: python -m tests.distributed_worker PROMPT_IDS N_TOKENS EXPERT_CACHE MODEL...
"""

from __future__ import annotations

import json
import sys


def main(argv: list[str]) -> int:
    from mlx_lm.sample_utils import make_sampler

    from ssdmoe_tui.engine.distributed import start
    from ssdmoe_tui.engine.loader import load_streamed
    from ssdmoe_tui.engine.runner import Runner

    prompt = [int(x) for x in argv[0].split(",")]
    n, budget, models = int(argv[1]), argv[2], argv[3:]
    dist = start()
    out = {}
    with dist.guard():
        for path in models:
            sm = load_streamed(path, expert_cache=budget, distributed=dist)
            try:
                sm.tokenizer.eos_token_ids = set()  # exactly n tokens
                res = Runner(sm).generate(
                    prompt, max_tokens=n, sampler=dist.wrap_sampler(make_sampler(0.0))
                )
                out[path] = res.tokens
            finally:
                sm.close()
    if dist.is_root:
        print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

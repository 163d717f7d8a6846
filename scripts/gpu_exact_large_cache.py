"""Exactness with an expert cache larger than 2 GiB per component, against resident mlx-lm.

Run on the MLX-CUDA machine (issue 13, part 0; docs/benchmarks.md). MLX-CUDA 0.32.4's
`gather_qmm` returns wrong results for experts that start 2 GiB or more into one array,
so the engine splits each component's slots into banks under 2 GiB. This script
generates greedily with plain resident mlx-lm, then with the streamed engine at each
expert-cache size given, and reports whether the tokens are identical (and where they
first differ), with the bank layout used:

    python3 scripts/gpu_exact_large_cache.py --model /root/q35 \\
        --configs 8G:host,12G:managed,all --tokens 24 --out /root/res/exact.jsonl

A config is SIZE[:PLACEMENT]; `all` holds every expert.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time
from pathlib import Path

PROMPT = "Explain how a mixture-of-experts model decides which experts handle each token."


def _emit(out, rec: dict) -> None:
    line = json.dumps(rec)
    print(line, flush=True)
    if out is not None:
        out.write(line + "\n")
        out.flush()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    ap.add_argument("--model", required=True)
    ap.add_argument("--configs", default="8G:host,12G:managed,all")
    ap.add_argument("--tokens", type=int, default=24)
    ap.add_argument("--out", default=None)
    ap.add_argument(
        "--reference",
        default=None,
        help="a JSON line with the resident run's tokens from an earlier run of this script "
        "on the same checkpoint (skips reloading the model resident)",
    )
    args = ap.parse_args()

    import mlx.core as mx
    from mlx_lm import load, stream_generate

    from ssdmoe_tui.engine.model.loader import load_streamed
    from ssdmoe_tui.engine.run.runner import Runner

    out = open(args.out, "a") if args.out else None  # noqa: SIM115
    path = Path(args.model)
    t0 = time.perf_counter()
    msgs = [{"role": "user", "content": PROMPT}]
    if args.reference:
        from mlx_lm.utils import load_tokenizer

        tok = load_tokenizer(path)
        ref = json.loads(Path(args.reference).read_text().splitlines()[0])["tokens"]
        ref = ref[: args.tokens]
        _emit(out, {"run": "resident", "from": args.reference, "tokens": ref})
    else:
        model, tok = load(str(path))
    prompt = list(tok.apply_chat_template(msgs, add_generation_prompt=True))
    if not args.reference:
        ref = [r.token for r in stream_generate(model, tok, prompt, max_tokens=args.tokens)]
        _emit(out, {"run": "resident", "device": str(mx.default_device()), "tokens": ref,
                    "seconds": round(time.perf_counter() - t0, 1)})  # fmt: skip
        del model
        gc.collect()
        mx.clear_cache()

    failed = 0
    for cfg in args.configs.split(","):
        size, _, placement = cfg.partition(":")
        if placement:
            os.environ["SSDMOE_SLOT_PLACEMENT"] = placement
        else:
            os.environ.pop("SSDMOE_SLOT_PLACEMENT", None)
        t0 = time.perf_counter()
        sm = load_streamed(path, expert_cache="1T" if size == "all" else size)
        res = Runner(sm).generate(prompt, max_tokens=args.tokens)
        cache = sm.cache
        first_diff = next(
            (i for i, (a, b) in enumerate(zip(res.tokens, ref, strict=False)) if a != b),
            None if len(res.tokens) == len(ref) else min(len(res.tokens), len(ref)),
        )
        same = first_diff is None
        failed += not same
        largest = max(int(a.nbytes) for b in cache.banks for a in b.values())
        per_slot = max(int(a.nbytes) // a.shape[0] for a in cache.banks[0].values())
        _emit(out, {
            "run": "streamed", "expert_cache": size, "placement": cache.placement.placement,
            "slots": cache.capacity, "slot_bytes": cache.slot_bytes,
            "budget_gib": round(cache.budget_bytes / 2**30, 2),
            "largest_component_gib_unbanked": round(per_slot * cache.capacity / 2**30, 2),
            "banks": cache.num_banks, "bank_slots": cache.bank_slots,
            "largest_bank_array_bytes": largest, "same_tokens": same, "first_diff": first_diff,
            "tokens": res.tokens, "hit_rate": round(res.stats.hit_rate, 4),
            "decode_tok_s": round(res.stats.decode_tok_s, 2),
            "seconds": round(time.perf_counter() - t0, 1),
        })  # fmt: skip
        sm.close()
        del sm, res, cache
        gc.collect()
        mx.clear_cache()
    if out is not None:
        out.close()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

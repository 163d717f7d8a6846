"""`ssdmoe eval`: what each K costs in quality on a text (perplexity, agreement, router mass)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ssdmoe_tui.commands.common import add_experts_argument


def register(sub: argparse._SubParsersAction) -> None:
    from ssdmoe_tui.commands.bench import _int_list

    p = sub.add_parser(
        "eval",
        help="quality at each K on a text: perplexity, agreement with the trained K, router mass",
        description="Teacher-force a text through the streamed model at the trained K and at "
        "each K given: perplexity, the share of positions whose top next token matches the "
        "trained K's, the KL divergence from it, and the router probability mass kept. "
        "Runs on any checkpoint; the numbers only mean something on a trained model. "
        "`ssdmoe bench --quality FILE` records the same beside the speed of each K.",
    )
    p.add_argument("--model", default="", help="model folder or Hub repo id (default: the demo)")
    p.add_argument("--text", required=True, help="UTF-8 text file (tokenized raw, no template)")
    p.add_argument(
        "--k",
        type=_int_list,
        default=None,
        help="K values, e.g. 8,4,2 (default: trained K, /2, /4)",
    )
    p.add_argument("--max-tokens", type=int, default=512, help="use the text's first N tokens")
    p.add_argument("--chunk", type=int, default=128, help="positions per forward pass")
    p.add_argument("--expert-cache", default="auto", help="expert cache budget: auto, 512M, 4G")
    p.add_argument(
        "--dtype", default=None, choices=["float32", "bfloat16", "float16"],
        help="activation dtype (default: float32 on CPU, bfloat16 on GPU)",
    )  # fmt: skip
    add_experts_argument(p)
    p.add_argument("--json", dest="json_out", default=None, help="write the result as JSON here")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ssdmoe_tui.atomic import atomic_write_text
    from ssdmoe_tui.bench import system
    from ssdmoe_tui.bench.bench import default_ks
    from ssdmoe_tui.bench.quality import (
        RANDOM_WEIGHTS_NOTE,
        measure_quality,
        quality_legend,
        quality_table,
        text_tokens,
    )
    from ssdmoe_tui.commands.common import resolve_model_path
    from ssdmoe_tui.engine.loader import load_streamed
    from ssdmoe_tui.errors import BadValueError

    if args.max_tokens < 2:
        raise BadValueError(f"--max-tokens must be >= 2, got {args.max_tokens}")
    if args.chunk < 1:
        raise BadValueError(f"--chunk must be >= 1, got {args.chunk}")

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    path = resolve_model_path(args.model)
    sm = load_streamed(path, expert_cache=args.expert_cache, dtype=args.dtype, experts=args.experts)
    try:
        tokens = text_tokens(sm.tokenizer, Path(args.text), args.max_tokens)
        ks = args.k or default_ks(sm.trained_k, sm.index.num_experts)
        log(f"eval: {len(tokens)} tokens of {args.text}, K {', '.join(map(str, ks))}")
        by_k = measure_quality(sm, tokens, ks, chunk=args.chunk, log=log)
        result = {
            "conditions": {
                "model": str(Path(path).resolve()),
                "model_type": sm.model_type,
                "trained_k": sm.trained_k,
                "text": str(args.text),
                "text_tokens": len(tokens),
                "chunk": args.chunk,
                "dtype": str(sm.dtype).removeprefix("mlx.core."),
                "versions": system.versions(),
                "device": system.device_description(),
                "date": system.utc_now(),
            },
            "note": RANDOM_WEIGHTS_NOTE,
            "by_k": {str(k): v for k, v in by_k.items()},
        }
    finally:
        sm.close()
    if args.json_out:
        atomic_write_text(Path(args.json_out), json.dumps(result, indent=1) + "\n")
        log(f"JSON written to {args.json_out}")
    print(
        f"model: {path} ({sm.model_type}, trained K={sm.trained_k}) | text: {args.text}, "
        f"{len(tokens)} tokens, teacher-forced"
    )
    print(quality_table(by_k, sm.trained_k))
    print(quality_legend(sm.trained_k))
    return 0

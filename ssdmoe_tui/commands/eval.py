"""`ssdmoe eval`: what each K costs in quality on a text (perplexity, agreement, router mass)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ssdmoe_tui.commands.common import (
    add_dtype_argument,
    add_expert_cache_argument,
    add_experts_argument,
    add_k_argument,
    add_model_argument,
    add_reader_arguments,
    arg_type,
    engine_options,
)
from ssdmoe_tui.options import parse_positive


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "eval",
        help="quality at each K on a text: perplexity, agreement with the trained K, router mass",
        description="Teacher-force a text through the streamed model at the trained K and at "
        "each K given: perplexity, the share of positions whose top next token matches the "
        "trained K's, the KL divergence from it, and the router probability mass kept. "
        "Runs on any checkpoint; the numbers only mean something on a trained model. "
        "`ssdmoe bench --quality FILE` records the same beside the speed of each K.",
    )
    add_model_argument(p)
    p.add_argument(
        "--text",
        default=None,
        help="UTF-8 text file (tokenized raw, no template; default: the GNU GPL v3 text that "
        "ships with ssdmoe, English prose the demo never saw)",
    )
    add_k_argument(p, many=True)
    p.add_argument(
        "--max-tokens", type=arg_type(parse_positive, "--max-tokens"), default=512,
        help="use the text's first N tokens (default 512)",
    )  # fmt: skip
    p.add_argument(
        "--chunk", type=arg_type(parse_positive, "--chunk"), default=128,
        help="positions per forward pass (default 128)",
    )  # fmt: skip
    add_expert_cache_argument(p)
    add_dtype_argument(p)
    add_reader_arguments(p)
    add_experts_argument(p)
    p.add_argument("--json", dest="json_out", default=None, help="write the result as JSON here")
    p.set_defaults(func=run)


#: The default text: the GPL v3 (verbatim copies may be distributed), held out of the
#: demo's training (scripts/train_demo.py), so the demo's figures on it mean something.
DEFAULT_TEXT = Path(__file__).resolve().parent.parent / "bench" / "texts" / "gpl3.txt"
DEFAULT_TEXT_NAME = "the GNU GPL v3 text, English prose the demo model never saw"


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
    from ssdmoe_tui.engine.run.open import open_engine
    from ssdmoe_tui.errors import BadValueError
    from ssdmoe_tui.models.resolve import cli_progress

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    if args.text is None:  # runs with no argument, as every other command does
        args.text = str(DEFAULT_TEXT)
        log(f"eval: no --text: {DEFAULT_TEXT_NAME} ({DEFAULT_TEXT})")
    text = Path(args.text)
    if not text.is_file():
        raise BadValueError(f"--text: file not found: {text}")
    runner = open_engine(engine_options(args, k=None), say=log, notice=log, download=cli_progress())
    sm = runner.sm
    path = sm.path
    try:
        tokens = text_tokens(sm.tokenizer, text, args.max_tokens)
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
        runner.close()
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

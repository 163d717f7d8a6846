"""`ssdmoe requant`: a lower-bit copy of a checkpoint, to hold whole in memory (stream or fit)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ssdmoe_tui.commands.common import add_model_argument
from ssdmoe_tui.units import human_bytes


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "requant",
        help="write a 3- or 2-bit copy of a model with mlx-lm's quantization (to compare "
        "streaming it against holding the copy in memory: `bench --fit`)",
    )
    add_model_argument(p)
    p.add_argument("--bits", type=int, required=True, help="bits per weight: 3 or 2 (2..6)")
    p.add_argument("--out", required=True, help="the new folder (must not exist)")
    p.add_argument(
        "--group-size", type=int, default=None, help="quantization group (default: the source's)"
    )
    p.add_argument(
        "--shard-size", default="2G",
        help="largest shard (default 2G: the copy is made one shard at a time, and a shard's "
        "dequantized weights are what memory holds at once)",
    )  # fmt: skip
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ssdmoe_tui.checkpoint.config import read_json_object
    from ssdmoe_tui.engine.run.open import plan_engine
    from ssdmoe_tui.models.requant import check_requant, requantize
    from ssdmoe_tui.models.resolve import cli_progress
    from ssdmoe_tui.options import EngineOptions, parse_bytes

    def say(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    out = Path(args.out)
    shard = parse_bytes(args.shard_size, "--shard-size")
    # The header-only half of `open_engine`: a missing folder, a dense or unsupported
    # model fail here with their one line; the bits, group size and --out next.
    path = plan_engine(EngineOptions(model=args.model), say=say, download=cli_progress()).path
    check_requant(read_json_object(path / "config.json"), args.bits, args.group_size, out)
    done = requantize(
        path, out, bits=args.bits, group_size=args.group_size, max_shard_bytes=shard,
        progress=say,
    )  # fmt: skip
    say(
        f"wrote {done.out}: {done.bits}-bit {done.mode}, group size {done.group_size} (from "
        f"{done.source_bits}-bit), {human_bytes(done.weight_bytes, 2)} of weights in "
        f"{done.seconds} s"
    )
    print(done.out)
    return 0

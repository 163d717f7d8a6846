"""`ssdmoe demo-model`: write the embedded default model, or a random checkpoint of a real config."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ssdmoe_tui import options as O
from ssdmoe_tui.commands.common import arg_type


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "demo-model", help="write the demo model (or a random checkpoint of a real config)"
    )
    p.add_argument("--out", default=None, help="output folder (default: the platformdirs data dir)")
    p.add_argument(
        "--config",
        default=None,
        help="config.json of a real model: write a random checkpoint of that shape",
    )
    p.add_argument(
        "--layers",
        type=arg_type(O.parse_positive, "--layers"),
        default=None,
        help="with --config: keep only this many layers",
    )
    p.add_argument(
        "--tokenizer", default=None, help="with --config: copy tokenizer files from this folder"
    )
    p.add_argument(
        "--group-size",
        type=int,
        default=None,
        choices=(32, 64, 128),
        help="with --config: quantization group size (default: the config's, else 64)",
    )
    p.add_argument(
        "--bits",
        type=int,
        default=None,
        choices=(2, 3, 4, 5, 6, 8),
        help="with --config: bits per weight (default: the config's, else 4)",
    )
    p.add_argument("--shard-size", default="5G", help="maximum shard size")
    p.add_argument("--seed", type=arg_type(O.parse_seed), default=0)
    p.add_argument("--force", action="store_true", help="rewrite the demo model even if present")
    p.set_defaults(func=run)


def quantization_of(config: dict, group_size: int | None, bits: int | None) -> dict:
    """The quantization to write: the flags', else the config's own (a model of this
    shape may only quantize at its group size: the demo's 96-wide experts fail at 64),
    else 4-bit, group size 64. Per-layer overrides (8-bit routers) come from the model's
    own predicate, as mlx-lm's quantize_model applies it."""
    own = config.get("quantization") or config.get("quantization_config") or {}
    own = own if isinstance(own, dict) else {}

    def pick(flag: int | None, key: str, default: int) -> int:
        value = own.get(key)
        if flag is not None:
            return flag
        return value if isinstance(value, int) and not isinstance(value, bool) else default

    mode = own.get("mode") if isinstance(own.get("mode"), str) else "affine"
    return {
        "group_size": pick(group_size, "group_size", 64),
        "bits": pick(bits, "bits", 4),
        "mode": mode if group_size is None and bits is None else "affine",
    }


def cut_layers(config: dict, layers: int) -> None:
    """Keep the first `layers` layers: the count and the per-layer lists that follow it."""
    text = config.get("text_config", config)
    text["num_hidden_layers"] = layers
    if isinstance(text.get("layer_types"), list):
        text["layer_types"] = text["layer_types"][:layers]
    if isinstance(text.get("hybrid_override_pattern"), str):
        text["hybrid_override_pattern"] = text["hybrid_override_pattern"][:layers]


def run(args: argparse.Namespace) -> int:
    from ssdmoe_tui.checkpoint.config import read_json_object
    from ssdmoe_tui.errors import BadValueError, ModelError
    from ssdmoe_tui.models.demo import ensure_demo_model, write_checkpoint
    from ssdmoe_tui.models.registry import check_supported
    from ssdmoe_tui.options import parse_bytes

    def say(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    if args.config is None:
        out = Path(args.out) if args.out else None
        print(ensure_demo_model(out, progress=say, force=args.force))
        return 0
    if args.out is None:
        raise BadValueError("--config needs --out")
    cfg_path = Path(args.config)
    if not cfg_path.is_file():
        raise ModelError(f"config not found: {cfg_path}")
    config = read_json_object(cfg_path)
    quant = quantization_of(config, args.group_size, args.bits)  # what will be written
    try:
        check_supported({**config, "quantization": quant})  # dense, unknown, incomplete
    except ModelError as e:
        raise ModelError(f"{cfg_path}: {e}") from None
    config.pop("quantization", None)
    config.pop("quantization_config", None)
    if args.layers is not None:
        cut_layers(config, args.layers)
    shard = parse_bytes(args.shard_size, "--shard-size")
    out = Path(args.out)
    created = not out.exists()  # a failed write leaves no half-made folder of ours behind
    try:
        write_checkpoint(
            config,
            out,
            seed=args.seed,
            group_size=quant["group_size"],
            bits=quant["bits"],
            mode=quant["mode"],
            max_shard_bytes=shard,
            tokenizer_from=Path(args.tokenizer) if args.tokenizer else None,
            progress=say,
            random_routers=True,  # zero-initialised gates would route every token alike
        )
    except BaseException as e:
        if created:
            import shutil

            shutil.rmtree(out, ignore_errors=True)
        if isinstance(e, BadValueError) or not isinstance(e, KeyError | TypeError | ValueError):
            raise
        # mlx-lm's ModelArgs on a partial config
        why = f"no {e.args[0]!r}" if isinstance(e, KeyError) else str(e).splitlines()[0]
        raise ModelError(f"{cfg_path}: cannot build a model from this config ({why})") from None
    print(out)
    return 0

"""`ssdmoe repack`: write the experts again as one contiguous, page-aligned file."""

from __future__ import annotations

import argparse
import json
import sys

from ssdmoe_tui.commands.common import add_model_argument
from ssdmoe_tui.units import human_bytes


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "repack",
        help="copy a model's experts into one contiguous, page-aligned file (optional; costs "
        "the experts' size again on disk)",
    )
    add_model_argument(p)
    p.add_argument("--remove", action="store_true", help="delete the repacked copy instead")
    p.add_argument("--status", action="store_true", help="say whether a current copy exists")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ssdmoe_tui.engine.experts.repack import find_repacked, remove_repacked, write_repacked
    from ssdmoe_tui.engine.run.open import plan_engine
    from ssdmoe_tui.models.resolve import cli_progress
    from ssdmoe_tui.options import EngineOptions

    # The header-only half of `open_engine`: the folder and its expert index, no weights.
    plan = plan_engine(
        EngineOptions(model=args.model),
        say=(lambda _: None) if args.json else (lambda m: print(m, file=sys.stderr)),
        download=None if args.json else cli_progress(),
    )
    path, index = plan.path, plan.index
    if args.remove:
        gone = remove_repacked(path, index)
        out = {"removed": [str(p) for p in gone]}
        print(json.dumps(out) if args.json else (
            "\n".join(f"removed {p}" for p in gone) or "no repacked copy found"
        ))  # fmt: skip
        return 0
    if args.status:
        layout, note = find_repacked(path, index)
        out = {"current": layout is not None, "data": str(layout.data) if layout else None,
               "note": note}  # fmt: skip
        if args.json:
            print(json.dumps(out))
        elif layout:
            print(f"current: {layout.data}")
        else:
            print(f"none current{': ' + note if note else ''}")
        return 0

    def progress(msg: str) -> None:
        if not args.json:
            print(msg, file=sys.stderr, flush=True)

    # Where: the model folder, or ssdmoe's data folder for a Hub snapshot or a read-only
    # folder; the engine looks in both.
    _, summary = write_repacked(path, index, progress=progress)
    if args.json:
        print(json.dumps(summary))
    else:
        print(
            f"wrote {summary['data']} ({human_bytes(summary['bytes'], 2)}, "
            f"{human_bytes(summary['padding_bytes'])} alignment padding) in "
            f"{summary['seconds']} s; the engine reads experts from it while the shards "
            "are unchanged (`--experts shards` to compare)"
        )
    return 0

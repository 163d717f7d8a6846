"""`ssdmoe models`: list the MoE checkpoints on this machine; `ssdmoe models fetch`: get one."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from ssdmoe_tui.models import registry
from ssdmoe_tui.units import human_bytes


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "models",
        help="list MoE checkpoints in the Hugging Face cache and model folders; fetch one",
        description=(
            "List the MoE checkpoints found in the Hugging Face cache (HF_HUB_CACHE), in the "
            "folders of SSDMOE_MODEL_DIRS (separated by ':') and the demo model folder."
        ),
    )
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument(
        "--dir",
        action="append",
        default=[],
        metavar="FOLDER",
        help="also look in FOLDER (a model folder or a folder of model folders); repeatable",
    )
    p.set_defaults(func=run_list)
    sub = p.add_subparsers(dest="models_command", metavar="[fetch|supported]")
    fetch = sub.add_parser(
        "fetch",
        help="download a Hub model into the Hugging Face cache (resumes an interrupted one)",
    )
    fetch.add_argument("model", help="org/name[@revision], e.g. mlx-community/Qwen3-30B-A3B-4bit")
    fetch.set_defaults(func=run_fetch)
    sup = sub.add_parser("supported", help="architectures and checkpoints known to work")
    sup.add_argument("--json", action="store_true", help="machine-readable output")
    sup.set_defaults(func=run_supported)


def _mib(x: float) -> str:
    return f"{x:,.1f}" if x >= 1 else f"{x:.3f}"


def _home(path: str) -> str:
    """A path as a user types it: their home folder as `~`."""
    home = str(Path.home())
    return "~" + path[len(home) :] if path == home or path.startswith(home + "/") else path


def format_table(entries: list) -> str:
    header = ("MODEL", "ARCH", "SIZE", "EXPERTS", "K", "EXPERT", "MiB/TOKEN", "SUPPORTED", "PATH")
    rows = [header]
    for e in entries:
        rows.append(
            (
                e.name,
                e.architecture,
                human_bytes(e.size_bytes),
                f"{e.moe_layers}x{e.num_experts}",
                str(e.trained_k),
                human_bytes(e.bytes_per_expert, 2) if e.bytes_per_expert else "-",
                _mib(e.mib_per_token) if e.mib_per_token else "-",
                "yes" if e.supported else "no",
                _home(e.path),  # last: a long path widens no other column
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    notes = [f"  {e.name}: {e.reason}" for e in entries if e.reason]
    if notes:
        lines += ["", "not usable:", *notes]
    return "\n".join(lines)


def run_list(args: argparse.Namespace) -> int:
    from ssdmoe_tui.models.scan import entries_json, scan_models

    for folder in args.dir or ():
        if not Path(folder).is_dir():  # a typo would otherwise list as "nothing there"
            print(f"ssdmoe: note: --dir {folder}: no such folder", file=sys.stderr)
    entries = scan_models(args.dir)
    if args.json:
        print(entries_json(entries))
        return 0
    if not entries:
        print(
            "no MoE checkpoints found; fetch one with "
            f"`ssdmoe models fetch {registry.KNOWN_CHECKPOINTS[0].repo_id}`"
        )
        return 0
    print(format_table(entries))
    return 0


def run_fetch(args: argparse.Namespace) -> int:
    import signal
    import threading

    from ssdmoe_tui.models.resolve import DownloadCancelled, cli_progress, resolve_model

    # Ctrl-C alone would wait for the hub's in-flight file downloads to finish; the cancel
    # event stops them within one chunk and removes their partial files. A second Ctrl-C
    # exits at once.
    cancel = threading.Event()

    def on_sigint(signum, frame) -> None:
        if cancel.is_set():
            os._exit(130)
        cancel.set()
        raise KeyboardInterrupt

    in_main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGINT, on_sigint) if in_main else None
    try:
        folder = resolve_model(args.model, progress=cli_progress(), cancel=cancel)
    except (KeyboardInterrupt, DownloadCancelled):
        print(
            f"\nssdmoe: interrupted; run `ssdmoe models fetch {args.model}` again to resume "
            "(finished files are kept)",
            file=sys.stderr,
        )
        return 130
    finally:
        if in_main:
            signal.signal(signal.SIGINT, previous)
    print(folder)
    return 0


def run_supported(args: argparse.Namespace) -> int:
    refused = {a.model_type: a.refused for a in registry.ARCHITECTURES.values() if a.refused}
    data = {
        "architectures": registry.SUPPORTED_ARCHITECTURES,
        "planned": registry.PLANNED_ARCHITECTURES,
        "not_streamed": refused,
        "checkpoints": [
            {"repo_id": c.repo_id, "architecture": c.architecture, "note": c.note}
            for c in registry.KNOWN_CHECKPOINTS
        ],
        "shapes_verified_with_random_weights": [
            {"model": v.model, "architecture": v.architecture, "note": v.note}
            for v in registry.VERIFIED_SHAPES
        ],
    }
    if args.json:
        print(json.dumps(data, indent=2))
        return 0
    print(f"streamed ({len(registry.SUPPORTED_ARCHITECTURES)} model types; exact against mlx-lm):")
    for name, desc in registry.SUPPORTED_ARCHITECTURES.items():
        print(f"  {name:18} {desc}")
    for name, desc in registry.PLANNED_ARCHITECTURES.items():
        print(f"  {name:18} {desc}")
    if refused:
        print("not streamed:")
        for name, why in refused.items():
            print(f"  {name:18} {why}")
    print("checkpoints known to work:")
    for c in registry.KNOWN_CHECKPOINTS:
        print(f"  {c.repo_id}  ({c.note})")
    print("shapes verified with random weights (the release's config.json, a few layers;")
    print("its real weights not run here), by family:")
    for arch in dict.fromkeys(v.architecture for v in registry.VERIFIED_SHAPES):
        print(f"  {arch}")
        for v in registry.VERIFIED_SHAPES:
            if v.architecture == arch:
                print(f"    {v.model}  ({v.note})")
    return 0

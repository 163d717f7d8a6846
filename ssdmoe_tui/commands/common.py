"""Arguments shared by the commands that load a model."""

from __future__ import annotations

import argparse


def add_model_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--model", default="", help="model folder or Hub repo id (default: the embedded demo model)"
    )
    p.add_argument(
        "--k", type=int, default=None, help="experts per token (default: the model's trained K)"
    )
    p.add_argument(
        "--prefill-k", type=int, default=None, help="experts per token during prefill (default: K)"
    )
    p.add_argument(
        "--expert-cache", default="auto", help="expert cache budget: auto, 512M, 4G, ..."
    )
    p.add_argument(
        "--dtype",
        default=None,
        choices=["float32", "bfloat16", "float16"],
        help="activation dtype (default: float32 on CPU, bfloat16 on GPU)",
    )
    p.add_argument(
        "--reader", default="auto", choices=["auto", "native", "python"], help="expert reader"
    )
    p.add_argument(
        "--direct-io", action="store_true", help="bypass the page cache for expert reads"
    )
    add_experts_argument(p)
    p.add_argument(
        "--prefetch",
        action="store_true",
        help="read the next layer's predicted experts while this layer computes (off by default: "
        "it only pays where the prediction is good; see docs/benchmarks.md)",
    )


def add_experts_argument(p: argparse.ArgumentParser) -> None:
    """`--experts`: where expert bytes are read from (see `engine.loader.EXPERT_SOURCES`)."""
    p.add_argument(
        "--experts",
        default="auto",
        choices=["auto", "shards", "repacked"],
        help="expert bytes from the repacked file (`ssdmoe repack`) when current (auto), "
        "from the shards, or only from the repacked file",
    )


def add_distributed_argument(p: argparse.ArgumentParser) -> None:
    """`--distributed`: one rank of an expert-parallel `mlx.launch` (docs/distributed.md)."""
    p.add_argument(
        "--distributed",
        action="store_true",
        help="expert-parallel across the ranks of `mlx.launch` (each rank streams its share "
        "of the experts; rank 0 talks to the user): see docs/distributed.md",
    )


def resolve_model_path(spec: str, quiet: bool = False):
    """'' -> the demo model (created on first use, with a visible message)."""
    import sys
    from pathlib import Path

    if not spec:
        from ssdmoe_tui.models.demo import ensure_demo_model

        return ensure_demo_model(
            progress=(lambda m: None) if quiet else (lambda m: print(m, file=sys.stderr))
        )
    from ssdmoe_tui.models.resolve import cli_progress, resolve_model

    return Path(resolve_model(spec, progress=None if quiet else cli_progress()))

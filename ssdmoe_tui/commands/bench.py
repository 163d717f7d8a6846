"""`ssdmoe bench`: decode/prefill speed, bytes per token and time split per (K, budget)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ssdmoe_tui.commands.common import add_experts_argument


def _int_list(text: str) -> list[int]:
    try:
        out = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"not a comma-separated list of integers: {text!r}"
        ) from None
    if not out or any(x < 1 for x in out):
        raise argparse.ArgumentTypeError(f"K values must be >= 1: {text!r}")
    return out


def _budget_list(text: str) -> list[str]:
    from ssdmoe_tui.engine.cache import parse_size

    out = [x.strip() for x in text.split(",") if x.strip()]
    for b in out:
        if b != "auto":
            try:
                parse_size(b)
            except ValueError as e:
                raise argparse.ArgumentTypeError(str(e)) from None
    if not out:
        raise argparse.ArgumentTypeError("no expert cache size given")
    return out


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "bench",
        help="benchmark tok/s, MiB/token, hit rate and the time split per K and cache budget",
        description="Measure each (K, expert cache) configuration on a fixed prompt with greedy "
        "decoding, the disk's random-read bandwidth at the model's expert size, the I/O "
        "ceiling, and plain resident mlx-lm when the model fits in memory.",
    )
    p.add_argument("--model", required=True, help="model folder or Hub repo id")
    p.add_argument(
        "--k",
        type=_int_list,
        default=None,
        help="K values, e.g. 8,4,2 (default: trained K, /2, /4)",
    )
    p.add_argument(
        "--expert-cache",
        type=_budget_list,
        default=["auto"],
        help="budgets, e.g. 2G,8G (default auto)",
    )
    p.add_argument("--prompt-tokens", type=int, default=512)
    p.add_argument("--decode-tokens", type=int, default=128)
    p.add_argument(
        "--cold",
        action="store_true",
        help="drop the page cache before each measurement (root on Linux)",
    )
    p.add_argument(
        "--json", dest="json_out", default=None, help="write the full result as JSON here"
    )
    p.add_argument(
        "--plot", default=None, help="write a PNG of tok/s and MiB/token vs K (needs matplotlib)"
    )
    p.add_argument(
        "--dtype", default=None, choices=["float32", "bfloat16", "float16"],
        help="activation dtype (default: float32 on CPU, bfloat16 on GPU)",
    )  # fmt: skip
    p.add_argument("--reader", default="auto", choices=["auto", "native", "python"])
    p.add_argument(
        "--direct-io", action="store_true", help="bypass the page cache for expert reads"
    )
    p.add_argument(
        "--queue-depth", type=int, default=16, help="reader queue depth (engine default 16)"
    )
    p.add_argument(
        "--baseline", default="auto", choices=["auto", "skip", "force"],
        help="resident mlx-lm baseline: auto (when the model < 50%% of available memory), "
        "skip, or force",
    )  # fmt: skip
    p.add_argument(
        "--baseline-only", action="store_true", help="measure the resident baseline alone"
    )
    p.add_argument(
        "--baseline-json",
        default=None,
        help="take the resident baseline from an earlier bench JSON",
    )
    add_experts_argument(p)
    p.add_argument(
        "--prefetch", default="off", choices=["off", "on", "both"],
        help="predict the next layer's experts with its router and read them early: off, on, "
        "or both (each configuration without, then with: precision, recall and net gain)",
    )  # fmt: skip
    p.add_argument("--disk-mib", type=int, default=512, help="MiB read per K in the disk test")
    p.add_argument("--prefill-step", type=int, default=512, help="prefill chunk size in tokens")
    p.add_argument("--no-warmup", action="store_true", help="do not compile kernels before timing")
    p.add_argument("--markdown", action="store_true", help="print the table as Markdown")
    p.add_argument(
        "--wide", action="store_true",
        help="print every column (time split, read GB/s, peak MLX memory, I/O ceiling, ...); "
        "the default table fits 100 columns",
    )  # fmt: skip
    p.add_argument(
        "--quality", default=None, metavar="TEXT_FILE",
        help="also teacher-force this text at each K: perplexity, agreement with the trained "
        "K and router mass, recorded beside the speed (as `ssdmoe eval`)",
    )  # fmt: skip
    p.add_argument(
        "--quality-tokens", type=int, default=512, help="with --quality: the text's first N tokens"
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ssdmoe_tui.atomic import atomic_write_text
    from ssdmoe_tui.bench.bench import BenchOptions, run_bench
    from ssdmoe_tui.bench.report import summary, write_plot
    from ssdmoe_tui.commands.common import resolve_model_path
    from ssdmoe_tui.errors import BadValueError

    for name in (
        "prompt_tokens",
        "decode_tokens",
        "queue_depth",
        "disk_mib",
        "prefill_step",
        "quality_tokens",
    ):
        if getattr(args, name) < 1:
            raise BadValueError(
                f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}"
            )
    if args.quality and not Path(args.quality).is_file():
        raise BadValueError(f"--quality: text file not found: {args.quality}")
    path = resolve_model_path(args.model)
    opts = BenchOptions(
        model=Path(path),
        ks=args.k or [],
        budgets=args.expert_cache,
        prompt_tokens=args.prompt_tokens,
        decode_tokens=args.decode_tokens,
        cold=args.cold,
        dtype=args.dtype,
        reader=args.reader,
        direct_io=args.direct_io,
        queue_depth=args.queue_depth,
        baseline=args.baseline,
        baseline_only=args.baseline_only,
        baseline_json=Path(args.baseline_json) if args.baseline_json else None,
        disk_bytes=args.disk_mib << 20,
        prefill_step=args.prefill_step,
        warmup=not args.no_warmup,
        experts=args.experts,
        prefetch=args.prefetch,
        quality_text=Path(args.quality) if args.quality else None,
        quality_tokens=args.quality_tokens,
    )

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    def save(result: dict) -> None:
        if args.json_out:
            atomic_write_text(Path(args.json_out), json.dumps(result, indent=1) + "\n")

    result = run_bench(opts, log, on_partial=save)
    save(result)
    if args.json_out:
        log(f"JSON written to {args.json_out}")
    print(summary(result, markdown=args.markdown, wide=args.wide))
    if args.plot:
        log(write_plot(result, Path(args.plot)))
    return 0

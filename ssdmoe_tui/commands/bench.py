"""`ssdmoe bench`: decode/prefill speed, bytes per token and time split per (K, budget)."""

from __future__ import annotations

import argparse
import json
import sys
from functools import partial
from pathlib import Path

from ssdmoe_tui.bench.bench import (
    BASELINES,
    PIPELINE_MODES,
    PREFETCH_MODES,
    PREFILL_STEP,
    BenchOptions,
)
from ssdmoe_tui.commands.common import (
    Adder,
    add_all,
    add_distributed_argument,
    add_dtype_argument,
    add_expert_cache_argument,
    add_experts_argument,
    add_k_argument,
    add_model_argument,
    add_policy_argument,
    add_prefill_step_argument,
    add_queue_depth_argument,
    add_reader_arguments,
    add_routing_trace_argument,
    arg_type,
    distributed_run,
    engine_options,
    flag,
    list_type,
)
from ssdmoe_tui.options import parse_depth_list, parse_positive, parse_speculate_list

HELP = "benchmark tok/s, MiB/token, hit rate and the time split per K and cache budget"
DESCRIPTION = (
    "Measure each (K, expert cache) configuration on a fixed prompt with greedy decoding, "
    "the disk's random-read bandwidth at the model's expert size, the I/O ceiling, and "
    "plain resident mlx-lm when the model fits in memory."
)


def _count(what: str):
    return arg_type(parse_positive, what)


def _batch_size(text: str) -> int:
    return parse_positive(text, "--batch")


#: bench's options in --help order: the shared adders and its own flags.
ARGUMENTS: tuple[Adder, ...] = (
    add_model_argument,  # the embedded demo by default, as generate, index and eval
    flag("--quick", action="store_true",
         help="the guard (`make bench-quick`): resident mlx-lm, a small cache and every "
         "expert held, alternating in one process, plus the per-MoE-layer overhead; its own "
         "small checkpoint unless --model is given"),
    flag("--rounds", type=_count("--rounds"), default=None,
         help="with --quick: alternations (>= 3, default 9; medians over them); with "
         "--speculate: rounds of plain + every configuration (default 3)"),
    flag("--speculate", type=arg_type(parse_speculate_list), default=None, metavar="MODE[,...]",
         help="decode with and without speculation side by side on one engine: ngram, auto, "
         "oracle[:P[,P...]] (drafts from a previous greedy run, each wrong with probability "
         "1-P; P as 0..1 or 70%%), none (never drafts: the speculative loop's own cost)"),
    flag("--draft-depth", type=arg_type(parse_depth_list), default=None, metavar="D[,...]",
         help="with --speculate: draft depths, auto (the governor, the default) and/or 1..8"),
    flag("--exact-verify", action="store_true",
         help="with --speculate: every configuration also with its verify passes in one-token "
         "decode's shapes (rows marked exact, in the same rounds): what exact verify costs"),
    flag("--timeline", action="store_true",
         help="the per-layer decode timeline (sync wait, reads, hits, read-ahead) on one "
         "engine, with --prefetch off, on or both (rounds alternating; each run from an "
         "empty cache), and a bare-sync probe; first --k and --expert-cache"),
    flag("--prompt-file", default=None, metavar="FILE",
         help="with --speculate: this text as a chat-templated user turn instead of the "
         "fixed prompt"),
    partial(add_k_argument, many=True),
    partial(add_expert_cache_argument, many=True),
    flag("--prompt-tokens", type=_count("--prompt-tokens"), default=None,
         help="prompt length (default 512; 16 with --quick)"),
    flag("--decode-tokens", type=_count("--decode-tokens"), default=None,
         help="tokens decoded per configuration (default 128; 16 with --quick)"),
    flag("--cold", action="store_true",
         help="drop the page cache before each measurement (root on Linux)"),
    flag("--json", dest="json_out", default=None, help="write the full result as JSON here"),
    flag("--plot", default=None, help="write a PNG of tok/s and MiB/token vs K (needs matplotlib)"),
    add_dtype_argument,
    add_reader_arguments,
    add_queue_depth_argument,
    flag("--baseline", default="auto", choices=BASELINES,
         help="resident mlx-lm baseline: auto (when the model < 50%% of available memory), "
         "skip, or force"),
    flag("--baseline-only", action="store_true", help="measure the resident baseline alone"),
    flag("--baseline-json", default=None,
         help="take the resident baseline from an earlier bench JSON"),
    add_routing_trace_argument,
    add_policy_argument,
    add_experts_argument,
    flag("--prefetch", default="off", choices=PREFETCH_MODES,
         help="predict the next layer's experts with its router and read them early: off, "
         "on, or both (each configuration without, then with: precision, recall and net "
         "gain)"),
    flag("--pipeline", default="auto", choices=PIPELINE_MODES,
         help="the pipelined layer (hits computed while the misses are read): as the engine "
         "has it (auto: on a GPU), on, off, or both (each configuration serial and pipelined, "
         "which runs first alternating from one configuration to the next)"),
    flag("--disk-mib", type=_count("--disk-mib"), default=512,
         help="MiB read per K in the disk test"),
    partial(add_prefill_step_argument, default=PREFILL_STEP),
    flag("--no-warmup", action="store_true", help="do not compile kernels before timing"),
    flag("--markdown", action="store_true", help="print the table as Markdown"),
    flag("--wide", action="store_true",
         help="print every column (time split, read GB/s, peak MLX memory, I/O ceiling, "
         "...); the default table fits 100 columns"),
    flag("--quality", default=None, metavar="TEXT_FILE",
         help="also teacher-force this text at each K: perplexity, agreement with the "
         "trained K and router mass, recorded beside the speed (as `ssdmoe eval`)"),
    flag("--quality-tokens", type=_count("--quality-tokens"), default=512,
         help="with --quality: the text's first N tokens"),
    flag("--batch", type=list_type(_batch_size, "--batch"), default=None, metavar="B[,B...]",
         help="also decode B sequences together (different prompts; trace-driven: each at "
         "another offset of the trace): aggregate and per-stream tok/s, MiB/token per "
         "sequence"),
    flag("--batch-check", action="store_true",
         help="with --batch: run every row alone afterwards and count tokens that differ"),
    flag("--batch-join", type=_count("--batch-join"), default=0, metavar="N",
         help="with --batch: then an N-token prompt joins the B decoding rows; the longest "
         "gap between two of their tokens while it prefills (JSON join_probe)"),
    flag("--fit", default=None, metavar="MODEL",
         help="also B, a lower-bit copy of --model (`ssdmoe requant`), resident in plain "
         "mlx-lm beside the streamed row: speed, memory, size and with --quality agreement "
         "(default K: the trained K only)"),
    add_distributed_argument,
)  # fmt: skip


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bench", help=HELP, description=DESCRIPTION)
    add_all(p, ARGUMENTS)
    # What --quick does not use, with each option's default: given, it is refused.
    quick_ignores = tuple(
        (a.dest, a.option_strings[0], a.default)
        for a in p._actions
        if a.option_strings and a.dest not in QUICK_USES
    )
    p.set_defaults(func=distributed_run(_run), quick_ignores=quick_ignores)


# The options `bench --quick` reads (its fixed configurations take nothing else).
QUICK_USES = frozenset(
    {"help", "model", "quick", "rounds", "expert_cache", "prompt_tokens", "decode_tokens",
     "dtype", "json_out"}
)  # fmt: skip


def _check_quick(args: argparse.Namespace) -> None:
    """`--quick` with an option it does not use is one line, not a silent run without it
    (`bench --quick --fit DIR` ran no fit row)."""
    from ssdmoe_tui.errors import BadValueError

    given = [opt for dest, opt, default in args.quick_ignores
             if getattr(args, dest, default) != default]  # fmt: skip
    if given:
        raise BadValueError(
            f"--quick runs its own fixed configurations and does not take {', '.join(given)}: "
            "drop " + ("it" if len(given) == 1 else "them") + " or drop --quick"
        )


def _bench_options(args: argparse.Namespace, dist) -> BenchOptions:
    """The sweep's options from the arguments: the model (and --fit copy) resolved, the
    text for --quality checked, `dist` this rank of a --distributed run (or None)."""
    from ssdmoe_tui.commands.common import resolve_model_path
    from ssdmoe_tui.errors import BadValueError
    from ssdmoe_tui.options import CacheBudget

    if args.quality and not Path(args.quality).is_file():
        raise BadValueError(f"--quality: text file not found: {args.quality}")
    path = resolve_model_path(args.model)
    fit = resolve_model_path(args.fit, option="--fit") if args.fit else None
    # The engine settings every configuration shares, parsed once by the shared argument
    # types; K, the budgets and the prefetch mode are the lists the bench walks.
    engine = engine_options(
        args, model=str(path), k=None, expert_cache=CacheBudget(), prefetch=False
    )
    return BenchOptions(
        engine=engine,
        ks=args.k or [],
        budgets=args.expert_cache,
        prompt_tokens=args.prompt_tokens or 512,
        decode_tokens=args.decode_tokens or 128,
        cold=args.cold,
        baseline=args.baseline,
        baseline_only=args.baseline_only,
        baseline_json=Path(args.baseline_json) if args.baseline_json else None,
        disk_bytes=args.disk_mib << 20,
        warmup=not args.no_warmup,
        prefetch=args.prefetch,
        pipeline=args.pipeline,
        distributed=dist,
        quality_text=Path(args.quality) if args.quality else None,
        quality_tokens=args.quality_tokens,
        batch=args.batch or [],
        batch_check=args.batch_check,
        batch_join=args.batch_join,
        fit=Path(fit) if fit is not None else None,
    )


def _run(args: argparse.Namespace, dist) -> int:
    from ssdmoe_tui.atomic import atomic_write_text
    from ssdmoe_tui.bench.bench import run_bench
    from ssdmoe_tui.bench.report import summary, write_plot

    if args.quick:
        _check_quick(args)
        return _run_quick(args)
    if args.exact_verify and not args.speculate:
        from ssdmoe_tui.errors import BadValueError
        from ssdmoe_tui.options import EXACT_NEEDS_SPECULATE

        raise BadValueError(EXACT_NEEDS_SPECULATE)
    if args.speculate:
        return _run_speculate(args)
    if args.timeline:
        return _run_timeline(args)
    opts = _bench_options(args, dist)
    quiet = not opts.root  # only rank 0 reports

    def log(msg: str) -> None:
        if not quiet:
            print(msg, file=sys.stderr, flush=True)

    def save(result: dict) -> None:
        if args.json_out and not quiet:
            atomic_write_text(Path(args.json_out), json.dumps(result, indent=1) + "\n")

    if opts.fit is not None:
        from ssdmoe_tui.bench.fit import run_bench_fit

        result = run_bench_fit(opts, log, on_partial=save)
    else:
        result = run_bench(opts, log, on_partial=save)
    if quiet:
        return 0
    save(result)
    if args.json_out:
        log(f"JSON written to {args.json_out}")
    print(summary(result, markdown=args.markdown, wide=args.wide))
    if result.get("batch"):
        from ssdmoe_tui.bench.batch import table

        print("\nbatched decode (B sequences together; steady state: every step decodes B rows)")
        print(table(result["batch"]))
    if args.plot:
        log(write_plot(result, Path(args.plot)))
    return 0


def _run_quick(args: argparse.Namespace) -> int:
    from ssdmoe_tui.atomic import atomic_write_text
    from ssdmoe_tui.bench.quick import quick_table, run_quick
    from ssdmoe_tui.commands.common import resolve_model_path

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    path = resolve_model_path(args.model) if args.model else None
    small = next((b for b in args.expert_cache if not b.auto), None)  # the small cache
    result = run_quick(
        path,
        small_cache=small.bytes if small is not None else None,
        rounds=args.rounds or 9,
        prompt_tokens=args.prompt_tokens or 16,
        decode_tokens=args.decode_tokens or 16,
        dtype=args.dtype,
        log=log,
    )
    if args.json_out:
        atomic_write_text(Path(args.json_out), json.dumps(result, indent=1) + "\n")
        log(f"JSON written to {args.json_out}")
    print(quick_table(result))
    return 0


def _run_speculate(args: argparse.Namespace) -> int:
    """`--speculate`: plain and speculative decode side by side (bench/speculate.py)."""
    from ssdmoe_tui.atomic import atomic_write_text
    from ssdmoe_tui.bench.bench import fixed_prompt
    from ssdmoe_tui.bench.speculate import run_speculate, table
    from ssdmoe_tui.commands.common import resolve_model_path
    from ssdmoe_tui.engine.run.open import open_engine
    from ssdmoe_tui.errors import BadValueError
    from ssdmoe_tui.options import CacheBudget, decode_text

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    path = resolve_model_path(args.model)
    k = args.k[0] if args.k else None
    budget = args.expert_cache[0] if args.expert_cache else CacheBudget()
    opts = engine_options(args, model=str(path), k=k, expert_cache=budget, prefetch=False)
    runner = open_engine(opts, notice=lambda m: log(f"note: {m}"))
    try:
        sm = runner.sm
        if args.prompt_file:
            from ssdmoe_tui.prompting.chat_format import prompt_tokens

            if not Path(args.prompt_file).is_file():
                raise BadValueError(f"--prompt-file: not a file: {args.prompt_file}")
            text = decode_text(
                Path(args.prompt_file).read_bytes(), f"--prompt-file {args.prompt_file}"
            )
            prompt = prompt_tokens(sm.tokenizer, [{"role": "user", "content": text}])
        else:
            prompt = fixed_prompt(sm.tokenizer, args.prompt_tokens or 128)

        def save(partial: dict) -> None:
            if args.json_out:
                partial["load"] = _load_average()
                atomic_write_text(Path(args.json_out), json.dumps(partial, indent=1) + "\n")

        result = run_speculate(
            runner, prompt, args.decode_tokens or 64, args.speculate, args.draft_depth or [None],
            args.rounds or 3, log, on_round=save, exact=args.exact_verify,
        )  # fmt: skip
    finally:
        runner.close()
    result["load"] = _load_average()
    if args.json_out:
        atomic_write_text(Path(args.json_out), json.dumps(result, indent=1) + "\n")
        log(f"JSON written to {args.json_out}")
    print(table(result))
    return 0


def _run_timeline(args: argparse.Namespace) -> int:
    """`--timeline`: the per-layer decode timeline, read-ahead off and on (bench/timeline.py)."""
    from ssdmoe_tui.atomic import atomic_write_text
    from ssdmoe_tui.bench.bench import fixed_prompt
    from ssdmoe_tui.bench.timeline import run_timeline, table
    from ssdmoe_tui.commands.common import resolve_model_path
    from ssdmoe_tui.engine.run.open import open_engine
    from ssdmoe_tui.options import CacheBudget

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    path = resolve_model_path(args.model)
    k = args.k[0] if args.k else None
    budget = args.expert_cache[0] if args.expert_cache else CacheBudget()
    opts = engine_options(args, model=str(path), k=k, expert_cache=budget, prefetch=True)
    runner = open_engine(opts, notice=lambda m: log(f"note: {m}"))
    try:
        prompt = fixed_prompt(runner.sm.tokenizer, args.prompt_tokens or 64)
        result = run_timeline(
            runner, prompt, args.decode_tokens or 32, args.rounds or 3, args.prefetch, log
        )
    finally:
        runner.close()
    result["load"] = _load_average()
    if args.json_out:
        atomic_write_text(Path(args.json_out), json.dumps(result, indent=1) + "\n")
        log(f"JSON written to {args.json_out}")
    print(table(result))
    return 0


def _load_average() -> list[float] | None:
    import os

    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None

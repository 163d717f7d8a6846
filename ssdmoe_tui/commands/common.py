"""The argument definitions shared by every command that opens a model.

One factory per option: each defines the flag once and validates its value at the
edge, through the parsers of `engine.options`, so a bad value stops argparse with one
line naming it (`--k 0`, `--expert-cache banana`, `--seed -1`, `--temp nan`...).
`engine_options(args)` then builds the typed `EngineOptions` that `open_engine` takes.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterable
from dataclasses import replace

from ssdmoe_tui import options as O
from ssdmoe_tui.engine.policy.policies import parse_policy
from ssdmoe_tui.errors import BadValueError


def arg_type(parse: Callable, *extra) -> Callable[[str], object]:
    """An argparse `type=` from an `options` parser (BadValueError -> one line)."""

    def convert(text: str):
        try:
            return parse(text, *extra)
        except BadValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None

    convert.__name__ = getattr(parse, "__name__", "value")
    return convert


def list_type(parse: Callable, what: str) -> Callable[[str], list]:
    """Comma-separated values, each through `parse` (`--k 8,4,2`, `--expert-cache 2G,8G`)."""

    def convert(text: str) -> list:
        items = [x.strip() for x in text.split(",") if x.strip()]
        if not items:
            raise argparse.ArgumentTypeError(f"no {what} given in {text!r}")
        return [arg_type(parse)(x) for x in items]

    return convert


#: One row of a command's argument table: it adds one option (or a shared group) to a
#: parser. Tables mix the shared adders below with `flag` rows, in --help order.
Adder = Callable[[argparse.ArgumentParser], object]


def flag(*names: str, **kw: object) -> Adder:
    """A command's own option as a table row: `add_argument(*names, **kw)`."""
    return lambda p: p.add_argument(*names, **kw)


def add_all(p: argparse.ArgumentParser, table: Iterable[Adder]) -> None:
    """Every row of an argument table, in order."""
    for add in table:
        add(p)


def add_model_argument(p: argparse.ArgumentParser, *, default: str | None = "", **kw) -> None:
    p.add_argument(
        "--model",
        default=default,
        metavar=kw.pop("metavar", "MODEL"),
        help=kw.pop(
            "help", "model folder or Hub repo id[@revision] (default: the embedded demo model)"
        ),
        **kw,
    )


def _add_one_or_list(
    p: argparse.ArgumentParser,
    name: str,
    parse: Callable,
    what: str,
    metavar: str,
    *,
    many: bool,
    default: object,
    help: str,
) -> None:
    """`name` taking one value, or with `many` (the bench's sweeps) a comma-separated
    list of them (`--k 8,4,2`), each through `parse`."""
    p.add_argument(
        name,
        type=list_type(parse, what) if many else arg_type(parse),
        default=default,
        metavar=f"{metavar}[,{metavar}...]" if many else metavar,
        help=help,
    )  # fmt: skip


def add_k_argument(p: argparse.ArgumentParser, *, many: bool = False) -> None:
    if many:
        help = "K values, e.g. 8,4,2 (default: trained K, /2, /4)"
    else:
        help = "experts per token (default: the model's trained K)"
    _add_one_or_list(p, "--k", O.parse_k, "K values", "K", many=many, default=None, help=help)


#: `--prefill-k` (generate, the server): a row like the commands' own flags.
add_prefill_k_argument = flag(
    "--prefill-k", type=arg_type(O.parse_k, "prefill K"), default=None, metavar="K",
    help="experts per token during prefill (default: K)",
)  # fmt: skip


def add_expert_cache_argument(
    p: argparse.ArgumentParser, *, many: bool = False, default: object = "auto"
) -> None:
    """Sizes below the model's minimum are raised to it at open time, with a notice."""
    if default == "auto":
        default = [O.CacheBudget()] if many else O.CacheBudget()
    help = (
        "budgets, e.g. 2G,8G (default auto)" if many else "expert cache budget: auto, 512M, 4G, ..."
    )
    _add_one_or_list(
        p, "--expert-cache", O.CacheBudget.parse, "expert cache size", "SIZE",
        many=many, default=default, help=help,
    )  # fmt: skip


def add_dtype_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--dtype",
        default=None,
        choices=O.DTYPES,
        help="activation dtype (default: float32 on CPU, bfloat16 on GPU)",
    )


def add_reader_arguments(p: argparse.ArgumentParser) -> None:
    """`--reader` and `--direct-io`: how expert bytes are read."""
    p.add_argument("--reader", default="auto", choices=O.READERS, help="expert reader")
    p.add_argument(
        "--direct-io", action="store_true", help="bypass the page cache for expert reads"
    )


def add_experts_argument(p: argparse.ArgumentParser) -> None:
    """`--experts`: where expert bytes are read from (see `engine.loader`)."""
    p.add_argument(
        "--experts",
        default="auto",
        choices=O.EXPERT_SOURCES,
        help="expert bytes from the repacked file (`ssdmoe repack`) when current (auto), "
        "from the shards, or only from the repacked file",
    )


def add_prefill_step_argument(p: argparse.ArgumentParser, *, default: int | None = None) -> None:
    p.add_argument(
        "--prefill-step",
        type=arg_type(O.parse_positive, "prefill step"),
        default=default,
        metavar="N",
        help="prefill chunk in tokens"
        + (f" (default {default})" if default else " (default: from memory, at most 2048)"),
    )


def add_queue_depth_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--queue-depth",
        type=arg_type(O.parse_positive, "--queue-depth"),
        default=O.EngineOptions.queue_depth,
        metavar="N",
        help=f"reader queue depth (engine default {O.EngineOptions.queue_depth})",
    )


def add_policy_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--policy",
        default=O.EngineOptions.policy,
        type=arg_type(parse_policy),
        help="expert-cache eviction policy (default: the engine's, see docs/cache-policy.md)",
    )


def add_max_tokens_argument(p: argparse.ArgumentParser, *, default: int | None = 256) -> None:
    p.add_argument(
        "--max-tokens",
        type=arg_type(O.parse_positive, "max tokens"),
        default=default,
        metavar="N",
        help="longest reply, in tokens",
    )


def add_sampling_arguments(p: argparse.ArgumentParser) -> None:
    """--max-tokens, --temp, --top-p, --seed."""
    add_max_tokens_argument(p)
    p.add_argument(
        "--temp", type=arg_type(O.parse_temp), default=0.0, help="temperature (0: greedy)"
    )
    p.add_argument(
        "--top-p", type=arg_type(O.parse_top_p), default=0.0, help="nucleus sampling, 0..1 (0: off)"
    )
    p.add_argument("--seed", type=arg_type(O.parse_seed), default=None, help="sampling seed")


def sampling_options(args: argparse.Namespace) -> O.SamplingOptions:
    """What `add_sampling_arguments` parsed, as the one sampling object."""
    return O.SamplingOptions(
        max_tokens=args.max_tokens, temp=args.temp, top_p=args.top_p, seed=args.seed
    )


def add_model_arguments(p: argparse.ArgumentParser) -> None:
    """Everything `EngineOptions` holds (generate, the server)."""
    add_model_argument(p)
    add_k_argument(p)
    add_prefill_k_argument(p)
    add_expert_cache_argument(p)
    add_dtype_argument(p)
    add_reader_arguments(p)
    add_experts_argument(p)
    p.add_argument(
        "--prefetch",
        action="store_true",
        help="read the next layer's predicted experts while this layer computes (off by default: "
        "it only pays where the prediction is good; see docs/benchmarks.md)",
    )
    add_routing_trace_argument(p)


def add_routing_trace_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--routing-trace",
        default=None,
        metavar="FILE",
        help="route every MoE layer by this recorded trace (any format `ssdmoe trace replay` "
        "reads; K, layers and experts must match the model): measures the cache on real "
        "routing; the tokens are not the model's own",
    )


def engine_options(args: argparse.Namespace, **overrides) -> O.EngineOptions:
    """The typed options from the arguments `add_model_arguments` defined (absent ones
    keep their defaults)."""
    values = {
        name: getattr(args, name)
        for name in (
            "model",
            "k",
            "prefill_k",
            "expert_cache",
            "dtype",
            "reader",
            "direct_io",
            "experts",
            "prefetch",
            "prefill_step",
            "queue_depth",
            "policy",
            "routing_trace",
        )  # fmt: skip
        if getattr(args, name, None) is not None
    }
    values.update(overrides)
    return O.EngineOptions(**values)


def read_prompt(text: str) -> str:
    """`--prompt` text, or stdin for '-' (bytes decoded strictly: one line on bad UTF-8)."""
    import sys

    if text == "-":
        return O.decode_text(sys.stdin.buffer.read(), "the prompt on stdin")
    return O.check_text(text)


def add_distributed_argument(p: argparse.ArgumentParser) -> None:
    """`--distributed`: one rank of an expert-parallel `mlx.launch` (docs/distributed.md)."""
    p.add_argument(
        "--distributed",
        action="store_true",
        help="expert-parallel across the ranks of `mlx.launch` (each rank streams its share "
        "of the experts; rank 0 talks to the user): see docs/distributed.md",
    )


def distributed_run(body: Callable[[argparse.Namespace, object], int]):
    """A command's `run(args)`: `body(args, None)`, or with `--distributed` this rank's
    `engine.distributed` handle, inside its guard (errors end the whole launch)."""

    def run(args: argparse.Namespace) -> int:
        if not getattr(args, "distributed", False):
            return body(args, None)
        from ssdmoe_tui.engine.distributed.group import start

        dist = start()
        with dist.guard():
            dist.exit_code = int(body(args, dist) or 0)
        return dist.exit_code

    return run


def resolve_model_path(spec: str, quiet: bool = False, option: str = "--model"):
    """'' -> the demo model (created on first use, with a visible message). `option`:
    the flag that gave `spec`, named in an error (`bench --fit DIR`: '--fit DIR: no such
    file or folder', not '--model')."""
    import sys

    from ssdmoe_tui.engine.run.open import resolve_model_spec
    from ssdmoe_tui.errors import SsdmoeError
    from ssdmoe_tui.models.resolve import cli_progress

    def say(msg: str) -> None:
        print(msg, file=sys.stderr)

    try:
        return resolve_model_spec(
            spec,
            say=(lambda _: None) if quiet else say,
            download=None if quiet else cli_progress(),
        )
    except SsdmoeError as e:
        text = str(e)
        if option == "--model" or not text.startswith("--model "):
            raise
        raise type(e)(option + text[len("--model") :]) from None


def add_speculate_arguments(p: argparse.ArgumentParser, *, oracle: bool = False) -> None:
    """--speculate and --draft-depth (generate, serve; the bench adds oracle[:P] lists)."""
    modes = "off, auto, ngram, mtp" + (", oracle[:P]" if oracle else "")
    p.add_argument(
        "--speculate", default="off", metavar="MODE",
        help=f"speculative decoding ({modes}): draft tokens from the conversation (ngram) "
        "and verify them in one pass, greedy output unchanged on CPU; on MLX-CUDA a verify "
        "pass's logits differ from one-token decode (up to 0.28 on the H200), so near-ties "
        "may flip tokens there, and auto drafts nothing (unless --exact-verify); auto: the "
        "best drafter the "
        "checkpoint has (docs/engine.md, 'Speculative decoding')",
    )  # fmt: skip
    p.add_argument(
        "--draft-depth", type=arg_type(O.parse_draft_depth), default=None, metavar="D",
        help=f"draft tokens per round, 1..{O.MAX_DRAFT_DEPTH} (default auto: the governor "
        "prices each round and drafts only where it pays)",
    )  # fmt: skip
    p.add_argument(
        "--exact-verify", action="store_true",
        help="with --speculate: compute each verify pass in one-token decode's shapes "
        "(attention and recurrent layers token by token, dense matmuls row by row), so "
        "greedy tokens equal plain decode's on MLX-CUDA too, and auto drafts there; it "
        "costs part of what a verify pass saves (docs/engine.md, 'Exact verify')",
    )  # fmt: skip


def speculation(args: argparse.Namespace) -> O.Speculation:
    """--speculate / --draft-depth / --exact-verify as one value (one line when bad; a
    depth or an exact verify without speculation does nothing, so it is refused rather
    than ignored)."""
    spec = O.parse_speculate(args.speculate, depth=args.draft_depth)
    if args.draft_depth is not None and not spec.on:
        raise BadValueError(
            f"--draft-depth {args.draft_depth} drafts nothing without --speculate "
            "(add --speculate ngram, auto or mtp, or drop --draft-depth)"
        )
    if getattr(args, "exact_verify", False):
        if not spec.on:
            raise BadValueError(O.EXACT_NEEDS_SPECULATE)
        spec = replace(spec, exact=True)
    return spec

"""`ssdmoe trace replay`: hit rates of the expert-cache policies on a recorded routing trace."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from ssdmoe_tui.errors import BadValueError

DEFAULT_POLICIES = "lru,lfu-decay,arc,layer-lru,layer-lfu,cycle-lfu,belady"


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("trace", help="replay expert-routing traces against cache policies")
    tsub = p.add_subparsers(dest="trace_command", metavar="ACTION", required=True)
    r = tsub.add_parser(
        "replay",
        help="hit rate of each cache policy at each budget",
        description="Replay a routing trace (one recorded with `ssdmoe generate --trace FILE`, "
        "a route_trace v1 CSV, or a vLLM moe_routes.jsonl) against expert-cache policies and "
        "budgets.",
    )
    r.add_argument("trace", help="trace file (record one with `ssdmoe generate --trace FILE`)")
    r.add_argument(
        "--policy",
        default=DEFAULT_POLICIES,
        help=f"comma list; 'belady' is the offline optimum (default: {DEFAULT_POLICIES})",
    )
    size = r.add_mutually_exclusive_group()
    size.add_argument(
        "--budget", help="comma list of cache sizes in experts per layer (default: 1,2,4,8 x K)"
    )
    size.add_argument("--budget-mib", help="comma list of cache sizes in MiB")
    r.add_argument(
        "--expert-mib",
        type=float,
        help="MiB per expert for --budget-mib (default: from the trace, if it says)",
    )
    r.add_argument(
        "--per-layer",
        action="store_true",
        help="a separate cache per layer of the budget's size (default: one global cache)",
    )
    r.add_argument(
        "--decode-only", action="store_true", help="skip prefill steps (cold cache at decode)"
    )
    r.add_argument(
        "--warmup", type=int, default=0, help="decode tokens that warm the cache, uncounted"
    )
    r.add_argument(
        "--decode-tokens", type=int, default=None, metavar="N",
        help="replay only the first N decode tokens of the trace (prefill kept): run it at "
        "several N to see whether more history helps a policy",
    )  # fmt: skip
    r.add_argument(
        "--prefetch",
        action="store_true",
        help="also replay the engine's co-occurrence prefetch (issued, used, wasted experts)",
    )
    r.add_argument(
        "--rows", type=int, default=1, metavar="B",
        help="B sequences decoding together, each from its own offset of the trace (as "
        "`bench --batch` routes them), one cache: also prints each policy's misses per "
        "token per sequence against one sequence's (what batching saves in bytes)",
    )  # fmt: skip
    r.add_argument("--json", metavar="OUT", help="also write the results as JSON ('-': stdout)")
    p.set_defaults(func=run)
    r.set_defaults(func=run)


def _numbers(text: str, what: str) -> list[float]:
    out = []
    for part in text.split(","):
        try:
            v = float(part)
        except ValueError:
            raise BadValueError(f"bad {what} {part.strip()!r} in {text!r}") from None
        if not v > 0:
            raise BadValueError(f"{what} must be > 0, got {part.strip()!r}")
        out.append(v)
    return out


def run(args: argparse.Namespace) -> int:
    from ssdmoe_tui.bench.trace_replay import BELADY, replay
    from ssdmoe_tui.engine.policy.policies import make_policy
    from ssdmoe_tui.engine.policy.traces import read_trace

    if args.warmup < 0:
        raise BadValueError(f"--warmup must be >= 0, got {args.warmup}")
    if args.decode_tokens is not None and args.decode_tokens < 1:
        raise BadValueError(f"--decode-tokens must be >= 1, got {args.decode_tokens}")
    if args.rows < 1:
        raise BadValueError(f"--rows must be >= 1, got {args.rows}")
    if args.rows > 1 and args.per_layer:
        raise BadValueError("--rows replays one global cache, not --per-layer")
    policies = [p.strip() for p in args.policy.split(",") if p.strip()]
    for p in policies:
        if p != BELADY:
            make_policy(p, 1, 1)  # validates the name before any work
    trace = read_trace(args.trace)
    # rows before head: the rows' offsets spread over the whole trace, as the bench's;
    # each row alone over the same steps is its one-sequence baseline
    cut = (lambda t: t) if args.decode_tokens is None else (lambda t: t.head(args.decode_tokens))
    alone = [cut(trace.rows(args.rows, i)) for i in range(args.rows)] if args.rows > 1 else []
    trace = cut(trace.rows(args.rows))
    meta = trace.meta
    layers, k = max(1, meta.num_layers), meta.k
    if args.per_layer and args.budget_mib:
        raise BadValueError("--per-layer takes --budget (experts per layer), not --budget-mib")
    budgets = _budgets(args, meta, layers, k)

    def replayed(tr) -> list:  # noqa: ANN001 - a Trace
        return [
            (label, replay(
                tr,
                p,
                slots,
                per_layer=args.per_layer,
                decode_only=args.decode_only,
                warmup=args.warmup,
                prefetch=args.prefetch and p != BELADY,
            ))
            for label, slots in budgets
            for p in policies
        ]  # fmt: skip

    results = replayed(trace)
    singles = [replayed(t) for t in alone] or None
    _print_header(args, trace, layers, results)
    _print_table(budgets, policies, results, per_layer=args.per_layer, layers=layers)
    if singles is not None:
        _print_rows(args.rows, budgets, policies, results, singles)
    if args.prefetch:
        _print_prefetch(meta, results)
    if args.json:
        _write_json(args, trace, layers, results, singles)
    return 0


def _misses_per_sequence(res, rows: int, tokens: int) -> float:  # noqa: ANN001 - ReplayResult
    """Counted misses a decode token per sequence."""
    return (res.lookups - res.hits) / max(1, tokens * rows)


def _rows_figures(rows: int, results: list, singles: list[list], tokens: int) -> list[tuple]:
    """Per (budget, policy): misses a token per sequence for `rows` rows together, the
    mean of each row alone, and their ratio (the bytes a token per sequence batching
    leaves, against one stream; the bench's B = 1 is row 0 alone)."""
    out = []
    for i, (label, res) in enumerate(results):
        b = _misses_per_sequence(res, rows, tokens)
        s = sum(_misses_per_sequence(one[i][1], 1, tokens) for one in singles) / len(singles)
        out.append((label, res.policy, b, s, b / s if s else float("nan")))
    return out


def _print_rows(rows: int, budgets, policies, results: list, singles: list[list]) -> None:  # noqa: ANN001
    """--rows: each policy's misses a token per sequence, B rows against one."""
    tokens = _counted_tokens(results)
    figures = {
        (lb, p): (b, s, r) for lb, p, b, s, r in _rows_figures(rows, results, singles, tokens)
    }
    print(
        f"misses a decode token per sequence, {rows} rows together / each alone (mean) "
        f"(x: the bytes a token per sequence batching leaves), over {tokens} decode steps:"
    )
    head = ["budget", *policies]
    table = [head] + [
        [label]
        + [
            f"{figures[label, p][0]:.1f}/{figures[label, p][1]:.1f} {figures[label, p][2]:.2f}x"
            for p in policies
        ]
        for label, _ in budgets
    ]
    _print_aligned(table)


def _counted_tokens(results: list) -> int:
    """The decode tokens the counted lookups come from (the same in every result)."""
    return results[0][1].counted_steps if results else 0


def _print_aligned(table: list[list[str]]) -> None:
    """Rows of cells: the first column left-aligned, the others right-aligned."""
    widths = [max(len(r[i]) for r in table) for i in range(len(table[0]))]
    for r in table:
        print(
            "  ".join(
                c.rjust(w) if i else c.ljust(w)
                for i, (c, w) in enumerate(zip(r, widths, strict=True))
            )
        )


def _budgets(args: argparse.Namespace, meta, layers: int, k: int) -> list[tuple[str, int]]:  # noqa: ANN001
    """(label, slots) per budget: --budget-mib over the expert size, else --budget
    experts per layer (whole ones with --per-layer; default 1, 2, 4, 8 x K)."""
    budgets: list[tuple[str, int]] = []
    if args.budget_mib:
        expert_mib = args.expert_mib or _trace_expert_mib(meta.extra)
        if not expert_mib:
            raise BadValueError(f"{args.trace} does not give expert sizes: pass --expert-mib")
        for mib in _numbers(args.budget_mib, "--budget-mib"):
            budgets.append((f"{mib:g} MiB", int(mib / expert_mib)))
    else:
        per = _numbers(args.budget, "--budget") if args.budget else [m * k for m in (1, 2, 4, 8)]
        for b in per:
            if args.per_layer and b != int(b):
                raise BadValueError(
                    f"--per-layer --budget counts whole experts per layer, got {b:g}"
                )
            slots = int(b) if args.per_layer else int(round(b * layers))
            budgets.append((f"{b:g}/layer", slots))
    return budgets


def _print_header(args: argparse.Namespace, trace, layers: int, results: list) -> None:  # noqa: ANN001
    """The trace's shape and what the hit rates count."""
    from ssdmoe_tui.bench.trace_replay import next_token_overlap

    meta = trace.meta
    mode = "per-layer caches" if args.per_layer else "one global cache"
    print(
        f"{Path(args.trace).name}: {meta.model or '?'} ({meta.source}), {layers} layers x "
        f"{meta.num_experts} experts, K={meta.k}; {len(trace.steps) - trace.decode_steps()} prefill "
        f"+ {trace.decode_steps()} decode steps; next-token overlap "
        f"{next_token_overlap(trace):.3f}"
    )
    if meta.note:
        print(f"note: {meta.note}")
    counted = results[0][1].lookups if results else 0
    print(
        f"{mode}; hit % over {counted} decode lookups"
        + (", prefill not replayed" if args.decode_only else ", prefill warms the cache")
        + (f", first {args.warmup} decode tokens uncounted" if args.warmup else "")
    )


def _print_prefetch(meta, results: list) -> None:  # noqa: ANN001
    """--prefetch: what the co-occurrence prefetcher issued and how much of it was used."""
    from ssdmoe_tui.bench.trace_replay import BELADY

    mib = _trace_expert_mib(meta.extra)
    print("prefetch (co-occurrence, K ids per layer; a prefetched expert counts as a miss):")
    for label, res in results:
        if res.policy == BELADY:
            continue
        n, used = res.prefetch_issued, res.prefetch_used
        size = (lambda x: f" ({x * mib:.0f} MiB)") if mib else (lambda x: "")
        print(
            f"  {label} {res.policy}: issued {n}{size(n)}, used {used}, wasted "
            f"{n - used}{size(n - used)}, precision {used / n if n else 0:.2f}"
        )


def _write_json(
    args: argparse.Namespace, trace, layers: int, results: list, singles: list | None
) -> None:  # noqa: ANN001
    """--json: the results to stdout (`-`) or atomically to a file."""
    meta = trace.meta
    doc = {
        "trace": str(args.trace),
        "meta": {
            "model": meta.model,
            "source": meta.source,
            "k": meta.k,
            "num_layers": layers,
            "num_experts": meta.num_experts,
        },
        "per_layer": args.per_layer,
        "decode_only": args.decode_only,
        "warmup": args.warmup,
        "decode_steps": trace.decode_steps(),
        "results": [{"budget": label, **res.to_json()} for label, res in results],
    }
    if singles is not None:
        tokens = _counted_tokens(results)
        doc["rows"] = args.rows
        doc["rows_vs_one"] = [
            {
                "budget": label,
                "policy": policy,
                "misses_per_token_per_sequence": round(b, 4),
                "one_sequence_misses_per_token": round(s, 4),
                "vs_one": round(r, 4),
            }
            for label, policy, b, s, r in _rows_figures(args.rows, results, singles, tokens)
        ]
    text = json.dumps(doc, indent=1)
    if args.json == "-":
        print(text)
    else:
        from ssdmoe_tui.atomic import atomic_write_text

        atomic_write_text(Path(args.json), text + "\n")


def _trace_expert_mib(extra: dict) -> float | None:
    sizes = [b for b in extra.get("expert_bytes", []) if b]
    return sum(sizes) / len(sizes) / 2**20 if sizes else None


def _print_table(budgets, policies, results, *, per_layer: bool, layers: int) -> None:
    by = {(label, res.policy): res for label, res in results}
    head = ["budget", "slots", "x/layer"] + policies
    rows = []
    for label, slots in budgets:
        per = slots if per_layer else slots / layers
        rows.append(
            [label, str(slots), f"{per:.1f}"]
            + [f"{100 * by[label, p].hit_rate:.1f}" for p in policies]
        )
    timing = ["us/lookup", "", ""] + [
        f"{sum(r.us_per_lookup for lb, r in results if r.policy == p) / len(budgets):.2f}"
        for p in policies
    ]
    _print_aligned([head, *rows, timing])

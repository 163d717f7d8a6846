"""`ssdmoe bench --model A --fit B`: stream A, or hold B (a lower-bit copy) whole in memory.

One run measures A streamed (the bench's own configuration at the trained K) and B
resident in plain mlx-lm (`mlx_lm.load`, the bench's resident-baseline code, the same
prompt, K, dtype and greedy decoding): decode and prefill tok/s, peak memory, size on
disk, and with `--quality TEXT` both perplexities and B's next-token agreement with A
(bench/quality.py, teacher-forced on the same text). B runs only when its weights and
the run's KV cache fit in the memory available (`available_memory_bytes`); otherwise its
row says "cannot run: needs X, Y available" and holds no number.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ssdmoe_tui.errors import BadValueError
from ssdmoe_tui.units import human_bytes

Log = Callable[[str], None]

#: What must match for B to be a copy of A (the text config's keys, then the index's).
_SAME = ("model_type", "hidden_size", "num_hidden_layers", "vocab_size")


@dataclass(frozen=True)
class FitModel:
    """B, read once before anything is measured (a wrong folder fails in a second)."""

    path: Path
    quantization: dict | None
    checkpoint_bytes: int


def prepare_fit(path: Path, a_config: dict, a_index) -> FitModel:  # noqa: ANN001
    """Check that B is a checkpoint of A's architecture; one line naming what differs."""
    from ssdmoe_tui.bench.bench import _checkpoint_bytes, _quantization
    from ssdmoe_tui.checkpoint import arch
    from ssdmoe_tui.engine.experts.index import load_index
    from ssdmoe_tui.engine.model.loader import _load_config

    path = Path(path)
    if not path.is_dir():
        raise BadValueError(f"--fit {path}: model folder not found")
    config = _load_config(path)
    index, _ = load_index(path)
    mine, theirs = arch.text_config(config), arch.text_config(a_config)
    for key in _SAME:
        a = theirs.get(key, a_config.get(key))
        b = mine.get(key, config.get(key))
        if a != b:
            raise BadValueError(f"--fit {path}: not a copy of --model ({key} {b!r}, not {a!r})")
    for key in ("num_layers", "num_experts"):
        if getattr(index, key) != getattr(a_index, key):
            raise BadValueError(
                f"--fit {path}: not a copy of --model ({key} {getattr(index, key)}, not "
                f"{getattr(a_index, key)})"
            )
    return FitModel(path, _quantization(config), _checkpoint_bytes(path, index))


def run_bench_fit(opts, log: Log, on_partial: Callable[[dict], None]) -> dict:  # noqa: ANN001
    """`run_bench` with B's row added at the end; B is checked before A is measured."""
    from ssdmoe_tui.bench.bench import run_bench
    from ssdmoe_tui.engine.experts.index import load_index
    from ssdmoe_tui.engine.model.loader import _load_config

    check_fit_options(opts)
    a = Path(opts.engine.model)
    if not a.is_dir():
        raise BadValueError(f"--model {a}: model folder not found")
    fit = prepare_fit(opts.fit, _load_config(a), load_index(a)[0])

    def after(s, result: dict) -> None:  # noqa: ANN001 - bench._BenchSetup
        result["fit"] = run_fit(opts, s, fit, result, log)

    return run_bench(opts, log, on_partial, after=after)


def _streamed_row(result: dict, k: int) -> dict | None:
    """A's row: the first configuration at K without prefetch."""
    return next(
        (r for r in result.get("configs", []) if r["k"] == k and not r.get("prefetch")), None
    )


def fit_k(ks: list[int], trained_k: int) -> int:
    """The K both rows run at: the trained K when measured, else the first K."""
    return trained_k if trained_k in ks else ks[0]


def run_fit(opts, s, fit: FitModel, result: dict, log: Log) -> dict:  # noqa: ANN001
    """B's row (or why it cannot run), and A's figures beside it, into one dict."""
    from ssdmoe_tui.bench.bench import resident_baseline
    from ssdmoe_tui.memory import available_memory_bytes

    k = fit_k(s.ks, s.trained_k)
    a = _streamed_row(result, k)
    kv = int(a["kv_cache_bytes"]) if a else 0
    need = fit.checkpoint_bytes + kv
    avail = available_memory_bytes()
    out: dict = {
        "k": k,
        "streamed": {
            "model": str(s.path.resolve()),
            **_streamed_figures(a, s.ckpt_bytes, s.config),
        },
        "resident": {
            "model": str(fit.path.resolve()),
            "quantization": fit.quantization,
            "checkpoint_bytes": fit.checkpoint_bytes,
            "needs_bytes": need,
            "needs": "its weights (size on disk) + the KV cache of A's run at this K",
            "available_bytes": avail,
        },
    }
    row = out["resident"]
    if need > avail:
        row["status"] = f"cannot run: needs {human_bytes(need)}, {human_bytes(avail)} available"
        log(f"fit {fit.path.name}: {row['status']}")
        return out
    log(f"fit {fit.path.name}: plain mlx-lm, whole model resident, K={k}")
    b = resident_baseline(
        fit.path, [k], s.prompt, opts.decode_tokens, s.act_dtype, opts.engine.prefill_step, log
    )[k]
    row["status"] = "ran"
    row.update({key: v for key, v in b.items() if key != "k"})
    if a is not None:
        same = 0
        for x, y in zip(a["token_ids"], b["token_ids"], strict=False):
            if x != y:
                break
            same += 1
        row["tokens_common_prefix_with_streamed"] = same
    if opts.quality_text is not None:
        out["quality"] = _fit_quality(opts, fit.path, k, s.act_dtype, log)
    return out


def _streamed_figures(a: dict | None, ckpt_bytes: int, config: dict) -> dict:
    from ssdmoe_tui.bench.bench import _quantization

    base = {"quantization": _quantization(config), "checkpoint_bytes": ckpt_bytes}
    if a is None:
        return {**base, "status": "not measured (no configuration at this K)"}
    keys = (
        "expert_cache", "expert_cache_budget_bytes", "resident_memory_bytes", "kv_cache_bytes",
        "prefill_tok_s", "decode_tok_s", "peak_mlx_memory_bytes", "peak_rss_bytes",
        "hit_rate", "page_cache",
    )  # fmt: skip
    return {**base, "status": "ran", **{key: a.get(key) for key in keys}}


def _fit_quality(opts, path: Path, k: int, dtype, log: Log) -> dict:  # noqa: ANN001
    """Teacher-force the text through A streamed (the reference) and B resident."""
    import gc

    import mlx.core as mx
    import mlx_lm

    from ssdmoe_tui.bench.bench import _close, _open
    from ssdmoe_tui.bench.quality import RANDOM_WEIGHTS_NOTE, measure_against, text_tokens
    from ssdmoe_tui.engine.model.loader import cast_model, set_model_k

    log(f"fit quality: {opts.quality_text}, A streamed (reference) and B resident at K={k}")
    runner = _open(opts, opts.budgets[0], k, log=log)
    model = None
    try:
        tokens = text_tokens(runner.sm.tokenizer, opts.quality_text, opts.quality_tokens)
        model, _ = mlx_lm.load(str(path))
        cast_model(model, dtype)
        set_model_k(model, k)
        q = measure_against(runner.sm, k, model, tokens, log=log)
    finally:
        del model
        _close(runner)
        gc.collect()
        mx.clear_cache()
    return {
        "text": str(opts.quality_text),
        "text_tokens": len(tokens),
        "note": RANDOM_WEIGHTS_NOTE,
        **q,
    }


def check_fit_options(opts) -> None:  # noqa: ANN001
    """--fit compares B with A's streamed row: the modes without one are refused."""
    if opts.distributed is not None:
        raise BadValueError("--fit is not supported with --distributed")
    if opts.baseline_only:
        raise BadValueError("--fit needs A's streamed row: not with --baseline-only")
    if opts.engine.routing_trace is not None:
        raise BadValueError("--fit compares the models' own tokens: not with --routing-trace")


#: (top line, bottom line) of each column of the fit table.
_HEADS = [
    ("", ""), ("", "bits"), ("on", "disk"), ("decode", "tok/s"), ("prefill", "tok/s"),
    ("peak", "RSS"), ("peak", "MLX"), ("perplexity", "(--quality)"), ("same top", "token as A"),
]  # fmt: skip


def _fit_rows(fit: dict) -> list[list[str]]:
    """A's row and B's; B's is [name, bits, size, status] when it did not run."""
    a, b, q = fit["streamed"], fit["resident"], fit.get("quality") or {}

    def bits(x: dict) -> str:
        qz = x.get("quantization") or {}
        return f"{qz.get('bits', '?')} gs{qz.get('group_size', '?')}"

    def num(x: float | None, fmt: str) -> str:
        return "-" if x is None else format(x, fmt)

    def size(x: int | None) -> str:
        return "-" if not x else human_bytes(x, None)

    qa, qb = q.get("streamed") or {}, q.get("resident") or {}
    rows = [
        [
            "A streamed", bits(a), size(a["checkpoint_bytes"]), num(a.get("decode_tok_s"), ".2f"),
            num(a.get("prefill_tok_s"), ".1f"), size(a.get("peak_rss_bytes")),
            size(a.get("peak_mlx_memory_bytes")), num(qa.get("perplexity"), ".2f"),
            "ref" if q else "-",
        ]
    ]  # fmt: skip
    if b["status"] != "ran":
        return rows + [["B resident", bits(b), size(b["checkpoint_bytes"]), b["status"]]]
    rows.append(
        [
            "B resident", bits(b), size(b["checkpoint_bytes"]), num(b["decode_tok_s"], ".2f"),
            num(b["prefill_tok_s"], ".1f"), size(b["peak_rss_bytes"]),
            size(b["peak_mlx_memory_bytes"]), num(qb.get("perplexity"), ".2f"),
            num(qb.get("agreement_with_streamed"), ".1%"),
        ]
    )  # fmt: skip
    return rows


def fit_table(fit: dict, markdown: bool = False, width: int = 100) -> str:
    """The two rows side by side: A streamed, B resident (or why B cannot run)."""
    import textwrap

    a, b = fit["streamed"], fit["resident"]
    rows = _fit_rows(fit)
    n = len(_HEADS)
    title = (
        f"stream or fit at K={fit['k']}: A = {Path(a['model']).name}, B = {Path(b['model']).name}"
    )
    legend = (
        f"A streamed: the engine's row at K={fit['k']} (expert cache "
        f"{a.get('expert_cache', '-')}). B resident: plain mlx-lm, every weight in memory. "
        "same top token: share of the text's positions where B's most likely next token is "
        "A's (teacher-forced)."
    )
    if markdown:
        heads = [f"{t} {u}".strip() for t, u in _HEADS]
        lines = ["| " + " | ".join(heads) + " |", "|" + "---|" * n]
        lines += ["| " + " | ".join(r + [""] * (n - len(r))) + " |" for r in rows]
        return title + "\n\n" + "\n".join(lines) + "\n\n" + legend
    full = [r for r in rows if len(r) == n]  # a "cannot run" row is shorter
    widths = [max(len(t), len(u), *(len(r[i]) for r in full)) for i, (t, u) in enumerate(_HEADS)]
    lines = [
        "  ".join(h.rjust(w) for h, w in zip(line, widths, strict=True)).rstrip()
        for line in zip(*_HEADS, strict=True)
    ]
    for r in rows:
        cells = "  ".join(c.rjust(w) for c, w in zip(r[:3], widths[:3], strict=True))
        lines.append(cells + "  " + ("  ".join(
            c.rjust(w) for c, w in zip(r[3:], widths[3:], strict=True)) if len(r) == n else r[3]
        ))  # fmt: skip
    return title + "\n" + "\n".join(lines) + "\n" + textwrap.fill(legend, width)

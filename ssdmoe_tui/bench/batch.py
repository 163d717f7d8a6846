"""`ssdmoe bench --batch N[,N...]`: B sequences decoding together (engine/run/batch.py).

Each configuration runs on a fresh engine: B different prompts (the bench's fixed prompt,
each rotated by another offset, so routing differs), greedy, each asked for the bench's
decode tokens. Rows join one after another (one prefill at a time); the measured window
is the steady state from the step the last row joined to the step the first row ended,
so every step in it decodes B rows. Trace-driven runs (`--routing-trace`) start each row
at another offset of the trace (`len(trace) * i / B`).

Reported per configuration: aggregate decode tok/s (tokens of all rows / window time),
per-stream tok/s (steps / time), requested and device MiB/token per sequence (window bytes
/ tokens of all rows), experts looked up per MoE layer per step (the union over the rows),
the expert cache's hit rate, and the longest stall of a join (one prefill chunk plus its
first token, run between two decode steps). With `check_alone`, every row is run again
alone (a batch of one, from its own trace offset) on the same engine and the tokens
compared (`rows_equal_alone`, `token_mismatch_rate`): the measurement of exactness on a
GPU, where a kernel may change with the number of rows. When the model fits, bench.py
runs mlx-lm's resident `BatchGenerator` on the same rows beside each B
(`bench/batch_compare.py`).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from ssdmoe_tui.options import CacheBudget

Log = Callable[[str], None]


def row_prompts(prompt: list[int], b: int) -> list[list[int]]:
    """B prompts of the same length: `prompt` rotated by i/B of its length (row 0: as is)."""
    n = len(prompt)
    out = []
    for i in range(b):
        s = (n * i) // b
        out.append(prompt[s:] + prompt[:s])
    return out


def _per_step(x: float | None, n: float) -> float | None:
    return None if x is None or not n else x / n


def _round(x: float | None, nd: int = 4) -> float | None:
    return None if x is None else round(x, nd)


def _alone(runner, spec) -> list[int]:  # noqa: ANN001 - a Runner and a SeqSpec
    """`spec` decoded alone (a batch of one row), from its own trace offset: a rerun
    through `Runner.generate` would continue the trace where the batch left it."""
    from ssdmoe_tui.engine.run.batch import BatchRunner
    from ssdmoe_tui.engine.run.runner import Done

    one = BatchRunner(runner, max_batch=1)
    one.add(spec)
    for _ in range(4 * (spec.max_tokens + len(spec.prompt)) + 16):  # bounded: a step per token
        for _uid, ev in one.step():
            if isinstance(ev, Done):
                return ev.result.tokens
    raise RuntimeError(f"batch row {spec.uid} alone did not finish")


def run_batch_config(
    runner,  # a fresh engine's Runner for this (K, budget)
    decode_tokens: int,
    budget: CacheBudget,
    prompt: list[int],
    b: int,
    log: Log,
    check_alone: bool = False,
) -> dict:
    """B rows on `runner`; the steady-state window's figures."""
    from ssdmoe_tui.engine.run.batch import BatchRunner, SeqSpec

    k, sm = runner.k, runner.sm
    eos = sm.tokenizer.eos_token_ids
    try:
        sm.tokenizer.eos_token_ids = set()  # decode exactly N tokens
        batch = BatchRunner(runner, max_batch=b)
        routing = sm.cache.routing
        span = len(routing.decode) if routing is not None else 0
        prompts = row_prompts(prompt, b)
        offsets = [(span * i) // b for i in range(b)]
        for i, p in enumerate(prompts):
            batch.add(SeqSpec(i, p, max_tokens=decode_tokens, trace_offset=offsets[i]))
        t_all = time.perf_counter()
        results, w, full_steps, union = _steady_window(batch, sm, b)
        total_s = time.perf_counter() - t_all
        row_tokens = full_steps * b
        fig = batch.figures
        out = {
            **runner.conditions(),
            "expert_cache": str(budget),
            "batch": b,
            "window_steps": full_steps,
            "window_s": round(w.t, 4),
            "aggregate_decode_tok_s": _round(_per_step(row_tokens, w.t), 3),
            "per_stream_decode_tok_s": _round(_per_step(full_steps, w.t), 3),
            "requested_mib_per_token_per_sequence": _round(w.bytes_read / row_tokens / 2**20),
            "device_mib_per_token_per_sequence": None
            if w.device_bytes is None
            else _round(w.device_bytes / row_tokens / 2**20),
            "union_experts_per_layer": union,
            "hit_rate": round(w.hit_rate, 6),
            "max_join_stall_s": round(fig.max_stall_s, 4),
            "mean_step_s": round(fig.decode_s / fig.steps, 5) if fig.steps else None,
            "total_s": round(total_s, 3),
            "token_ids": [results[i].tokens for i in range(b)],
        }
        if check_alone:
            specs = [
                SeqSpec(i, p, max_tokens=decode_tokens, trace_offset=off)
                for i, (p, off) in enumerate(zip(prompts, offsets, strict=True))
            ]
            out |= _against_alone(runner, specs, [results[i].tokens for i in range(b)])
        log(_row_line(out, k, budget, b, w.hit_rate, fig.max_stall_s))
        return out
    finally:
        sm.tokenizer.eos_token_ids = eos


def _steady_window(batch, sm, b: int):  # noqa: ANN001, ANN202 - BatchRunner, StreamedModel
    """Run `batch` to the end; (results by row, the Snapshot difference over the steps
    that decoded all `b` rows, how many steps that was, union experts per layer call)."""
    from ssdmoe_tui.engine.run.runner import Done, Snapshot

    results = {}
    start = end = None
    u0 = c0 = u1 = c1 = 0
    full_steps = steps0 = 0
    while not batch.idle:
        for uid, ev in batch.step():
            if isinstance(ev, Done):
                results[uid] = ev.result
        if start is None and batch.rows == b and not batch.waiting:
            start = Snapshot.take(sm)
            u0, c0 = sm.times.union_experts, sm.times.union_calls
            steps0 = batch.figures.steps
        elif start is not None and end is None and batch.rows < b:
            end = Snapshot.take(sm)
            u1, c1 = sm.times.union_experts, sm.times.union_calls
            full_steps = batch.figures.steps - steps0  # each decoded all B rows
    if start is None or end is None or full_steps < 1:
        raise ValueError(
            f"--batch {b}: no step decoded all {b} rows together; raise --decode-tokens"
        )
    union = _round((u1 - u0) / (c1 - c0), 3) if c1 > c0 else None
    return results, end - start, full_steps, union


def _against_alone(runner, specs: list, batched: list[list[int]]) -> dict:  # noqa: ANN001
    """Each row run alone: how many rows equal their batched tokens, and the share of
    tokens that differ."""
    alone = [_alone(runner, spec) for spec in specs]
    diff = sum(
        sum(x != y for x, y in zip(a, got, strict=False))
        for a, got in zip(alone, batched, strict=True)
    )
    decoded = sum(spec.max_tokens for spec in specs)
    return {
        "rows_equal_alone": sum(a == got for a, got in zip(alone, batched, strict=True)),
        "token_mismatch_rate": round(diff / decoded, 6),
    }


def _row_line(out: dict, k: int, budget: CacheBudget, b: int, hit: float, stall: float) -> str:
    equal = f", {out['rows_equal_alone']}/{b} rows equal alone" if "rows_equal_alone" in out else ""
    return (
        f"  K={k} budget={budget} batch={b}: aggregate {out['aggregate_decode_tok_s'] or 0:.2f} "
        f"tok/s, per stream {out['per_stream_decode_tok_s'] or 0:.2f}, "
        f"{out['requested_mib_per_token_per_sequence'] or 0:.2f} MiB/token/sequence, "
        f"union {out['union_experts_per_layer']} experts/layer, hit {hit:.1%}, "
        f"join stall <= {stall * 1e3:.0f} ms{equal}"
    )


def derive(batch_results: list[dict]) -> None:
    """Against B=1 of the same (K, budget): aggregate speed-up and MiB/token ratio."""
    ones = {(r["k"], r["expert_cache"]): r for r in batch_results if r["batch"] == 1}
    for r in batch_results:
        one = ones.get((r["k"], r["expert_cache"]))
        if one is None:
            continue
        a, a1 = r["aggregate_decode_tok_s"], one["aggregate_decode_tok_s"]
        m, m1 = (
            r["requested_mib_per_token_per_sequence"],
            one["requested_mib_per_token_per_sequence"],
        )
        r["aggregate_vs_b1"] = round(a / a1, 3) if a and a1 else None
        r["mib_per_token_vs_b1"] = round(m / m1, 3) if m is not None and m1 else None


def table(batch_results: list[dict], markdown: bool = True) -> str:
    """The batch measurements as a Markdown table."""
    head = (
        "| K | expert cache | B | aggregate tok/s | vs B=1 | per stream tok/s | "
        "MiB/tok/seq asked | vs B=1 | union experts/layer | cache hit | join stall | "
        "rows equal alone | resident BatchGenerator tok/s | engine / BatchGenerator |"
    )
    lines = [head, "|" + "---|" * 14]
    for r in batch_results:
        bg = r.get("resident_batch_generator") or {}
        ran = bg.get("status") == "ran"
        equal = r.get("rows_equal_alone")
        equal_txt = "-" if equal is None else f"{equal}/{r['batch']}"
        lines.append(
            f"| {r['k']} | {r['expert_cache']} | {r['batch']} | "
            f"{r['aggregate_decode_tok_s']} | {r.get('aggregate_vs_b1', '-')} | "
            f"{r['per_stream_decode_tok_s']} | {r['requested_mib_per_token_per_sequence']} | "
            f"{r.get('mib_per_token_vs_b1', '-')} | {r['union_experts_per_layer']} | "
            f"{r['hit_rate']:.1%} | {r['max_join_stall_s'] * 1e3:.0f} ms | "
            f"{equal_txt} | "
            f"{bg.get('aggregate_decode_tok_s') if ran else '-'} | "
            f"{bg.get('engine_vs_resident') if ran else '-'} |"
        )
    return "\n".join(lines)

"""`ssdmoe bench --batch N[,N...]`: B sequences decoding together (engine/run/batch.py).

Each configuration runs on a fresh engine: B different prompts (the bench's fixed prompt,
each rotated by another offset, so routing differs), greedy, each asked for the bench's
decode tokens. Rows join one after another (one prefill at a time), and a row's
`max_tokens` is held at its tokens + the decode tokens until the last row has joined, so
every row decodes that many tokens beside all the others whatever the joins cost (a join
sized to a time budget takes several steps; 8 decode tokens at B = 4 once left no step
with all four rows). The measured window is the steady state from the step the last row
joined to the step the first row ended, so every step in it decodes B rows. Trace-driven
runs (`--routing-trace`) keep the rows `len(trace) / B` decode steps apart along the trace:
row i starts `len(trace) * i / B` steps past where row 0 is when it joins
(`_Spread`).

Reported per configuration: aggregate decode tok/s (tokens of all rows / window time),
per-stream tok/s (steps / time), requested and device MiB/token per sequence (window bytes
/ tokens of all rows), experts looked up per MoE layer per step (the union over the rows),
the expert cache's hit rate, and the longest stall of a join (one prefill chunk plus its
first token, run between two decode steps). With a `join_prompt` (`--batch-join N`),
`join_probe` then measures what issue 43 bounds: B rows decode while an N-token prompt
joins them; the longest gap between two tokens of a decoding row against their median
gap before it joined. With `check_alone`, every row is run again
alone (a batch of one, from its own trace offset) on the same engine and the tokens
compared (`rows_equal_alone`, `token_mismatch_rate`): the measurement of exactness on a
GPU, where a kernel may change with the number of rows. When the model fits, bench.py
runs mlx-lm's resident `BatchGenerator` on the same rows beside each B
(`bench/batch_compare.py`).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from ssdmoe_tui.engine.run.join_chunks import JOIN_BUDGET_S, JOIN_CHUNK
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
    join_prompt: list[int] | None = None,
) -> dict:
    """B rows on `runner`; the steady-state window's figures (and the join probe's)."""
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
        specs = [
            SeqSpec(i, p, max_tokens=decode_tokens, trace_offset=offsets[i])
            for i, p in enumerate(prompts)
        ]
        t_all = time.perf_counter()
        results, w, full_steps, union, places = _steady_window(batch, sm, b, specs, decode_tokens)
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
            # trace-driven: each row's place along the trace as the window starts, not
            # wrapped (its decode step is the place modulo `routing_decode_steps`);
            # `_Spread`: the rows' distance along it sets how much they share
            "trace_places": places if span else None,
            "hit_rate": round(w.hit_rate, 6),
            "max_join_stall_s": round(fig.max_stall_s, 4),
            "mean_step_s": round(fig.decode_s / fig.steps, 5) if fig.steps else None,
            "total_s": round(total_s, 3),
            "token_ids": [results[i].tokens for i in range(b)],
        }
        if check_alone:
            alone = [  # each from the trace step it started at (`_Spread`)
                SeqSpec(i, p, max_tokens=len(results[i].tokens), trace_offset=s.trace_offset)
                for i, (p, s) in enumerate(zip(prompts, specs, strict=True))
            ]
            out |= _against_alone(runner, alone, [results[i].tokens for i in range(b)])
        log(_row_line(out, k, budget, b, w.hit_rate, fig.max_stall_s))
        if join_prompt and b > 1:  # the others: rows already decoding
            out["join_probe"] = join_probe(runner, prompts, join_prompt, offsets)
            log(_join_line(out["join_probe"]))
        return out
    finally:
        sm.tokenizer.eos_token_ids = eos


class _Spread:
    """Adds rows to a batch one at a time, each once none waits, at its trace offset past
    the place row 0 has reached along the trace then (its tokens so far).

    Rows join one at a time anyway (a step runs one prefill chunk, of the first waiting
    row), so adding the next one when the last has joined changes no timing. What it
    changes is where each row sits along the trace: with offsets fixed before the joins,
    rows that joined about `len(trace) / B` steps after one another lined up on nearly
    one trace step and routed alike (H100, 2026-12-07 sixteenth session: three of four
    rows within a step of each other, 0.64 of one stream's bytes; rows that joined
    slower, 0.83-0.87). Row i now stays its offset apart from row 0, less the steps
    row 0 decodes while row i prefills, whatever the joins cost."""

    def __init__(self, batch, specs: list) -> None:  # noqa: ANN001 - a BatchRunner
        self.batch, self.specs, self.added = batch, specs, 0

    def poll(self, lead_tokens: int) -> None:
        """Add the next row if none waits; `lead_tokens`: row 0's tokens so far."""
        if self.added < len(self.specs) and not self.batch.waiting:
            spec = self.specs[self.added]
            if self.added:
                spec.trace_offset += lead_tokens
            self.batch.add(spec)
            self.added += 1


def _steady_window(batch, sm, b: int, specs: list, decode_tokens: int):  # noqa: ANN001, ANN202
    """Run `batch` to the end; (results by row, the Snapshot difference over the steps
    that decoded all `b` rows, how many steps that was, union experts per layer call,
    each row's trace step as the window starts).
    Until the last row joins, each row's `max_tokens` is held at its tokens + the decode
    tokens, so all of them decode together for that many steps."""
    from ssdmoe_tui.engine.run.runner import Done, Snapshot, TokenEvent

    results = {}
    start = end = None
    u0 = c0 = u1 = c1 = 0
    full_steps = steps0 = 0
    made = [0] * len(specs)
    places: list[int] = []
    spread = _Spread(batch, specs)
    spread.poll(0)
    while not batch.idle:
        for uid, ev in batch.step():
            if isinstance(ev, TokenEvent):
                made[uid] += 1
            elif isinstance(ev, Done):
                results[uid] = ev.result
        spread.poll(made[0])
        if start is None and not (batch.rows == b and not batch.waiting):
            for spec, n in zip(specs, made, strict=True):
                spec.max_tokens = n + decode_tokens if n else decode_tokens
        if start is None and batch.rows == b and not batch.waiting:
            start = Snapshot.take(sm)
            u0, c0 = sm.times.union_experts, sm.times.union_calls
            steps0 = batch.figures.steps
            places = [spec.trace_offset + n for spec, n in zip(specs, made, strict=True)]
        elif start is not None and end is None and batch.rows < b:
            end = Snapshot.take(sm)
            u1, c1 = sm.times.union_experts, sm.times.union_calls
            full_steps = batch.figures.steps - steps0  # each decoded all B rows
    if start is None or end is None or full_steps < 1:
        raise ValueError(
            f"--batch {b}: no step decoded all {b} rows together; raise --decode-tokens"
        )
    union = _round((u1 - u0) / (c1 - c0), 3) if c1 > c0 else None
    return results, end - start, full_steps, union, places


JOIN_PROBE_S = 240.0  # a join that has not reached its first token by then is cut short


def join_probe(
    runner,  # noqa: ANN001 - a Runner
    prompts: list[list[int]],
    join_prompt: list[int],
    offsets: list[int],
    *,
    join_budget_s: float | None = JOIN_BUDGET_S,
    join_chunk: int | None = JOIN_CHUNK,
    deadline_s: float = JOIN_PROBE_S,
) -> dict:
    """`prompts` decode (greedy) until steady, then `join_prompt` joins them: the longest
    gap between two tokens of a decoding row while it prefills, against their median gap
    before (issue 43: a 1k-token prompt must not stall the others more than 0.3 s).
    `offsets`: the rows' trace offsets, each past row 0's place when it joins (`_Spread`);
    `join_budget_s` / `join_chunk`: the BatchRunner's (None, 128: the token cap alone)."""
    from ssdmoe_tui.engine.run.batch import BatchRunner, SeqSpec
    from ssdmoe_tui.engine.run.runner import PrefillProgress, TokenEvent

    b = len(prompts)
    batch = BatchRunner(runner, max_batch=b + 1, join_chunk=join_chunk, join_budget_s=join_budget_s)
    specs = [
        SeqSpec(i, p, max_tokens=1 << 30, trace_offset=off)
        for i, (p, off) in enumerate(zip(prompts, offsets, strict=True))
    ]
    spread = _Spread(batch, specs)
    spread.poll(0)
    lead = 0  # row 0's tokens: where it is along the trace
    last: dict[int, float] = {}
    before: list[float] = []  # decoding rows' gaps before the join
    during: list[float] = []  # ... while it prefills (until its first token)
    chunks: list[int] = []
    joined_at = first_token_s = None
    stall0, steady = 0.0, 0
    t_end = time.perf_counter() + deadline_s

    def arrived(events: list) -> None:  # as a server's loop gets them (`BatchRunner.emit`)
        nonlocal first_token_s, lead
        now = time.perf_counter()
        for uid, ev in events:
            if uid == 0 and isinstance(ev, TokenEvent):
                lead += 1
            if uid == b:
                if isinstance(ev, PrefillProgress):
                    chunks.append(ev.done)
                elif isinstance(ev, TokenEvent):
                    first_token_s = now - joined_at
            elif isinstance(ev, TokenEvent):
                if uid in last:
                    (during if joined_at is not None else before).append(now - last[uid])
                last[uid] = now

    batch.emit = arrived  # the rows' tokens of a step run inside a joining chunk
    while time.perf_counter() < t_end:
        arrived(batch.step())
        spread.poll(lead)
        if first_token_s is not None:
            break
        if joined_at is None and batch.rows == b:
            steady += 1
            if steady == 4:  # a few steps of all rows: the join starts
                stall0 = batch.figures.max_stall_s
                batch.figures.max_stall_s = 0.0
                batch.figures.join_pauses = 0  # the rows' own joins paused too
                batch.add(SeqSpec(b, join_prompt, max_tokens=1, trace_offset=offsets[0]))
                joined_at = time.perf_counter()
    # The batch is left as it is (the rows' caches are dropped with it): a join cut short
    # by the deadline would go on prefilling in a drain.
    sizes = [y - x for x, y in zip(chunks, chunks[1:], strict=False) if y > x]
    med = sorted(before)[len(before) // 2] if before else None
    return {
        "join_tokens": len(join_prompt),
        "rows_decoding": b,
        "join_budget_s": join_budget_s,
        "join_chunk": join_chunk,
        "median_token_gap_before_s": _round(med),
        "max_token_gap_s": _round(max(during)) if during else None,
        "max_join_stall_s": round(batch.figures.max_stall_s, 4),
        "first_joins_max_stall_s": round(stall0, 4),
        "join_first_token_s": _round(first_token_s, 3),
        "chunks": len(sizes),
        "chunk_tokens_max": max(sizes) if sizes else None,
        "prefilled_tokens": chunks[-1] if chunks else 0,
        "finished": first_token_s is not None,
        "pauses": batch.figures.join_pauses,
    }


def _join_line(j: dict) -> str:
    gap = j["max_token_gap_s"] or 0.0
    return (
        f"  join probe: a {j['join_tokens']}-token prompt joining {j['rows_decoding']} rows: "
        f"longest token gap {gap * 1e3:.0f} ms (median before "
        f"{(j['median_token_gap_before_s'] or 0) * 1e3:.0f} ms), stall <= "
        f"{j['max_join_stall_s'] * 1e3:.0f} ms, {j['chunks']} chunks, its first token after "
        f"{j['join_first_token_s']} s" + ("" if j["finished"] else " (cut short)")
    )


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

"""The decode loop of a speculating turn: each round either steps one token (d = 0, the
plain decode step) or verifies d drafts in one pass (verify.py), as the governor prices
it (governor.py). Token events, K records, counters and the KV cache's coverage are
what `Runner._decode_loop` gives: the cache always holds the prompt and every generated
token but the last.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, field

import mlx.core as mx

from ssdmoe_tui.engine.run.prefill_stop import ChunkUndo
from ssdmoe_tui.engine.spec.drafts import Drafter, NgramDrafter, NoDrafter, OracleDrafter
from ssdmoe_tui.engine.spec.exact import ExactVerify
from ssdmoe_tui.engine.spec.governor import (
    AUTO_DEPTH,
    Acceptance,
    CostModel,
    Governor,
)
from ssdmoe_tui.engine.spec.verify import (
    TRIM,
    UNDO,
    SpecStats,
    always_trims,
    rewind_mode,
    verify_chunk,
)
from ssdmoe_tui.options import Speculation


@dataclass
class SpecMemory:
    """What a Runner keeps between turns: the cost model and each drafter's acceptance;
    with `--exact-verify`, the model's exact-verify table and a cost model of its own (an
    exact chunk costs more than a plain one: turns of both, as the bench alternates
    them, would otherwise price each other's passes)."""

    costs: CostModel
    acceptance: dict[str, Acceptance] = field(default_factory=dict)
    exact: ExactVerify | None = None  # built on the first `--exact-verify` turn
    exact_costs: CostModel | None = None

    def exact_verify(self, model) -> ExactVerify:  # noqa: ANN001 - the streamed model
        """The model's exact-verify module table (one walk of its modules, then kept)."""
        if self.exact is None or self.exact.model is not model:
            self.exact = ExactVerify(model)
        return self.exact

    def costs_for(self, exact: bool) -> CostModel:
        if not exact:
            return self.costs
        if self.exact_costs is None:
            c = self.costs
            self.exact_costs = CostModel(c.num_experts, c.k, c.expert_bytes)
        return self.exact_costs


def make_drafter(sm, spec: Speculation, reference: Sequence[int],  # noqa: ANN001
                 also: Sequence[Sequence[int]] = ()) -> Drafter:  # fmt: skip
    if spec.mode == "mtp":
        from ssdmoe_tui.engine.spec.mtp import check_mtp

        check_mtp(sm.config, sm.path)  # raises: one line saying why not
    if spec.mode == "oracle":
        if not reference:
            raise ValueError("the oracle drafts from a previous greedy run: none was given")
        from ssdmoe_tui.checkpoint.arch import text_config

        vocab = int(text_config(sm.config).get("vocab_size") or 2)
        return OracleDrafter(reference, spec.p, vocab, also=also)
    if spec.mode == "none":
        return NoDrafter()
    return NgramDrafter()  # auto: no MTP drafter is built (mtp.py), so prompt lookup


def acceptance_key(spec: Speculation) -> str:
    """Drafts of one source share a running acceptance (each oracle P its own)."""
    return f"oracle:{spec.p:g}" if spec.mode == "oracle" else spec.mode


def memory(runner) -> SpecMemory:  # noqa: ANN001
    if runner.spec_memory is None:
        sm = runner.sm
        runner.spec_memory = SpecMemory(
            CostModel(sm.index.num_experts, runner.k, sm.index.expert_bytes)
        )
    return runner.spec_memory


def spec_loop(
    runner,  # noqa: ANN001 - engine.run.runner.Runner
    begun,  # noqa: ANN001 - runner.Begun
    sampler: Callable[[mx.array], mx.array],
    tokens: list[int],
    detok,  # noqa: ANN001
    max_tokens: int,
    should_stop: Callable[[], bool],
    spec: Speculation,
    reference: Sequence[int],
    also: Sequence[Sequence[int]] = (),
) -> Generator:
    """Runner._decode_loop with speculative rounds; returns (finish, generated tokens the
    KV cache holds).

    A d = 0 round where every expert is resident is pipelined as in `_decode_loop`: the
    next step is built on this one's lazy token while it computes. That next step is
    the following round's unless that round prices drafts higher: then it is given back
    (one token: trimmed, or the recurrent state put back) and the round verifies."""
    sm, stats, start = runner.sm, begun.stats, begun.start
    cache, counters, routing = begun.cache, sm.cache.counters, sm.cache.routing
    drafter = make_drafter(sm, spec, reference, also)
    mem = memory(runner)
    costs = mem.costs_for(spec.exact)
    costs.k = runner.k
    acceptance = mem.acceptance.setdefault(acceptance_key(spec), Acceptance())
    # built (or refused, in one line: a mixer it cannot split) before the turn's first token
    exact = mem.exact_verify(sm.model) if spec.exact else None
    governor = Governor(costs, acceptance, spec.depth)
    figures = stats.spec = SpecStats(str(spec), costs=costs)
    step = runner._decode_step(begun, sampler)
    eos = runner.eos_ids()
    meter = sm.routing_mass
    drafter.extend(begun.prompt)
    finish = "length"
    emit = [begun.token]
    snapshot = type(start)  # runner.Snapshot (imported there: no cycle)
    dstart = snapshot.take(sm)
    depth_cap = spec.depth or AUTO_DEPTH
    # Passes are priced in wall time: a pipelined d = 0 round overlaps the next step's
    # graph with this one's compute, which CPU time would not show (measured on the CPU
    # demo: priced in process CPU time the governor drafted where it lost, 0.97x at 70 %)
    clock = time.perf_counter
    pending: tuple[mx.array, int] | None = None  # the next d = 0 step, already scheduled
    give_back = None  # how to undo `pending`: a ChunkUndo, TRIM, or None (it cannot be)
    seen_before = None  # the logits processors' tokens before `pending` was built
    trims = always_trims(cache)  # the rewind mode is TRIM whatever the chunk's size
    # A round is priced by its whole cycle, from its start to the next round's: what a
    # pipelined d = 0 step overlaps (the events, the bookkeeping) is then in its price,
    # as it is in a verify round's, which overlaps nothing. The turn's first round is
    # cold too, but carries the turn's start: it prices C(1), not L.
    last: tuple | None = None
    # A pipelined d = 0 round (the next step already built, every expert held: it reads
    # nothing) is priced as a one-token pass: its cycle is kept by `costs` and folded in
    # order only when a price is built (CostModel.note_step), not through `_price` each
    # round: on a 1 ms GPU token the speculative loop's bookkeeping showed (the demo's
    # chat reply, nothing drafted: `none` 0.97-0.98x plain on the H100)
    fast_t0: float | None = None  # such a round's start, when the round before was one
    h0 = m0 = 0  # the cache's lookups when the round began (each round sets them)
    while True:
        for t in emit:
            event = runner.token_event(t, tokens, eos, detok, stats, dstart.t)
            yield event
            if event.stop:
                finish = "stop"
            if finish == "stop" or len(tokens) >= max_tokens:
                break
        drafter.extend(emit)
        if finish == "stop" or len(tokens) >= max_tokens:
            break
        if should_stop():
            finish = "cancelled"
            break
        t0 = clock()
        if fast_t0 is not None:  # the round before, priced by its whole cycle (see above)
            spent = t0 - fast_t0  # no engine work since the round's end: its lookups
            costs.note_step(spent, counters.hits + counters.misses - h0 - m0)
            figures.plain_s += spent
            figures.plain_rounds += 1
        elif last is not None:
            _price(costs, figures, t0, *last)
        h0, m0, b0, r0 = counters.hits, counters.misses, counters.bytes_read, counters.read_s
        tok = tokens[-1]
        room = max_tokens - len(tokens)  # tokens this turn may still produce
        most = min(depth_cap, room)
        # two past the most drafted: does the continuation go on past a round's own token?
        offer = drafter.propose(most + 2)
        drafts = offer[:most]
        d = 0  # no drafts on offer (most rounds): a plain step, nothing priced
        chains = False  # a verify round would build the next step on its last sample
        if drafts:
            mode = TRIM if trims else rewind_mode(cache, len(drafts) + 1)
            if mode is not None and (pending is None or give_back is not None):
                costs.all_held = sm.cache.all_frozen
                governor.rerun = mode == UNDO
                # Chain (verify.py) only where the drafts run out: where they go on, the
                # next round drafts again and a chained step would be given back (on the
                # CPU demo's repeat check chaining every round made depth 4 0.80x, 1.08x
                # without; the chained step costs its whole compute on a busy CPU)
                governor.chains = chains = (
                    trims and routing is None and len(offer) <= len(drafts) + 1
                    and room > len(drafts) + 1 and runner._can_pipeline()
                )  # fmt: skip
                choice = governor.choose(len(drafts), pending is not None)
                d = choice.depth
                figures.probes += choice.probe
        wasted = 0.0
        if d and pending is not None:  # drafts pay: give the pipelined step back
            tw = clock()
            mx.eval(pending[0])  # it runs to its end either way: its wait is W
            wasted = clock() - tw
            costs.measure_waste(wasted)
            if give_back == TRIM:
                for c in cache:
                    c.trim(1)
            else:
                give_back.restore()
            if routing is not None:
                routing.position -= 1
            if begun.window is not None:  # the processors saw the step's input: unsee it
                begun.window.seen = seen_before
            runner._masses.pop()
            pending = None
            figures.given_back += 1
        figures.depths[d] = figures.depths.get(d, 0) + 1
        if d == 0:
            cold = pending is None
            if cold:
                y_arr, k_tok = runner._schedule(step, mx.array([tok], dtype=mx.uint32))
            else:
                (y_arr, k_tok), pending = pending, None
            pipelines = room > 1 and runner._can_pipeline()
            if pipelines:
                one = TRIM if trims else rewind_mode(cache, 1)
                give_back = ChunkUndo(cache) if one == UNDO else one
                seen_before = begun.window.seen if begun.window is not None else None
                pending = runner._schedule(step, y_arr)
                mx.async_eval(pending[0])
            y = int(y_arr.item())
            emit = [y]
            stats.k_per_token.append(k_tok)
            runner._record_mass(stats)
            if drafts:  # a shadow trial: would the first draft have been right?
                acceptance.observe(int(drafts[0] == y), 1)
            n_pass, rerun_s = 1, 0.0
        else:
            cold = pipelines = False
            built: list = []  # the step chained on the chunk's last sample, if any
            chain = None
            if chains and room > d + 1 and len(offer) <= d + 1:

                def chain(last: mx.array, built: list = built) -> None:
                    if meter is not None:
                        meter.clear()  # a chunk's mass is not measured
                    seen = begun.window.seen if begun.window is not None else None
                    nxt = runner._schedule(step, last)
                    mx.async_eval(nxt[0])
                    built.append((nxt, seen))

            v = _verify(
                runner, cache, tok, drafts[:d], sampler, begun, room, eos, routing, clock, chain,
                exact,
            )  # fmt: skip
            if meter is not None:
                meter.clear()  # a chunk's mass is not measured
            if v.chained:  # every position kept: the next step is built, as when pipelined
                (pending, seen_before), give_back = built[0], TRIM
                figures.chained += 1
            elif built:  # given back inside verify_chunk (trimmed): so is its mass
                runner._masses.pop()
            emit = v.tokens
            for _ in emit:
                stats.k_per_token.append(sm.times.last_k)
                if stats.mass_log is not None:
                    stats.mass_log.append(None)
            acceptance.observe(v.accepted, min(v.accepted + 1, d))
            figures.verify_passes += 1
            figures.rerun_passes += int(v.reran)
            figures.passes += int(v.reran)
            figures.drafted += d
            figures.accepted += min(v.accepted, len(emit))
            n_pass, rerun_s = d + 1, v.rerun_s
        if d == 0 and pipelines and not cold:  # nothing read, nothing apart: a step's cycle
            fast_t0, last = t0, None
        else:  # a cold round is L unless it is the turn's first (no round before it)
            cold_l = cold and pipelines and (last is not None or fast_t0 is not None)
            fast_t0, last = None, (
                t0, 0 if cold_l else n_pass, rerun_s + wasted, counters.read_s - r0,
                counters.hits + counters.misses - h0 - m0, counters.misses - m0,
                counters.bytes_read - b0,
            )  # fmt: skip
        figures.passes += 1
        figures.tokens += len(emit)
        runner.window_figures(stats, dstart, start)
    costs.fold()
    stats.decode_s = time.perf_counter() - dstart.t
    if isinstance(drafter, OracleDrafter):
        figures.oracle = drafter.figures()
    runner.window_figures(stats, dstart, start, live=False)
    runner._masses.clear()
    # a step scheduled on the last token: the cache holds it too
    return finish, len(tokens) - 1 + (pending is not None)


def _price(costs: CostModel, figures: SpecStats, now: float, t0: float, n: int, apart_s: float,
           read_s: float, lookups: int, misses: int, bytes_read: int) -> None:  # fmt: skip
    """Measure a round that began at `t0` and ended its cycle `now`: n = 0 is a d = 0 round
    that found no step built where they pipeline (L), else a pass of n tokens. `apart_s`:
    a re-run and a given-back step's wait (W), priced apart. A plain step's whole cycle
    is kept for the turn too (what the speed speculation bought is priced against)."""
    spent = now - t0 - apart_s
    if n == 0:
        costs.measure_cold(spent)
    else:
        costs.measure(n, spent - read_s, read_s, lookups, misses, bytes_read)
        if n == 1:
            figures.plain_s += spent
            figures.plain_rounds += 1


def _verify(runner, cache, tok, drafts, sampler, begun, room, eos, routing, clock, chain,  # noqa: ANN001, ANN202
            exact):  # fmt: skip
    """One verify round (verify.py) at the live K, the trace (if any) following it;
    `chain`, `exact`: verify_chunk's (the next step built on the chunk's last sample;
    the chunk in decode's shapes)."""
    sm = runner.sm
    runner._use_k(runner.k)
    sm.cache.step()
    p0 = routing.position if routing is not None else 0

    def on_chunk(_start: int, n: int) -> None:
        routing.position = p0
        routing.chunk = n

    v = verify_chunk(
        sm.model, cache, tok, drafts, sampler, begun.window, keep_most=room, stop_ids=eos,
        on_chunk=on_chunk if routing is not None else None, clock=clock, chain=chain,
        exact=exact,
    )  # fmt: skip
    if routing is not None:
        routing.position = p0
        routing.advance(v.kept)
    return v

"""The engine thread's loop while Generates decode together (`EngineService(max_batch=N)`).

`EngineService._main` hands the first Generate here; the loop admits every Generate that
arrives (a `BatchRunner` queues those beyond `max_batch` and prefills them one at a time)
and steps the batch until no sequence is left. Another command (a load, a shutdown)
ends admissions: the sequences running finish (or are stopped), then the service runs it,
then the Generates that came after it. Each request is a `Turn` (engine/run/turn.py), as
one generation alone is (`EngineService._generate`): its own figures, token batching,
cancel (`EngineService.cancel(request_id)`), KV-pool entry and checkpoint. The loop sees
the service only through its `EngineContext`.

KV memory: the service's KV budget covers the pool and the running sequences together.
Before a sequence may start its prefill, the running caches plus its prompt must fit
(else it waits for a row to end; one sequence alone always starts), and the pool is
shrunk to what the running caches leave.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ssdmoe_tui.engine.run import protocol as P
from ssdmoe_tui.engine.run.turn import STATS_EVERY_S, EngineContext, Every, Turn, fail

if TYPE_CHECKING:
    from ssdmoe_tui.engine.run.batch import SeqSpec


class BatchLoop:
    def __init__(self, ctx: EngineContext) -> None:
        from ssdmoe_tui.engine.run.batch import BatchRunner

        self.ctx = ctx
        self.batch = BatchRunner(ctx.runner, max_batch=ctx.max_batch)
        self.batch.admit = self._fits
        self.batch.emit = self._dispatch  # rows' tokens decoded inside a joining chunk: now
        self.turns: dict[str, Turn] = {}
        self.stats = Every(STATS_EVERY_S)  # one live sample per period for the whole batch
        self.per_token: int | None = None  # KV bytes per token, measured on the first row

    # ------------------------------------------------------------------ loop
    def run(self, first: P.Generate) -> P.Command | None:
        """Serve until the batch is empty; returns a command that ended admissions."""
        ctx = self.ctx
        self._add(first)
        held: P.Command | None = None
        try:
            while True:
                while held is None:
                    cmd = ctx.next_command()
                    if cmd is None:
                        break
                    if isinstance(cmd, P.Generate) and not ctx.speculates(cmd):
                        self._add(cmd)
                    else:  # another command, or a Generate that speculates: alone, after
                        held = cmd
                if self.batch.idle:
                    return held
                try:
                    events = self.batch.step()
                except Exception as e:  # noqa: BLE001 - one line for every request in it
                    self._fail_all(e)
                    return held
                self._dispatch(events)
                ctx.show_batch(self.batch.figures.as_dict(self.batch.rows, self.batch.waiting))
        finally:
            ctx.set_pool_budget(ctx.kv_budget_bytes)  # nothing runs: the pool has it all
            if not self.turns:
                ctx.stop_spent()  # a stop of everything is spent once nothing runs
            ctx.emit(P.PhaseChanged("idle"))

    def _dispatch(self, events: list) -> None:
        """Each row's events to its turn (a turn that ends is done)."""
        for rid, ev in events:
            turn = self.turns.get(rid)
            if turn is not None:
                result = turn.on_event(ev)
                if result is not None:
                    self._done(turn, result)

    # ------------------------------------------------------------------ admission
    def _add(self, cmd: P.Generate) -> None:
        from ssdmoe_tui.engine.run.batch import SeqSpec
        from ssdmoe_tui.engine.run.sampling import processors_for, sampler_for

        rid = cmd.request_id
        try:
            turn = Turn(self.ctx, cmd, stats=self.stats)
            sampling = turn.sampling
            cache, reused = turn.take_cache()
            spec = SeqSpec(
                rid,
                turn.prompt,
                max_tokens=sampling.max_tokens,
                sampler=sampler_for(sampling, own_key=True),
                cache=cache,
                reused_tokens=reused if cache is not None else 0,
                k=cmd.k,
                should_stop=turn.should_stop,
                logits_processors=processors_for(sampling),
            )
        except Exception as e:  # noqa: BLE001 - this request only
            self._fail(rid, e)
            return
        self.turns[rid] = turn
        self.batch.add(spec)

    def _fits(self, spec: SeqSpec) -> bool:
        """Running caches + this prompt within the KV budget; shrinks the pool to the rest."""
        from ssdmoe_tui.engine.run.kv_pool import cache_nbytes, kv_bytes_per_token

        running = self.batch.running_caches()
        used = sum(cache_nbytes(c) for c in running)
        if self.per_token is None and running:
            self.per_token = max(kv_bytes_per_token(c) for c in running)
        need = (self.per_token or 0) * (len(spec.prompt) - spec.reused_tokens)
        if spec.cache is not None:
            need += cache_nbytes(spec.cache)
        budget = self.ctx.kv_budget_bytes
        if used + need > budget:
            return False
        self.ctx.set_pool_budget(max(0, budget - used - need))
        return True

    def _resize_pool(self) -> None:
        """The pool gets what the running caches leave of the KV budget."""
        from ssdmoe_tui.engine.run.kv_pool import cache_nbytes

        used = sum(cache_nbytes(c) for c in self.batch.running_caches())
        self.ctx.set_pool_budget(max(0, self.ctx.kv_budget_bytes - used))

    # ------------------------------------------------------------------ end
    def _done(self, turn: Turn, result) -> None:  # noqa: ANN001
        rid = turn.request_id
        turn.report(result, {"batch": self._row_figures(result)})
        del self.turns[rid]
        self._resize_pool()  # this row's cache no longer runs: the pool may hold it
        try:
            turn.keep_cache(result)
        finally:
            self.ctx.ended(rid)

    def _row_figures(self, result) -> dict:  # noqa: ANN001
        """This request's view of the batch: how many rows its decode steps had."""
        share = result.decode_share
        fig = self.batch.figures
        out = {"max_rows": fig.max_rows}
        if share is not None and share.steps:
            out["mean_rows"] = round(share.batch_rows / share.steps, 3)
        return out

    # ------------------------------------------------------------------ failures
    def _fail(self, rid: str, e: Exception) -> None:
        fail(self.ctx, rid, e)
        self.turns.pop(rid, None)
        self.ctx.ended(rid)

    def _fail_all(self, e: Exception) -> None:
        for rid in list(self.turns):
            self._fail(rid, e)

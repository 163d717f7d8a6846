"""The engine thread's loop while Generates decode together (`EngineService(max_batch=N)`).

`EngineService._main` hands the first Generate here; the loop admits every Generate that
arrives (a `BatchRunner` queues those beyond `max_batch` and prefills them one at a time)
and steps the batch until no sequence is left. Another command (a load, a shutdown)
ends admissions: the sequences running finish (or are stopped), then the service runs it,
then the Generates that came after it. Each request keeps its own figures, token
batching (~25 ms), cancel (`EngineService.cancel(request_id)`), KV-pool entry and
checkpoint, exactly as one generation alone (`EngineService._generate`).

KV memory: the service's KV budget covers the pool and the running sequences together.
Before a sequence may start its prefill, the running caches plus its prompt must fit
(else it waits for a row to end; one sequence alone always starts), and the pool is
shrunk to what the running caches leave.
"""

from __future__ import annotations

import queue
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ssdmoe_tui.engine.run import protocol as P
from ssdmoe_tui.errors import BadValueError, user_message
from ssdmoe_tui.options import check_k

if TYPE_CHECKING:
    from ssdmoe_tui.engine.run.batch import SeqSpec

TOKEN_BATCH_S = 0.025
STATS_EVERY_S = 0.2


@dataclass
class _Request:
    cmd: P.Generate
    prompt: list[int]
    tokens: list[int] = field(default_factory=list)  # not yet posted
    text: list[str] = field(default_factory=list)
    last_flush: float = 0.0
    last_prefill: float = 0.0


class BatchLoop:
    def __init__(self, service) -> None:  # noqa: ANN001 - the EngineService that runs it
        from ssdmoe_tui.engine.run.batch import BatchRunner

        self.svc = service
        self.runner = service._runner
        self.batch = BatchRunner(self.runner, max_batch=service.max_batch)
        self.batch.admit = self._fits
        self.requests: dict[str, _Request] = {}
        self.last_stats = 0.0
        self.per_token: int | None = None  # KV bytes per token, measured on the first row

    # ------------------------------------------------------------------ loop
    def run(self, first: P.Generate) -> P.Command | None:
        """Serve until the batch is empty; returns a command that ended admissions."""
        svc = self.svc
        self._add(first)
        held: P.Command | None = None
        try:
            while True:
                while held is None:
                    try:
                        cmd = svc._queue.get_nowait()
                    except queue.Empty:
                        break
                    if isinstance(cmd, P.Generate):
                        self._add(cmd)
                    elif not svc.spent_marker(cmd):
                        held = cmd
                if self.batch.idle:
                    return held
                try:
                    events = self.batch.step()
                except Exception as e:  # noqa: BLE001 - one line for every request in it
                    self._fail_all(e)
                    return held
                for rid, ev in events:
                    self._on_event(rid, ev)
                svc.batch_figures = self.batch.figures.as_dict(self.batch.rows, self.batch.waiting)
        finally:
            if svc.kv_pool is not None:  # nothing runs: the pool has the whole budget again
                svc.kv_pool.set_budget(svc.kv_budget_bytes)
            if svc._cancel.is_set() and not self.requests:
                svc._cancel.clear()  # a stop of everything is spent once nothing runs
            svc._emit(P.PhaseChanged("idle"))

    # ------------------------------------------------------------------ admission
    def _add(self, cmd: P.Generate) -> None:
        from mlx_lm.sample_utils import make_logits_processors

        from ssdmoe_tui.engine.run.batch import SeqSpec, make_row_sampler

        svc, runner = self.svc, self.runner
        rid = cmd.request_id
        try:
            sampling = cmd.sampling()
            if not cmd.prompt_tokens:
                raise BadValueError("empty prompt")
            prompt = list(cmd.prompt_tokens)
            if cmd.k is not None:
                check_k(cmd.k, runner.sm.index.num_experts, "K")
            cache, reused = svc._take_cache(cmd.session_id, prompt)
            penalties = sampling.logits_processors()
            spec = SeqSpec(
                rid,
                prompt,
                max_tokens=sampling.max_tokens,
                sampler=make_row_sampler(
                    sampling.temp, sampling.top_p, sampling.seed, sampling.min_p, sampling.top_k
                ),
                cache=cache,
                reused_tokens=reused if cache is not None else 0,
                k=cmd.k,
                should_stop=lambda: svc._cancel.is_set() or rid in svc._cancel_ids,
                logits_processors=make_logits_processors(**penalties) if penalties else (),
            )
        except Exception as e:  # noqa: BLE001 - this request only
            self._fail(rid, e)
            return
        self.requests[rid] = _Request(cmd, prompt)
        self.batch.add(spec)

    def _fits(self, spec: SeqSpec) -> bool:
        """Running caches + this prompt within the KV budget; shrinks the pool to the rest."""
        from ssdmoe_tui.engine.run.kv_pool import cache_nbytes, kv_bytes_per_token

        svc = self.svc
        running = self.batch.running_caches()
        used = sum(cache_nbytes(c) for c in running)
        if self.per_token is None and running:
            self.per_token = max(kv_bytes_per_token(c) for c in running)
        need = (self.per_token or 0) * (len(spec.prompt) - spec.reused_tokens)
        if spec.cache is not None:
            need += cache_nbytes(spec.cache)
        budget = svc.kv_budget_bytes
        if used + need > budget:
            return False
        if svc.kv_pool is not None:
            svc.kv_pool.set_budget(max(0, budget - used - need))
        return True

    def _resize_pool(self) -> None:
        """The pool gets what the running caches leave of the KV budget."""
        from ssdmoe_tui.engine.run.kv_pool import cache_nbytes

        svc = self.svc
        if svc.kv_pool is not None:
            used = sum(cache_nbytes(c) for c in self.batch.running_caches())
            svc.kv_pool.set_budget(max(0, svc.kv_budget_bytes - used))

    # ------------------------------------------------------------------ events
    def _on_event(self, rid: str, ev) -> None:  # noqa: ANN001
        from ssdmoe_tui.engine.run.runner import Done, PrefillProgress, TokenEvent

        svc = self.svc
        req = self.requests.get(rid)
        if req is None:
            return
        now = time.monotonic()
        if isinstance(ev, TokenEvent):
            req.tokens.append(ev.token)
            if ev.text:
                req.text.append(ev.text)
            if now - req.last_flush >= TOKEN_BATCH_S:
                self._flush(req, now)
            if now - self.last_stats >= STATS_EVERY_S:
                self.last_stats = now
                svc._emit(svc._sample(ev.stats, None))
        elif isinstance(ev, PrefillProgress):
            if ev.done in (0, ev.total) or now - req.last_prefill >= 0.1:
                req.last_prefill = now
                phase = "prefill" if ev.done < ev.total else "decoding"
                svc._emit(P.PhaseChanged(phase, ev.done, ev.total))
        elif isinstance(ev, Done):
            self._done(req, ev.result, now)

    def _flush(self, req: _Request, now: float) -> None:
        if req.tokens or req.text:
            self.svc._emit(P.Tokens(req.cmd.request_id, "".join(req.text), tuple(req.tokens)))
            req.tokens.clear()
            req.text.clear()
        req.last_flush = now

    def _done(self, req: _Request, result, now: float) -> None:  # noqa: ANN001
        svc, runner = self.svc, self.runner
        rid = req.cmd.request_id
        self._flush(req, now)
        stats = runner.stats_dict(result.stats)
        stats["batch"] = self._row_figures(result)
        svc._emit(
            P.GenerationDone(
                rid,
                result.text,
                tuple(req.prompt),
                tuple(result.tokens),
                result.finish_reason,
                tuple(result.stats.k_per_token),
                stats,
            )
        )
        del self.requests[rid]
        svc.last_stats = svc._sample(result.stats, result.cache)
        svc._emit(svc.last_stats)
        covered = result.covered_tokens
        session = req.cmd.session_id
        self._resize_pool()  # this row's cache no longer runs: the pool may hold it
        try:
            if result.tokens:
                svc._store_cache(session, covered, result.cache)
            elif covered and svc.kv_pool is not None:
                svc.kv_pool.put(session or "_default", covered, result.cache)
        finally:
            svc._generation_ended(rid)

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
        svc = self.svc
        svc._emit(P.EngineError(user_message(e), request_id=rid))
        svc._emit(P.GenerationDone(rid, "", (), (), "error", (), {"error": user_message(e)}))
        self.requests.pop(rid, None)
        svc._generation_ended(rid)

    def _fail_all(self, e: Exception) -> None:
        for rid in list(self.requests):
            self._fail(rid, e)

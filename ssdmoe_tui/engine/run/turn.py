"""One request's life on the engine thread (`Turn`), and what it needs of the service
(`EngineContext`).

A Generate runs one of two ways: alone (`EngineService._generate`, over `Runner.stream`)
or beside others (`engine/run/batch_loop.py`, over `BatchRunner.step`). Everything a
request does apart from the stepping is the same either way and lives here, once: its
checks, taking a cached KV prefix, the stop asked between tokens, the relay of the
runner's events (tokens batched every ~25 ms, stats sampled every ~200 ms, prefill
progress at most every 0.1 s), its `GenerationDone`, keeping the KV cache it leaves for
the session's next turn, and its failure.

The schedulers see the service only through `EngineContext`, so neither reaches into the
other's state: a new way of stepping (pipelined, speculative, batched) gets a `Turn` per
request and the context, nothing more.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Protocol

from ssdmoe_tui.engine.run import protocol as P
from ssdmoe_tui.errors import BadValueError, user_message
from ssdmoe_tui.options import check_k

if TYPE_CHECKING:
    from ssdmoe_tui.engine.run.runner import GenerationResult, Runner, RunnerEvent, TurnStats

TOKEN_BATCH_S = 0.025  # at most this often a Tokens event per request
STATS_EVERY_S = 0.2  # at most this often a StatsSample
PREFILL_EVERY_S = 0.1  # at most this often a prefill PhaseChanged (first and last always)


class EngineContext(Protocol):
    """What a scheduler (the single-sequence path, the batch loop) may use of the service
    that runs it: the loaded runner, posting events, stats samples, the KV cache of a
    session, a request's stop, its end; the batch loop also the command queue and the KV
    budget it shares with the pool."""

    runner: Runner  # the loaded model's
    max_batch: int  # rows a batch may run at once
    kv_budget_bytes: int  # the KV memory of the pool and the running sequences together

    def emit(self, event: P.Event) -> None:
        """Post an event to the client (never raises, never blocks)."""

    def sample(self, stats: TurnStats | None, cache: list | None) -> P.StatsSample:
        """A live stats sample (`cache`: the KV cache whose size it reports, if any)."""

    def close_sample(self, stats: TurnStats, cache: list) -> None:
        """Post a turn's last stats sample (the service keeps it as `last_stats`)."""

    def take_cache(self, session_id: str | None, prompt: list[int]) -> tuple[list | None, int]:
        """A KV cache holding a prefix of `prompt` (pool, else checkpoint) and its length;
        (None, 0) when none serves."""

    def keep_cache(
        self, session_id: str | None, tokens: list[int], cache: list, *, checkpoint: bool
    ) -> None:
        """Keep `cache` (holding exactly `tokens`) for the session's next turn: in memory,
        and with `checkpoint` through the KV hooks too (a turn boundary)."""

    def cancelled(self, request_id: str) -> bool:
        """Is this request (or every request) asked to stop?"""

    def speculates(self, cmd: P.Generate) -> bool:
        """Does this request speculate (engine/spec)? Then it runs alone, not in a batch."""

    def ended(self, request_id: str) -> None:
        """This request is over (done or failed): the service may go idle."""

    def next_command(self) -> P.Command | None:
        """The next queued command without waiting (None: none queued)."""

    def set_pool_budget(self, nbytes: int) -> None:
        """What the in-memory KV pool may hold now (the rest runs in the batch)."""

    def show_batch(self, figures: dict) -> None:
        """The running batch's figures (`BatchFigures.as_dict`), for the server's status."""

    def stop_spent(self) -> None:
        """A stop of every request has been honoured: the next request runs."""


class Every:
    """True at most once per `seconds` (the first call always)."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.last = 0.0

    def due(self, now: float) -> bool:
        if now - self.last >= self.seconds:
            self.last = now
            return True
        return False


def fail(ctx: EngineContext, request_id: str, error: BaseException) -> None:
    """A request that failed: one line for the user, then its GenerationDone("error")."""
    message = user_message(error)
    ctx.emit(P.EngineError(message, request_id=request_id))
    ctx.emit(P.GenerationDone(request_id, "", (), (), "error", (), {"error": message}))


class Turn:
    """One Generate from its checks to its kept cache.

    Built on the engine thread when the request starts; raises BadValueError (an empty
    prompt, a K out of range) before anything is taken. `stats`: the clock of
    the live samples (a batch shares one across its rows, so the rate stays one sample
    per STATS_EVERY_S whatever the number of requests). `live_cache`: the KV cache whose
    size the live samples report (the single path's; None in a batch)."""

    def __init__(self, ctx: EngineContext, cmd: P.Generate, *, stats: Every | None = None) -> None:
        self.ctx = ctx
        self.cmd = cmd
        self.request_id = cmd.request_id
        self.sampling = cmd.sampling
        if not cmd.prompt_tokens:
            raise BadValueError("empty prompt")
        self.prompt = list(cmd.prompt_tokens)
        if cmd.k is not None:  # a bad K refuses this request only
            check_k(cmd.k, ctx.runner.sm.index.num_experts, "K")
        self.live_cache: list | None = None
        self.meter = None  # engine.distributed's per-token meter (serve --distributed)
        self._stats = stats or Every(STATS_EVERY_S)
        self._flush_every = Every(TOKEN_BATCH_S)
        self._prefill_every = Every(PREFILL_EVERY_S)
        self._tokens: list[int] = []  # not yet posted
        self._text: list[str] = []

    def take_cache(self) -> tuple[list | None, int]:
        """The cached KV prefix of this request's prompt, and how many tokens it holds."""
        return self.ctx.take_cache(self.cmd.session_id, self.prompt)

    def should_stop(self) -> bool:
        """Asked between tokens (and during prefill): this request, or all, stopped."""
        return self.ctx.cancelled(self.request_id)

    # ------------------------------------------------------------------ relay
    def relay(self, events: Iterable[RunnerEvent]) -> GenerationResult | None:
        """Relay a runner's whole stream; its result."""
        result = None
        for ev in events:
            got = self.on_event(ev)
            if got is not None:
                result = got
        self.flush()
        return result

    def on_event(self, ev: RunnerEvent) -> GenerationResult | None:
        """Relay one runner event as protocol events; the result when it is `Done`."""
        from ssdmoe_tui.engine.run.runner import Done, PrefillProgress, TokenEvent

        now = time.monotonic()
        if isinstance(ev, TokenEvent):
            if self.meter is not None:
                self.meter.on_token(ev.stats.generated_tokens)
            self._tokens.append(ev.token)
            if ev.text:
                self._text.append(ev.text)
            if self._flush_every.due(now):
                self._post_tokens()
            if self._stats.due(now):
                self.ctx.emit(self.ctx.sample(ev.stats, self.live_cache))
        elif isinstance(ev, PrefillProgress):
            if self._prefill_every.due(now) or ev.done in (0, ev.total):
                self._prefill_every.last = now
                phase = "prefill" if ev.done < ev.total else "decoding"
                self.ctx.emit(P.PhaseChanged(phase, ev.done, ev.total))
        elif isinstance(ev, Done):
            return ev.result
        return None

    def flush(self) -> None:
        """Post the tokens not yet posted."""
        self._post_tokens()
        self._flush_every.last = time.monotonic()

    def _post_tokens(self) -> None:
        if self._tokens or self._text:
            self.ctx.emit(P.Tokens(self.request_id, "".join(self._text), tuple(self._tokens)))
            self._tokens.clear()
            self._text.clear()

    # ------------------------------------------------------------------ end
    def report(self, result: GenerationResult, extra: dict | None = None) -> None:
        """The rest of the tokens, the GenerationDone (with the runner's figures and
        `extra`), and the turn's last stats sample."""
        self.flush()
        stats = self.ctx.runner.stats_dict(result.stats)
        stats.update(extra or {})
        self.ctx.emit(
            P.GenerationDone(
                self.request_id,
                result.text,
                tuple(self.prompt),
                tuple(result.tokens),
                result.finish_reason,
                tuple(result.stats.k_per_token),
                stats,
            )
        )
        self.ctx.close_sample(result.stats, result.cache)

    def keep_cache(self, result: GenerationResult) -> None:
        """Keep the KV cache the turn leaves for the session's next turn: a turn that
        generated is a turn boundary (checkpointed too); one cancelled during prefill is
        kept in memory only."""
        covered = result.covered_tokens
        if result.tokens:
            self.ctx.keep_cache(self.cmd.session_id, covered, result.cache, checkpoint=True)
        elif covered:
            self.ctx.keep_cache(self.cmd.session_id, covered, result.cache, checkpoint=False)

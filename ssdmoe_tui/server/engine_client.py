"""The server's one seam to the engine: `AsyncEngine` drives an `EngineService` (any
`protocol.EngineClient` whose KV hooks can be set) from asyncio.

Events arrive on the engine thread through the service's `post` callback and are handed
to the event loop with `call_soon_threadsafe`; each generation's events go to its `Job`.
Up to `max_batch` generations run at once (the service decodes them together,
engine/run/batch_loop.py; 1 with a service that runs one at a time); other requests
wait in a bounded FIFO and get a 429 when it is full. A job keeps its slot until its
`GenerationDone` arrives, also when its client has gone: the next request starts
only once a slot is free.

Another process layout (rank 0 of a distributed launch) plugs in by passing its own
`make_service`.
"""

from __future__ import annotations

import asyncio
import collections
import sys
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from ssdmoe_tui.engine.run import protocol as P
from ssdmoe_tui.server.errors import ApiError
from ssdmoe_tui.terminal_text import visible


class ServiceLike(P.EngineClient, Protocol):
    """The engine the server drives: an EngineClient that takes token ids and whose KV
    hooks the server sets (its prompt cache, server/prompt_cache.py)."""

    kv_hooks: Any


MakeService = Callable[[Callable[[P.Event], None]], ServiceLike]


class EngineFailed(Exception):
    """The model could not be loaded (one line, from the engine)."""


@dataclass
class Job:
    request_id: str
    events: asyncio.Queue = field(default_factory=asyncio.Queue)
    done: asyncio.Event = field(default_factory=asyncio.Event)
    result: P.GenerationDone | None = None
    cancel_requested: bool = False
    keep_slot: bool = False  # its end does not free the engine (a step of a longer request)
    cached_before: int | None = None  # prompt tokens cached before the request, if a step ran first
    warnings: tuple[str, ...] = ()  # what the request asked that did not apply (Pending)
    _client: AsyncEngine | None = None

    def cancel(self) -> None:
        """Stop this generation (between two tokens). Harmless once it has ended."""
        if not self.done.is_set() and not self.cancel_requested and self._client is not None:
            self.cancel_requested = True
            self._client._cancel(self)


class Ticket:
    """A request's place in the queue for the engine. After `wait` returns the caller
    holds the engine (and gives it back by submitting or `release_unused`); before that,
    `abandon` gives the place (or a slot handed over meanwhile) back. Both are safe to
    call in any order, as often as a cleanup path likes."""

    def __init__(self, client: AsyncEngine, fut: asyncio.Future) -> None:
        self._client = client
        self._fut = fut
        self.taken = False  # wait() returned: the caller holds the engine

    @property
    def ahead(self) -> int:
        """Requests ahead of this one (0 once it holds the engine)."""
        waiters = self._client._waiters
        return waiters.index(self._fut) + 1 if self._fut in waiters else 0

    async def wait(self) -> None:
        try:
            await asyncio.shield(self._fut)
        except asyncio.CancelledError:
            self.abandon()
            raise
        self.taken = True

    def abandon(self) -> None:
        if self.taken:
            return
        self.taken = True  # nothing more to give back
        waiters = self._client._waiters
        if self._fut in waiters:
            waiters.remove(self._fut)
            self._fut.cancel()
        elif self._fut.done() and not self._fut.cancelled():
            self._client._release()  # the slot was ours (free, or handed over meanwhile)


class AsyncEngine:
    """The engine seen from the event loop: requests get a slot (or wait in the queue),
    each generation's events go to its Job."""

    def __init__(
        self, make_service: MakeService, *, max_queue: int = 8, max_batch: int | None = 1
    ) -> None:
        """`max_batch`: slots (None: the service's own `max_batch` once it has loaded)."""
        self._make_service = make_service
        self.max_queue = max_queue
        self.max_batch = max_batch or 1
        self._max_batch_setting = max_batch
        self.service: ServiceLike | None = None
        self.info: P.ModelInfo | None = None
        self.tokenizer: Any = None
        self.default_k: int = 0
        self.phase: P.PhaseChanged = P.PhaseChanged("idle")
        self.last_sample: P.StatsSample | None = None
        self.notices: collections.deque[str] = collections.deque(maxlen=20)
        self.on_notice: Callable[[str], None] = lambda msg: print(
            f"ssdmoe: {visible(msg)}", file=sys.stderr
        )  # a notice may quote a file's name: escaped
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loaded: asyncio.Future | None = None
        self._jobs: dict[str, Job] = {}
        self._running = 0  # slots held
        self._waiters: collections.deque[asyncio.Future] = collections.deque()
        self.generations = 0

    # ------------------------------------------------------------------ lifecycle
    async def start(self, load: P.LoadModel, kv_hooks: Any = None) -> P.ModelInfo:
        """Start the engine thread, load the model, load the tokenizer (off the loop)."""
        self._loop = asyncio.get_running_loop()
        self._loaded = self._loop.create_future()
        self.service = self._make_service(self._post)
        if kv_hooks is not None:
            self.service.kv_hooks = kv_hooks
        self.service.start()
        self.service.submit(load)
        self.info = await self._loaded
        self.default_k = self.info.k
        if self._max_batch_setting is None:  # what the engine chose for this model
            batching = getattr(self.service, "batching", False)
            self.max_batch = max(1, int(getattr(self.service, "max_batch", 1))) if batching else 1
        self.tokenizer = await asyncio.to_thread(_load_tokenizer, self.info.path)
        return self.info

    def shutdown(self) -> None:
        if self.service is not None:
            self.service.shutdown()

    # ------------------------------------------------------------------ events (engine thread)
    def _post(self, event: P.Event) -> None:
        loop = self._loop
        if loop is None:
            return
        try:
            loop.call_soon_threadsafe(self._on_event, event)
        except RuntimeError:  # the loop is closed: the server is going down
            pass

    def _on_event(self, ev: P.Event) -> None:
        if isinstance(ev, P.ModelLoaded):
            if self._loaded is not None and not self._loaded.done():
                self._loaded.set_result(ev.info)
            self.info = ev.info
        elif isinstance(ev, P.PhaseChanged):
            self.phase = ev
        elif isinstance(ev, P.StatsSample):
            self.last_sample = ev
        elif isinstance(ev, P.Notice):
            self.notices.append(ev.message)
            self.on_notice(ev.message)
        elif isinstance(ev, P.EngineError) and ev.request_id is None:
            if self._loaded is not None and not self._loaded.done():
                self._loaded.set_exception(EngineFailed(ev.message))
            else:
                self.notices.append(ev.message)
                self.on_notice(f"error: {ev.message}")
        elif isinstance(ev, (P.Tokens, P.GenerationDone, P.EngineError)):
            job = self._jobs.get(ev.request_id)
            if job is None:
                return
            job.events.put_nowait(ev)
            if isinstance(ev, P.GenerationDone):
                job.result = ev
                job.done.set()
                del self._jobs[ev.request_id]
                self.generations += 1
                if not job.keep_slot:
                    self._release()

    # ------------------------------------------------------------------ slots
    @property
    def queued(self) -> int:
        return len(self._waiters)

    @property
    def busy(self) -> bool:
        return self._running > 0

    @property
    def running(self) -> int:
        return self._running

    @property
    def batch_stats(self) -> dict | None:
        """The engine's batch figures (engine/run/batch.py BatchFigures), if it batches."""
        figures = getattr(self.service, "batch_figures", None)
        if self.max_batch <= 1 and figures is None:
            return None
        return {"max_batch": self.max_batch, "running": self._running, **(figures or {})}

    def reserve(self) -> Ticket:
        """A place in the FIFO for the engine, taken now (a full queue is a 429 now, while
        the request can still get a status); `Ticket.wait` waits for the turn."""
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        if self._running < self.max_batch and not self._waiters:
            self._running += 1  # a free slot: the engine decodes up to max_batch together
            fut.set_result(None)
        elif len(self._waiters) >= self.max_queue:
            raise ApiError(
                429,
                f"the engine is busy and {len(self._waiters)} request(s) are waiting; retry later",
                code="queue_full",
                headers={"Retry-After": "2"},
            )
        else:
            self._waiters.append(fut)
        return Ticket(self, fut)

    async def acquire(self) -> None:
        """Wait for the engine (FIFO); a full queue is a 429."""
        await self.reserve().wait()

    def _release(self) -> None:
        while self._waiters:
            fut = self._waiters.popleft()
            if not fut.done():
                fut.set_result(None)  # the slot passes straight to the next waiter
                return
        self._running = max(0, self._running - 1)

    def release_unused(self) -> None:
        """Give the slot back when no generation was submitted after `acquire`."""
        self._release()

    def submit(self, cmd: P.Generate, *, keep_slot: bool = False) -> Job:
        """Run `cmd` (the caller holds the slot; its K, `cmd.k`, applies from its first
        token). With `keep_slot` the caller still holds the engine when the job ends."""
        assert self.service is not None
        job = Job(cmd.request_id, _client=self, keep_slot=keep_slot)
        self._jobs[cmd.request_id] = job
        self.service.submit(cmd)
        return job

    def _cancel(self, job: Job) -> None:
        if job.request_id in self._jobs and self.service is not None:
            self.service.cancel(job.request_id)


def new_request_id(prefix: str = "chatcmpl") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


def _load_tokenizer(path: str) -> Any:
    """The model's tokenizer for templating on the server side (no MLX): the same loader
    the engine uses, so eos ids, template and tool-call format are the engine's."""
    from ssdmoe_tui.checkpoint.config import load_tokenizer

    return load_tokenizer(path)

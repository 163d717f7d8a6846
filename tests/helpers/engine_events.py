"""The engine thread as its callers see it: an EngineService started on a checkpoint, and
its events collected in order, waited on by kind (never by sleeping)."""

from __future__ import annotations

import queue
import threading
import time

from ssdmoe_tui.engine.run import protocol as P
from ssdmoe_tui.engine.run.service import EngineService


class Events:
    def __init__(self) -> None:
        self.q: queue.Queue = queue.Queue()
        self.threads: set[str] = set()

    def post(self, ev) -> None:
        self.threads.add(threading.current_thread().name)
        self.q.put(ev)

    def until(self, kind, timeout=60.0, pred=lambda e: True):
        seen = []
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            try:
                ev = self.q.get(timeout=0.5)
            except queue.Empty:
                continue
            seen.append(ev)
            if isinstance(ev, kind) and pred(ev):
                return ev, seen
        raise AssertionError(
            f"no {kind.__name__} within {timeout}s; saw {[type(e).__name__ for e in seen]}"
        )


def start(path) -> tuple[EngineService, Events]:
    ev = Events()
    svc = EngineService(ev.post)
    svc.start()
    svc.submit(P.LoadModel(path=str(path), expert_cache="1"))
    loaded, _ = ev.until(P.ModelLoaded)
    assert loaded.info.trained_k == 4
    ev.tokenizer = loaded.tokenizer
    return svc, ev


def next_of(events: queue.Queue, kind: type, notices: list[str], timeout: float = 120.0):  # noqa: ANN201 - an event of `kind`
    """The next event of `kind` the engine posted to `events`, keeping every Notice on the
    way in `notices`; an EngineError on the way fails the test with its message."""
    deadline = time.monotonic() + timeout
    while True:
        ev = events.get(timeout=max(0.1, deadline - time.monotonic()))
        if isinstance(ev, P.Notice):
            notices.append(ev.message)
        assert not isinstance(ev, P.EngineError), ev.message
        if isinstance(ev, kind):
            return ev

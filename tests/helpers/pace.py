"""The engine's pace, set from the test side, so the app tests can be run as a fast and as
a slow machine would run them (issue 30, item 7).

Nothing here changes what the engine computes: the real engine runs the real model;
`floor` only makes a stream last (each token at least so long after the previous one, as
on a slower machine) and `coarse_timers` only makes the engine thread report less often
(token batches and stats samples as a machine that many times faster sends them).

`SSDMOE_TEST_PACE` (read by tests/conftest.py) runs a whole suite that way:
- `slow`: every token at least SLOW_TOKEN_S after the previous one, and a SLOW_START_S
  pause before each prefill (a loaded or small machine);
- `fast`: the engine's token batches and stats samples FAST_FACTOR times further apart
  (a reply of a few hundred tokens arrives in a handful of events, as on a fast GPU).

A test that acts while a reply streams (stop, change K, switch away) asks for a stream
that lasts with `floor(monkeypatch, MID_STREAM_TOKEN_S)`: a stream that ends before the
test can act tests nothing, and no machine is too fast for it then.
"""

from __future__ import annotations

import importlib
import time
from collections.abc import Iterator

import pytest

from ssdmoe_tui.engine.run import runner as runner_module

SLOW_TOKEN_S = 0.03
SLOW_START_S = 0.3
FAST_FACTOR = 8
MID_STREAM_TOKEN_S = 0.01
# The engine-thread modules whose TOKEN_BATCH_S / STATS_EVERY_S pace the events it sends:
# turn.py (every request's Turn reads both) and batch_loop.py (its own imported copy of
# STATS_EVERY_S, the batch's shared sample clock). tests/test_pace.py checks they hold them.
TIMER_MODULES = ("ssdmoe_tui.engine.run.turn", "ssdmoe_tui.engine.run.batch_loop")
TIMERS = ("TOKEN_BATCH_S", "STATS_EVERY_S")


def floor(
    monkeypatch: pytest.MonkeyPatch,
    per_token_s: float,
    start_s: float = 0.0,
    per_chunk_s: float = 0.0,
) -> None:
    """Each token of `Runner.stream` at least `per_token_s` after the previous one (and the
    prefill `start_s` later; each prefill chunk's progress at least `per_chunk_s` after the
    last, so a prefill of n chunks lasts n x per_chunk_s however fast the machine): the
    stream a slower machine sends, with the same tokens. A floor already set is raised,
    never lowered."""
    stream = runner_module.Runner.stream
    inner = getattr(stream, "paced", stream)
    per_token_s = max(per_token_s, getattr(stream, "per_token_s", 0.0))
    start_s = max(start_s, getattr(stream, "start_s", 0.0))
    per_chunk_s = max(per_chunk_s, getattr(stream, "per_chunk_s", 0.0))
    gaps = {runner_module.TokenEvent: per_token_s, runner_module.PrefillProgress: per_chunk_s}

    def paced(self, prompt, **kwargs) -> Iterator:  # noqa: ANN001
        if start_s:
            time.sleep(start_s)
        last = time.monotonic()
        for event in inner(self, prompt, **kwargs):
            gap = gaps.get(type(event))
            if gap is not None:
                wait = gap - (time.monotonic() - last)
                if wait > 0:
                    time.sleep(wait)
                last = time.monotonic()
            yield event

    paced.paced, paced.per_token_s, paced.start_s = inner, per_token_s, start_s
    paced.per_chunk_s = per_chunk_s
    monkeypatch.setattr(runner_module.Runner, "stream", paced)


def coarse_timers(monkeypatch: pytest.MonkeyPatch, factor: float) -> None:
    """The engine thread's token batches and stats samples `factor` times further apart."""
    # Every module imported before any is patched: batch_loop copies turn's STATS_EVERY_S
    # when first imported, and would copy a patched value (then be patched again).
    modules = [importlib.import_module(name) for name in TIMER_MODULES]
    for module in modules:
        for timer in TIMERS:
            if hasattr(module, timer):
                monkeypatch.setattr(module, timer, getattr(module, timer) * factor)


def apply(monkeypatch: pytest.MonkeyPatch, pace: str) -> None:
    """SSDMOE_TEST_PACE's value: "", "slow" or "fast" (anything else is one clear error)."""
    if pace == "slow":
        floor(monkeypatch, SLOW_TOKEN_S, SLOW_START_S)
    elif pace == "fast":
        coarse_timers(monkeypatch, FAST_FACTOR)
    elif pace:
        raise pytest.UsageError(f"SSDMOE_TEST_PACE={pace!r}: use slow, fast or nothing")

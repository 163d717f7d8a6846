"""The test-side engine pace (tests/helpers/pace.py) reaches the timers the engine uses:
`SSDMOE_TEST_PACE=fast` must space the real token batches and stats samples, or the
fast-machine run of the app tests silently runs at the ordinary pace."""

from __future__ import annotations

import importlib

from ssdmoe_tui.engine.run import turn
from tests.helpers import pace


def test_coarse_timers_space_every_timer_the_engine_reads(monkeypatch):
    batch, stats = turn.TOKEN_BATCH_S, turn.STATS_EVERY_S
    pace.coarse_timers(monkeypatch, pace.FAST_FACTOR)
    # Turn reads both at construction (engine/run/turn.py): one per request.
    assert turn.TOKEN_BATCH_S == batch * pace.FAST_FACTOR
    assert turn.STATS_EVERY_S == stats * pace.FAST_FACTOR
    batch_loop = importlib.import_module("ssdmoe_tui.engine.run.batch_loop")
    assert batch_loop.STATS_EVERY_S == stats * pace.FAST_FACTOR  # its shared sample clock


def test_every_paced_module_holds_a_timer():
    """A timer that moves module leaves a name here that pace.py would skip silently."""
    for name in pace.TIMER_MODULES:
        module = importlib.import_module(name)
        assert any(hasattr(module, t) for t in pace.TIMERS), name

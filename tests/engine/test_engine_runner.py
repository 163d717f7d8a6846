"""Runner.stream: typed events in order, and K reaching the blocks only when it changes."""

from __future__ import annotations

import pytest

from ssdmoe_tui.engine.run.open import open_engine
from ssdmoe_tui.engine.run.runner import Done, PrefillProgress, Snapshot, TokenEvent
from ssdmoe_tui.errors import BadValueError
from ssdmoe_tui.options import EngineOptions


@pytest.fixture(scope="module")
def runner(checkpoints):
    r = open_engine(EngineOptions(model=str(checkpoints("qwen3_moe")), prefill_step=4))
    r.sm.tokenizer.eos_token_ids = set()  # exactly max_tokens tokens
    yield r
    r.close()


def test_stream_yields_prefill_tokens_then_done(runner):
    prompt = list(range(3, 14))
    events = list(runner.stream(prompt, max_tokens=6))
    kinds = [type(e).__name__ for e in events]
    assert kinds[-1] == "Done" and kinds.count("Done") == 1
    prefill = [e for e in events if isinstance(e, PrefillProgress)]
    assert prefill[0].done == 0 and prefill[-1].done == prefill[-1].total == len(prompt)
    assert [e.done for e in prefill] == sorted(e.done for e in prefill)
    assert kinds.index("TokenEvent") > kinds.index("PrefillProgress")
    tokens = [e.token for e in events if isinstance(e, TokenEvent)]
    result = events[-1].result
    assert tokens == result.tokens and len(tokens) == 6
    assert result.stats.generated_tokens == 6 and result.finish_reason == "length"
    assert runner.generate(prompt, max_tokens=6).tokens == tokens  # same path, greedy


def test_k_reaches_the_blocks_only_when_it_changes(runner, monkeypatch):
    calls: list[int] = []
    real = type(runner.sm).set_k
    monkeypatch.setattr(runner.sm, "set_k", lambda k: (calls.append(k), real(runner.sm, k)))
    trained = runner.sm.trained_k
    runner.set_k(trained)
    runner.generate(list(range(3, 14)), max_tokens=12)
    assert calls in ([], [trained])  # at most once, never per token
    calls.clear()
    seen = []
    for ev in runner.stream(list(range(3, 14)), max_tokens=12):
        if isinstance(ev, TokenEvent) and ev.stats.generated_tokens == 4:
            runner.set_k(2)
        elif isinstance(ev, Done):
            seen = ev.result.stats.k_per_token
    assert calls == [2]
    # With every expert held the Runner queues a token ahead (runner.py, `_decode_loop`):
    # the change lands one token later; with synced layers, on the next token.
    lag = 1 if runner.sm.cache.all_frozen else 0
    assert seen[: 4 + lag] == [trained] * (4 + lag) and set(seen[4 + lag :]) == {2}
    assert runner.k == 2
    with pytest.raises(BadValueError, match="outside 1..16"):
        runner.set_k(17)
    assert runner.k == 2
    runner.set_k(trained)


def test_snapshot_deltas_count_the_cache_work(runner):
    a = Snapshot.take(runner.sm)
    runner.generate(list(range(20, 31)), max_tokens=3)
    d = Snapshot.take(runner.sm) - a
    assert d.hits + d.misses > 0 and d.t > 0
    assert d.ensure_s >= d.read_s >= 0  # the cache times its own `ensure`, reads included

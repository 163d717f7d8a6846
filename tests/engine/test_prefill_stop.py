"""A prefill stopped between MoE layers (engine/run/prefill_stop.py): the chunk it was in
is undone exactly, for attention caches and for a hybrid model's recurrent state, on the
synced path and on the frozen one (every expert resident: the gate's own sync)."""

from __future__ import annotations

import mlx.core as mx
import pytest

from ssdmoe_tui.engine.run import prefill_stop
from ssdmoe_tui.engine.run.open import open_engine
from ssdmoe_tui.engine.run.prefill_stop import FIRST_CHUNK, MIN_CHUNK, ChunkSizer
from ssdmoe_tui.engine.run.runner import Done, PrefillProgress
from ssdmoe_tui.options import CacheBudget, EngineOptions

STEP = 8  # tokens per chunk (a stoppable prefill never exceeds the configured step)


def _states(cache: list) -> list[mx.array]:
    """What each layer's cache holds for the tokens it covers."""
    out = []
    for c in cache:
        if hasattr(c, "offset"):
            k, v = c.state[0], c.state[1]
            out += [k[..., : c.offset, :], v[..., : c.offset, :]]
        else:
            out += [a for a in c.cache if a is not None]
    return out


@pytest.mark.parametrize(
    ("arch", "budget"),
    [("qwen3_moe", "32K"), ("qwen3_moe", "64M"), ("qwen3_5_moe", "32K")],
    ids=["attention", "attention-frozen", "hybrid"],
)
def test_a_stop_inside_a_chunk_undoes_it_exactly(checkpoints, arch, budget, monkeypatch):
    # frozen layers ask (with their own sync) only when a chunk is expected to be long;
    # these tiny chunks are not: ask always, so the frozen path's undo is what is tested
    monkeypatch.setattr(prefill_stop, "FROZEN_ASK_ABOVE_S", -1.0)
    runner = open_engine(
        EngineOptions(
            model=str(checkpoints(arch)), prefill_step=STEP, expert_cache=CacheBudget.parse(budget)
        )
    )
    try:
        layers = len(runner.sm.blocks)
        assert layers >= 2
        prompt = [(7 * i) % 900 + 20 for i in range(5 * STEP + 3)]
        runner.generate(prompt[:9], max_tokens=2)  # layers that hold every expert freeze
        assert runner.sm.cache.all_frozen == (budget == "64M")  # else each layer syncs (32K:
        # the minimum, K x layers slots, raised to by the loader)
        calls = [0]
        # asked once per MoE layer in a chunk and once after it: the stop comes at the
        # last MoE layer of the third chunk, so its earlier layers have written it
        stop_at = 2 * (layers + 1) + layers

        def should_stop() -> bool:
            calls[0] += 1
            return calls[0] >= stop_at

        events = list(runner.stream(prompt, max_tokens=4, should_stop=should_stop))
        result = events[-1].result
        assert isinstance(events[-1], Done) and result.finish_reason == "cancelled"
        progress = [e.done for e in events if isinstance(e, PrefillProgress)]
        assert progress == [0, STEP, 2 * STEP]  # the third chunk never finished
        assert result.covered_prompt == 2 * STEP and not result.tokens
        if hasattr(result.cache[0], "offset") or hasattr(result.cache[-1], "offset"):
            offsets = {c.offset for c in result.cache if hasattr(c, "offset")}
            assert offsets == {2 * STEP}
        # the same two chunks, prefilled without a stop (max_tokens 0: prefill only)
        ref = list(runner.stream(prompt[: 2 * STEP + 1], max_tokens=0))[-1].result
        assert ref.covered_prompt == 2 * STEP
        got, want = _states(result.cache), _states(ref.cache)
        assert len(got) == len(want) > 0
        assert all(mx.array_equal(a, b).item() for a, b in zip(got, want, strict=True))
        # and the undone cache continues as the reference does
        a = runner.generate(prompt, max_tokens=3, cache=result.cache, reused_tokens=2 * STEP)
        b = runner.generate(prompt, max_tokens=3, cache=ref.cache, reused_tokens=2 * STEP)
        assert a.tokens == b.tokens
    finally:
        runner.close()


def test_chunk_sizes_follow_the_measured_speed():
    sizer = ChunkSizer(layers=4)
    assert sizer.size(2048) == FIRST_CHUNK and sizer.size(64) == 64  # nothing measured yet
    sizer.measure(256, 1.0)  # 1,024 tokens a second through each of 4 layers
    assert sizer.size(2048) == 256  # ~0.25 s a layer, as a power of two
    sizer.measure(256, 0.01)  # fast: the configured step
    assert sizer.size(2048) == 2048 and sizer.size(512) == 512
    sizer.measure(32, 30.0)  # very slow: never below the floor
    assert sizer.size(2048) == MIN_CHUNK


def test_frozen_layers_add_no_sync_when_a_chunk_is_expected_short(checkpoints):
    """Every expert resident, a chunk the sizer expects within FROZEN_ASK_ABOVE_S: the
    frozen layers do not sync to ask (a GPU's chunks; the stop is asked at each chunk's
    end), so a stoppable prefill asks exactly once per chunk."""
    runner = open_engine(
        EngineOptions(
            model=str(checkpoints("qwen3_moe")),
            prefill_step=STEP,
            expert_cache=CacheBudget.parse("64M"),
        )
    )
    try:
        prompt = [(7 * i) % 900 + 20 for i in range(5 * STEP + 3)]
        runner.generate(prompt[:9], max_tokens=2)
        assert runner.sm.cache.all_frozen
        runner._sizer.rate = 1e9  # measured fast: every chunk well within the bound
        assert not runner._sizer.frozen_must_ask(STEP)
        calls = [0]

        def never() -> bool:
            calls[0] += 1
            return False

        events = list(runner.stream(prompt, max_tokens=1, should_stop=never))
        progress = [e.done for e in events if isinstance(e, PrefillProgress)]
        assert calls[0] <= len(progress) + 1, (calls, progress)  # not once per MoE layer
    finally:
        runner.close()

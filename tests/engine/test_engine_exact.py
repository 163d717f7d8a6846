"""The streamed engine reproduces plain mlx-lm token for token (greedy), for every architecture."""

from __future__ import annotations

import mlx.core as mx
import pytest
from mlx_lm import load, stream_generate

from ssdmoe_tui.engine.model.loader import cast_model, load_streamed
from ssdmoe_tui.engine.run.runner import Runner
from tests.helpers.exact import MAX_TOKENS, PROMPT, engine_tokens, reference_tokens


@pytest.mark.parametrize("arch", ["qwen3_moe", "qwen3_5_moe", "nemotron_h"])
@pytest.mark.parametrize("k", [None, 2])
@pytest.mark.parametrize("budget", ["all", "min"])
def test_matches_mlx_lm(checkpoints, arch, k, budget):
    path = checkpoints(arch)
    size = "1G" if budget == "all" else "1"  # "1" byte -> clamped to the minimum
    sm, prompt, res = engine_tokens(path, k, size)
    assert len(prompt) * (k or sm.trained_k) >= 64, "prompt must exercise mlx-lm's sorted path"
    ref = reference_tokens(path, k, mx.float32, prompt)
    assert res.tokens == ref
    assert len(set(ref)) > 3, "random checkpoint should not be degenerate"
    used_k = k or sm.trained_k
    assert used_k <= sm.index.num_experts
    assert res.stats.k_per_token == [used_k] * len(res.tokens)
    if budget == "min":
        assert sm.cache.capacity == sm.trained_k * sm.index.num_layers
    else:
        assert sm.cache.capacity == sm.index.num_experts * sm.index.num_layers


def test_bfloat16_matches_mlx_lm(checkpoints):
    path = checkpoints("qwen3_5_moe")
    sm, prompt, res = engine_tokens(path, None, "1G", dtype="bfloat16")
    assert sm.dtype == mx.bfloat16
    assert res.tokens == reference_tokens(path, None, mx.bfloat16, prompt)


def test_cache_smaller_than_one_layer_union(checkpoints):
    """Prefill whose per-layer expert union exceeds the cache is processed in groups, still exactly."""
    path = checkpoints("qwen3_moe")
    sm = load_streamed(path, expert_cache="1")
    assert sm.cache.capacity == 12 < sm.index.num_experts  # min = K x layers
    runner = Runner(sm)
    prompt = sm.tokenizer.apply_chat_template(PROMPT, add_generation_prompt=True)
    res = runner.generate(prompt, max_tokens=MAX_TOKENS)
    assert sm.times.grouped_calls > 0
    assert res.tokens == reference_tokens(path, None, mx.float32, prompt)


@pytest.mark.parametrize("budget", ["1G", "1"])
def test_mixtral_matches_mlx_lm(checkpoints, budget):
    path = checkpoints("mixtral")
    sm, prompt, res = engine_tokens(path, None, budget)
    assert sm.trained_k == 2
    assert res.tokens == reference_tokens(path, None, mx.float32, prompt)


@pytest.mark.parametrize("arch", ["qwen3_moe", "qwen3_5_moe", "mixtral"])
def test_prefetch_keeps_output_exact(checkpoints, arch, monkeypatch):
    """Prefetch only changes what is resident, never the arithmetic. Decode guesses
    take only cold slots: a third of the experts, and every slot not asked for in this
    token counts as cold ($SSDMOE_PREFETCH_COLD=0), so guesses are read."""
    from ssdmoe_tui.engine.experts.cache import slot_memory_bytes
    from ssdmoe_tui.engine.experts.index import build_index
    from ssdmoe_tui.engine.experts.prefetch import COLD_ENV

    monkeypatch.setenv(COLD_ENV, "0")
    path = checkpoints(arch)
    index = build_index(path)
    third = slot_memory_bytes(index, mx.float32) * index.num_experts * index.num_layers // 3
    sm = load_streamed(path, expert_cache=str(third), prefetch=True)
    runner = Runner(sm)
    prompt = sm.tokenizer.apply_chat_template(PROMPT, add_generation_prompt=True)
    res = runner.generate(prompt, max_tokens=MAX_TOKENS)
    c = sm.cache.counters
    assert c.prefetch_issued > 0
    assert 0 <= c.prefetch_used <= min(c.prefetch_issued, c.misses)
    assert c.bytes_read == (c.misses + c.prefetch_issued - c.prefetch_used) * sm.index.expert_bytes
    figs = runner.stats_dict(res.stats)["prefetch"]  # what generate --json and the server say
    assert (figs["issued"], figs["used"], figs["dropped"]) == (
        c.prefetch_issued,
        c.prefetch_used,
        c.prefetch_dropped,
    )
    assert res.tokens == reference_tokens(path, None, mx.float32, prompt)


def test_samplers_and_penalties_match_mlx_lm(checkpoints):
    """top_k, min_p and the penalties (what the server's requests set) run as mlx-lm's
    own sampler and logits processors do: the same tokens, greedy and seeded."""
    from mlx_lm.sample_utils import make_logits_processors, make_sampler

    path = checkpoints("qwen3_moe")
    sm = load_streamed(path, expert_cache="1G")
    runner = Runner(sm)
    prompt = sm.tokenizer.apply_chat_template(PROMPT, add_generation_prompt=True)
    model, tok = load(str(path))
    cast_model(model, mx.float32)
    penalties = {"repetition_penalty": 1.5, "presence_penalty": 0.7, "frequency_penalty": 0.4}
    for temp, seed in [(0.0, None), (0.9, 7)]:

        def run(fn, temp=temp, seed=seed):
            if seed is not None:
                mx.random.seed(seed)
            sampler = make_sampler(temp, top_k=8, min_p=0.02)
            return fn(sampler, make_logits_processors(**penalties))

        ours = run(lambda s, p: runner.generate(prompt, max_tokens=MAX_TOKENS, sampler=s,
                                                logits_processors=p).tokens)  # fmt: skip
        ref = run(lambda s, p: [r.token for r in stream_generate(
            model, tok, prompt, max_tokens=MAX_TOKENS, sampler=s, logits_processors=p)])  # fmt: skip
        assert ours == ref, (temp, seed)
        plain = runner.generate(prompt, max_tokens=MAX_TOKENS).tokens
        if seed is None:
            assert ours != plain  # the penalties changed the greedy reply

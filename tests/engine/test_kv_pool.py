"""KVPool with real mlx-lm caches: reuse rules, trimming, LRU byte budget, correctness
of continuing from a handed-out cache (same logits as a fresh prefill)."""

from __future__ import annotations

import mlx.core as mx
import pytest
from mlx_lm.models.cache import make_prompt_cache

from ssdmoe_tui.engine.run.kv_pool import KVPool, cache_nbytes
from tests.helpers.tiny import ARCHS, HYBRID, feed, filled_cache, tiny_model

A = list(range(10, 40))  # 30 shared tokens
B = [500, 501, 502, 503]
C = [700, 701, 702]


def fresh_logits(arch, tokens):
    return feed(arch, make_prompt_cache(tiny_model(arch)), tokens)


@pytest.mark.parametrize("arch", ARCHS)
def test_exact_prefix_is_reused_and_continues_exactly(arch):
    pool = KVPool(1 << 30)
    assert pool.put("m", A, filled_cache(arch, A))
    cache, n = pool.take("m", A + C)
    assert n == len(A) and cache is not None
    assert len(pool) == 0 and pool.bytes_used == 0  # handed out, not copied
    got = feed(arch, cache, C)
    assert mx.allclose(got, fresh_logits(arch, A + C), atol=1e-4).item()


@pytest.mark.parametrize("arch", ARCHS)
def test_divergent_prompt_trims_attention_only(arch):
    pool = KVPool(1 << 30)
    pool.put("m", A + B, filled_cache(arch, A + B))
    cache, n = pool.take("m", A + C)
    if HYBRID[arch]:
        assert (cache, n) == (None, 0)  # recurrent state cannot be rolled back
        assert len(pool) == 1
    else:
        assert n == len(A)
        assert cache[0].offset == len(A)
        got = feed(arch, cache, C)
        assert mx.allclose(got, fresh_logits(arch, A + C), atol=1e-4).item()
        # the longer cache stays for the conversation it belongs to (a trimmed copy went out)
        again, n = pool.take("m", A + B + C)
        assert n == len(A + B) and len(pool) == 0
        got = feed(arch, again, C)
        assert mx.allclose(got, fresh_logits(arch, A + B + C), atol=1e-4).item()


@pytest.mark.parametrize("arch", ARCHS)
def test_never_reuses_every_token(arch):
    pool = KVPool(1 << 30)
    pool.put("m", A, filled_cache(arch, A))
    cache, n = pool.take("m", A)
    if HYBRID[arch]:
        assert (cache, n) == (None, 0) and len(pool) == 1
    else:
        assert n == len(A) - 1 and cache[0].offset == len(A) - 1
        got = feed(arch, cache, A[-1:])
        assert mx.allclose(got, fresh_logits(arch, A), atol=1e-4).item()


def test_keys_are_separate_namespaces():
    pool = KVPool(1 << 30)
    pool.put("model-a", A, filled_cache("qwen3_moe", A))
    assert pool.take("model-b", A + C) == (None, 0)
    assert pool.best_reuse("model-a", A + C) == len(A)


def test_best_candidate_wins_and_trimmable_prefixes_are_dropped():
    pool = KVPool(1 << 30)
    pool.put("m", A[:10], filled_cache("qwen3_moe", A[:10]))
    pool.put("m", [1, 2, 3], filled_cache("qwen3_moe", [1, 2, 3]))
    pool.put("m", A, filled_cache("qwen3_moe", A))  # supersedes A[:10]
    assert len(pool) == 2
    cache, n = pool.take("m", A + B)
    assert n == len(A)


def test_hybrid_prefixes_are_kept_for_branching():
    pool = KVPool(1 << 30)
    pool.put("m", A[:10], filled_cache("nemotron_h", A[:10]))
    pool.put("m", A, filled_cache("nemotron_h", A))
    assert len(pool) == 2
    cache, n = pool.take("m", A[:10] + C)  # only the short one is an exact prefix
    assert n == 10


def test_lru_byte_budget_evicts_oldest():
    one = cache_nbytes(filled_cache("qwen3_moe", A))
    assert one > 0
    pool = KVPool(int(one * 2.5))
    for i in range(3):
        pool.put("m", [900 + i] + A[1:], filled_cache("qwen3_moe", [900 + i] + A[1:]))
    assert len(pool) == 2 and pool.bytes_used == 2 * one
    assert pool.best_reuse("m", [900] + A[1:] + C) == 0  # the oldest went
    assert pool.best_reuse("m", [902] + A[1:] + C) == len(A)
    pool.set_budget(one)
    assert len(pool) == 1 and pool.bytes_used == one
    big = [7] * 300
    assert not pool.put("m", big, filled_cache("qwen3_moe", big))  # over budget alone
    assert len(pool) == 1
    pool.clear()
    assert pool.bytes_used == 0 and len(pool) == 0


def test_put_rejects_wrong_token_count():
    with pytest.raises(ValueError, match="covers 30 tokens but 29"):
        KVPool(1 << 30).put("m", A[:-1], filled_cache("qwen3_moe", A))


def test_byte_accounting_uses_array_bytes():
    cache = filled_cache("qwen3_5_moe", A)
    expected = sum(
        a.nbytes
        for c in cache
        for a in (c.state[:2] if type(c).__name__ == "KVCache" else c.state[0])
        if a is not None
    )
    assert cache_nbytes(cache) == expected

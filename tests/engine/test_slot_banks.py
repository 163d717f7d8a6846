"""Slot banks: every slot array stays under a bank size (2 GiB by default, because MLX
kernels index with 32-bit offsets); forcing tiny banks here must leave output exact."""

from __future__ import annotations

import mlx.core as mx
import pytest

from ssdmoe_tui.engine.experts.cache import BANK_BYTES_ENV, bank_slot_count, parse_size
from tests.helpers.exact import engine_tokens, reference_tokens


def test_bank_size_stays_under_2_gib_and_rounds_to_whole_layers() -> None:
    # Qwen3.5-35B-A3B: 512 KiB per slot in the largest component, 256 experts per layer.
    n = bank_slot_count(512 << 10, 40 * 256, 256)
    assert n * (512 << 10) < 2 << 30 and n % 256 == 0 and n == 3840
    assert bank_slot_count(512 << 10, 100, 256) == 100  # a small cache is one bank
    # below one layer: no rounding; 4 slots and the spare (slack.py) fit 20,000 bytes
    assert bank_slot_count(4096, 48, 16, bank_bytes=20_000) == 3


@pytest.mark.parametrize(
    ("bank_bytes", "budget", "frozen"),
    [
        ("20K", "1G", False),  # 5-slot banks: layers spread over banks, host lookups
        ("68K", "1G", True),  # one layer (64K) and the spare slot per bank: device-side lookup
        ("20K", "24K", False),  # a small cache over several banks, with evictions
    ],
)
def test_several_banks_match_mlx_lm(checkpoints, monkeypatch, bank_bytes, budget, frozen) -> None:
    monkeypatch.setenv(BANK_BYTES_ENV, bank_bytes)
    path = checkpoints("qwen3_moe")
    sm, prompt, res = engine_tokens(path, None, budget)
    cache = sm.cache
    assert cache.num_banks > 2
    arrays = [a for b in cache.banks for a in b.values()]
    assert all(a.nbytes <= cache.bank_slots * 4096 for a in arrays)
    # The bank size bounds every array, float32-widened scales and biases included.
    assert any(a.dtype == mx.float32 for a in arrays)
    assert max(a.nbytes for a in arrays) <= parse_size(bank_bytes)
    assert cache.all_frozen == frozen
    # frozen layers, read whole in id order, run on their own rows (no device lookup)
    rows = [cache.layer_arrays(i) is not None for i in range(sm.index.num_layers)]
    assert all(rows) == frozen and (any(rows) or not frozen)
    assert len(prompt) * sm.trained_k >= 64, "prefill must take mlx-lm's sorted path"
    assert res.tokens == reference_tokens(path, None, mx.float32, prompt)
    sm.close()


def test_bad_bank_size_is_one_line(checkpoints, monkeypatch) -> None:
    from ssdmoe_tui.engine.model.loader import load_streamed
    from ssdmoe_tui.errors import ModelError

    monkeypatch.setenv(BANK_BYTES_ENV, "lots")
    with pytest.raises(ModelError, match=BANK_BYTES_ENV):
        load_streamed(checkpoints("qwen3_moe"), expert_cache="1G")


def test_auto_budget_counts_every_expert_in_slots_so_layers_freeze(checkpoints) -> None:
    """`auto` capped at "every expert" counts slots, not file bytes: float32-widened
    scales make a slot larger than its expert on disk, and a budget of the file bytes
    held ~99 % of the experts, so no layer ever froze and every layer kept its host sync."""
    from ssdmoe_tui.engine.experts.cache import slot_memory_bytes
    from ssdmoe_tui.engine.model.loader import load_streamed
    from ssdmoe_tui.engine.run.runner import Runner

    sm = load_streamed(checkpoints("qwen3_moe"), expert_cache="auto")
    index = sm.index
    assert slot_memory_bytes(index, mx.float32) > index.expert_bytes  # widened here
    assert sm.cache.holds_everything
    runner = Runner(sm)
    runner.generate(list(range(3, 19)), max_tokens=4)
    assert sm.cache.all_frozen
    synced = sm.times.router_sync_s
    runner.generate(list(range(3, 19)), max_tokens=4)
    assert sm.times.router_sync_s == synced  # a later turn: no layer syncs

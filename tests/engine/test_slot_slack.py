"""Every slot array keeps a spare slot behind the slots it hands out (engine/experts/slack.py):
MLX-CUDA's tiled gather_qmm reads past the last expert of its weights array, and a bank
whose last slot ended its allocation made the demo's speculative verify abort on the H100."""

from __future__ import annotations

import ctypes

import mlx.core as mx
import numpy as np

from ssdmoe_tui.engine.experts.reader import buffer_address
from ssdmoe_tui.engine.experts.slack import SPARE_SLOTS, slot_array


def test_slot_array_is_a_view_with_zeros_behind_it() -> None:
    a = slot_array(4, (3, 2), mx.uint32)
    assert a.shape == (4, 3, 2) and a.nbytes == 4 * 6 * 4
    addr = buffer_address(memoryview(a))
    total = (4 + SPARE_SLOTS) * 6
    raw = np.ctypeslib.as_array((ctypes.c_uint32 * total).from_address(addr))
    assert not raw.any()
    raw[: 4 * 6] = np.arange(24, dtype=np.uint32)  # what the reader does: write by address
    assert np.array(a).ravel().tolist() == list(range(24))
    assert not raw[4 * 6 :].any(), "the spare slot is never written"


def test_every_bank_of_a_loaded_cache_has_its_spare_slot(checkpoints) -> None:
    from ssdmoe_tui.engine.model.loader import load_streamed

    sm = load_streamed(checkpoints("qwen3_moe"), expert_cache="1G")
    try:
        for bank in sm.cache.banks:
            for a in bank.values():
                slot = a.nbytes // a.shape[0]
                addr = buffer_address(memoryview(a))
                spare = (ctypes.c_char * (slot * SPARE_SLOTS)).from_address(addr + a.nbytes)
                assert not any(bytes(spare)), "the spare slot behind the bank holds zeros"
    finally:
        sm.close()

"""Slot rows' address ranges (page_moves.py) and the layers' pages moved ahead
(page_ahead.py): the ranges read back the very bytes of the slots' rows in the banks,
and the moves follow the layers as the docstring says. The CUDA calls themselves run
on MLX-CUDA only (docs/measurements/2026-12-07-h100-ninth/calls/)."""

from __future__ import annotations

import ctypes

import mlx.core as mx
import numpy as np
import pytest

from ssdmoe_tui.engine.experts.cache import BANK_BYTES_ENV
from ssdmoe_tui.engine.experts.page_moves import slot_ranges
from ssdmoe_tui.engine.model.loader import load_streamed
from ssdmoe_tui.engine.model.page_ahead import KEEP_LAYERS, PageAhead, page_ahead
from ssdmoe_tui.engine.run.runner import Runner


def _row_bytes(cache, slot: int) -> bytes:
    """A slot's rows, component by component, as MLX holds them in its bank."""
    bank, row = divmod(slot, cache.bank_slots)
    arrays = cache.banks[bank]
    out = b""
    for name in cache._layout.names:
        a = arrays[name]
        mx.eval(a)
        out += np.array(a[row : row + 1]).tobytes()
    return out


def test_slot_ranges_coalesce_runs_per_bank_and_component() -> None:
    bases = np.array([[1000, 5000], [20000, 30000]], dtype=np.int64)  # [bank, comp]
    strides = np.array([10, 3], dtype=np.int64)
    # 4 rows a bank: slots 1-3 are bank 0's rows 1-3 (one run), 4-5 bank 1's rows 0-1, 7
    # bank 1's row 3; duplicates and order do not matter
    got = slot_ranges(np.array([3, 7, 1, 2, 4, 5, 2]), 4, bases, strides)
    assert got == [
        (1010, 30), (5003, 9),    # bank 0, rows 1-3, each component
        (20000, 20), (30000, 6),  # bank 1, rows 0-1
        (20030, 10), (30009, 3),  # bank 1, row 3
    ]  # fmt: skip
    assert slot_ranges(np.array([], dtype=np.int64), 4, bases, strides) == []


def _merged(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Address intervals, adjacent or overlapping ones joined."""
    out: list[list[int]] = []
    for a, n in sorted(ranges):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], a + n)
        else:
            out.append([a, a + n])
    return [(a, z - a) for a, z in out]


@pytest.mark.parametrize("banks", [None, "20K"])
def test_a_caches_slot_ranges_read_back_its_rows(checkpoints, monkeypatch, banks) -> None:
    """After a turn, the ranges of a layer's resident experts hold exactly those slots'
    rows (one bank and several): the addresses a page move is given are the slots'."""
    if banks:
        monkeypatch.setenv(BANK_BYTES_ENV, banks)
    path = checkpoints("qwen3_moe")
    sm = load_streamed(path, expert_cache="1G")
    try:
        Runner(sm).generate(list(range(5, 40)), max_tokens=2)
        cache = sm.cache
        if banks:
            assert len(cache.banks) > 1
        slots = cache.slots_of(0, np.arange(cache.index.num_experts))
        slots = np.sort(slots[slots >= 0])
        assert len(slots) > 2
        # the layer's ranges cover the bytes its slots' own ranges do, coalesced
        assert _merged(cache.slot_ranges(slots)) == _merged(
            [r for s in slots.tolist() for r in cache.slot_ranges(np.array([s]))]
        )
        assert len(cache.slot_ranges(slots)) < len(slots) * len(cache._layout.names)
        # and a slot's ranges read back its rows in the banks
        for s in slots[:3].tolist():
            one = b"".join(ctypes.string_at(a, n) for a, n in cache.slot_ranges(np.array([s])))
            assert one == _row_bytes(cache, s)
    finally:
        sm.close()


class _Recorder:
    """Stands in for the CUDA driver's page moves on the CPU: which ranges went where."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, list]] = []

    def to_device(self, ranges: list) -> None:
        self.calls.append(("device", ranges))

    def to_host(self, ranges: list) -> None:
        self.calls.append(("host", ranges))


def test_pages_move_to_the_gpu_for_their_layer_and_back_two_layers_later(checkpoints) -> None:
    path = checkpoints("qwen3_moe")
    sm = load_streamed(path, expert_cache="1G")
    try:
        Runner(sm).generate(list(range(5, 40)), max_tokens=2)
        cache = sm.cache
        rec = _Recorder()
        ahead = PageAhead(rec)  # type: ignore[arg-type]
        experts = np.arange(cache.index.num_experts)
        layers = list(range(min(4, cache.index.num_layers)))
        want = {}
        for call, layer in enumerate(layers):
            ahead.ask(layer, experts, call)
            ahead.fulfil(cache, layer, call)  # the call before asked: the same number
            slots = cache.slots_of(layer, experts)
            want[layer] = cache.slot_ranges(slots[slots >= 0])
            assert ahead.take(layer, call + 1) is None  # no copy: staged in place
        moved = [r for kind, r in rec.calls if kind == "device"]
        back = [r for kind, r in rec.calls if kind == "host"]
        assert moved == [want[layer] for layer in layers if want[layer]]
        # each layer returns once two more have moved (KEEP_LAYERS stay behind)
        assert back == moved[: len(moved) - KEEP_LAYERS - 1]
        assert ahead.moves == len(moved)
        assert ahead.moved_bytes == sum(n for r in moved for _, n in r)
        # a prediction for another layer or call moves nothing
        n = len(rec.calls)
        ahead.ask(1, experts, 7)
        ahead.fulfil(cache, 2, 7)
        ahead.ask(1, experts, 7)
        ahead.fulfil(cache, 1, 8)
        # nothing moved to the GPU; only the return still due (KEEP_LAYERS stay behind)
        assert [k for k, _ in rec.calls[n:]] == ["host"]
        ahead.ask(1, experts, 9)
        ahead.drop()
        ahead.fulfil(cache, 1, 9)
        assert all(k == "host" for k, _ in rec.calls[n:])
    finally:
        sm.close()


def test_no_mover_off_mlx_cuda() -> None:
    """On the CPU (and on Metal) nothing is moved: the chunks stage in place."""
    assert page_ahead("host").mover is None
    assert page_ahead("none").mover is None

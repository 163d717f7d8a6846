"""Slot placement on MLX-CUDA: the choice rule, the override and the CPU no-op."""

from __future__ import annotations

import pytest

from ssdmoe_tui.engine.experts import device_memory as dm
from ssdmoe_tui.errors import BadValueError, user_message


def test_auto_puts_small_caches_on_the_host_and_large_ones_in_managed_memory() -> None:
    assert dm.choose_placement("auto", 0.24, cuda=True) == "host"
    assert dm.choose_placement("auto", 0.71, cuda=True) == "managed"
    assert dm.choose_placement("auto", 1.0, cuda=True) == "managed"  # holds everything
    assert dm.choose_placement("host", 1.0, cuda=True) == "host"  # an explicit choice wins
    assert dm.choose_placement("managed", 0.1, cuda=True) == "managed"
    assert dm.choose_placement("host", 0.1, cuda=False) == "none"  # CPU, Metal
    # `device` (a mirror the compute reads, engine/experts/mirror.py): asked for only
    assert dm.choose_placement("device", 0.1, cuda=True) == "device"
    assert dm.choose_placement("device", 0.1, cuda=False) == "none"
    assert all(dm.choose_placement("auto", s, cuda=True) != "device" for s in (0.01, 0.5, 1.0))


def test_bad_placement_value_is_one_line_naming_the_variable(monkeypatch) -> None:
    monkeypatch.setenv("SSDMOE_SLOT_PLACEMENT", "gpu-please")
    with pytest.raises(BadValueError) as e:
        dm.requested_placement()
    assert user_message(e.value).startswith("SSDMOE_SLOT_PLACEMENT='gpu-please'")


def test_engine_on_cpu_records_no_placement(checkpoints, monkeypatch) -> None:
    """On the CPU the hint is skipped, and an explicit request says why."""
    from ssdmoe_tui.engine.model.loader import load_streamed

    monkeypatch.setenv("SSDMOE_SLOT_PLACEMENT", "host")
    sm = load_streamed(checkpoints("qwen3_moe"), expert_cache="4M")
    try:
        assert sm.cache.placement.placement == "none"
        assert sm.cache.placement.note == "not on MLX-CUDA"
    finally:
        sm.close()

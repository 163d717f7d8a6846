"""Slot placement on MLX-CUDA: the choice rule, the override and the CPU no-op."""

from __future__ import annotations

import pytest

from ssdmoe_tui.engine.experts import device_memory as dm
from ssdmoe_tui.errors import BadValueError, user_message


def test_auto_mirrors_small_caches_where_the_gpu_has_room_and_puts_large_ones_in_managed() -> None:
    # under half the expert set: a device mirror when it fits (the H100's timeline: 7.81
    # tok/s against host's 6.21, docs/benchmarks.md), host slots when it does not
    assert dm.choose_placement("auto", 0.24, cuda=True, mirror_fits=True) == "device"
    assert dm.choose_placement("auto", 0.24, cuda=True, mirror_fits=False) == "host"
    assert dm.choose_placement("auto", 0.24, cuda=True) == "host"  # room unknown
    assert dm.choose_placement("auto", 0.71, cuda=True, mirror_fits=True) == "managed"
    assert dm.choose_placement("auto", 1.0, cuda=True) == "managed"  # holds everything
    assert dm.choose_placement("host", 1.0, cuda=True) == "host"  # an explicit choice wins
    assert dm.choose_placement("managed", 0.1, cuda=True) == "managed"
    assert dm.choose_placement("host", 0.1, cuda=False) == "none"  # CPU, Metal
    # `device` (a mirror the compute reads, engine/experts/mirror.py) asked for: no check
    assert dm.choose_placement("device", 0.1, cuda=True) == "device"
    assert dm.choose_placement("device", 0.1, cuda=False) == "none"
    assert dm.choose_placement("auto", 0.01, cuda=False, mirror_fits=True) == "none"


def test_the_mirror_at_its_peak_fits_in_half_the_free_gpu_memory_and_never_when_unknown():
    gib = 2**30
    assert dm.mirror_fits(4 * gib, 78 * gib)  # the H100's 4 GiB cache: peaked 13.8 GiB
    assert dm.mirror_fits(8 * gib, 48 * gib)  # three times 8 in half of 48
    assert not dm.mirror_fits(8 * gib + 1, 48 * gib)
    assert not dm.mirror_fits(8 * gib, 16 * gib)
    assert not dm.mirror_fits(1, None)


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

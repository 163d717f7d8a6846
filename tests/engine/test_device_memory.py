"""Slot placement on MLX-CUDA: the choice rule, the override and the CPU no-op."""

from __future__ import annotations

import pytest

from ssdmoe_tui.engine.experts import device_memory as dm
from ssdmoe_tui.errors import BadValueError, user_message


def test_auto_mirrors_small_caches_where_the_gpu_has_room_and_puts_large_ones_in_managed() -> None:
    # under half the expert set: a device mirror when it fits and the page cache keeps the
    # experts (the H100's timeline: 7.81 tok/s against host's 6.21, docs/benchmarks.md),
    # host slots when it does not fit or the misses come from the disk (H200, cold under a
    # 12 GiB cap: host 3.41 tok/s against the mirror's 2.68)
    assert dm.choose_placement("auto", 0.24, cuda=True, mirror_fits=True, cached=True) == "device"
    assert dm.choose_placement("auto", 0.24, cuda=True, mirror_fits=True) == "host"  # from disk
    assert dm.choose_placement("auto", 0.24, cuda=True, mirror_fits=False, cached=True) == "host"
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


def test_the_page_cache_keeps_the_experts_in_four_fifths_of_the_memory_to_use() -> None:
    gib = 2**30
    assert dm.page_cache_keeps(16 * gib, 124 * gib)  # Q30's experts, the H200 uncapped
    assert not dm.page_cache_keeps(16 * gib, 8 * gib)  # under a 12 GiB cap, less 4 GiB banks
    assert dm.page_cache_keeps(8 * gib, 10 * gib)
    assert not dm.page_cache_keeps(8 * gib + 1, 10 * gib)
    # this machine: MemAvailable within the cgroup's limit (memory.py), read for real
    from ssdmoe_tui.memory import memory_limit

    lim = memory_limit()
    room = lim.cache_room
    assert 0 < room <= lim.mem_available
    assert lim.cgroup_limit is None or room <= lim.cgroup_limit


def test_the_note_says_each_reason_auto_kept_host_slots() -> None:
    gib = 2**30
    disk = dm.host_note(False, True, 16 * gib, 8 * gib, 4 * gib, 70 * gib)
    assert disk == (
        "the model's 16.0 GiB of experts would not stay in the page cache (8.0 GiB of memory"
        " to use): misses come from the disk, where host slots measured ahead of a device"
        " mirror"
    )
    room = dm.host_note(True, False, 16 * gib, 100 * gib, 4 * gib, None)
    assert room == (
        "no GPU room for a device mirror of 4.0 GiB (its copies at their peak: 3x; free: unknown)"
    )
    assert dm.host_note(False, False, 16 * gib, 8 * gib, 4 * gib, None) == f"{disk}; {room}"


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

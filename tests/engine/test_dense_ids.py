"""The long chunk's id bookkeeping by counting (`dense_unique`, `dense_rank`) gives exactly
what numpy's sorts gave: the same union, the same rows, so the same calls."""

from __future__ import annotations

import numpy as np
import pytest

from ssdmoe_tui.engine.model.streamed import dense_rank, dense_unique


@pytest.mark.parametrize(
    ("shape", "high", "dtype"),
    [((1, 4096, 8), 128, np.uint32), ((2, 300, 4), 512, np.uint32), ((1, 1, 8), 128, np.uint32),
     ((1, 64, 6), 6144, np.int64), ((0,), 8, np.int64), ((5,), 1, np.int64)],
)  # fmt: skip
def test_the_same_as_numpys_sorts(shape, high, dtype) -> None:
    rng = np.random.default_rng(sum(shape) + high)
    ids = rng.integers(0, high, size=shape).astype(dtype)
    uniq = dense_unique(ids)
    assert uniq.dtype == ids.dtype and np.array_equal(uniq, np.unique(ids))
    used, rank = dense_rank(ids)
    want = np.unique(ids)
    assert np.array_equal(used, want) and used.dtype == ids.dtype
    assert rank.shape == ids.shape and np.array_equal(rank, np.searchsorted(want, ids))
    assert np.array_equal(used[rank], ids)


def test_slots_shared_by_ids_outside_the_trace_cell() -> None:
    """A trace cell's extra ids point at the first slot (`lut[extra] = slots[0]`): the
    slot appears once in `used`, and every row naming it gets its one position."""
    slots = np.array([[[900, 17, 900, 4000]], [[17, 17, 5, 900]]], dtype=np.int64)
    used, rank = dense_rank(slots)
    assert used.tolist() == [5, 17, 900, 4000]
    assert rank.tolist() == [[[2, 1, 2, 3]], [[1, 1, 0, 2]]]

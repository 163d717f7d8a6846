"""The bench's round order (bench/order.py): balanced for position and for neighbour."""

from collections import Counter

import pytest

from ssdmoe_tui.bench.order import cycle_length, round_order


@pytest.mark.parametrize("n", range(1, 9))
def test_every_place_and_every_neighbour_equally_often(n: int) -> None:
    rows = [round_order(n, r) for r in range(cycle_length(n))]
    assert all(sorted(row) == list(range(n)) for row in rows)
    places = Counter((x, i) for row in rows for i, x in enumerate(row))
    assert len(places) == n * n and len(set(places.values())) == 1
    follows = Counter((row[i], row[i + 1]) for row in rows for i in range(n - 1))
    assert len(follows) == n * (n - 1) and len(set(follows.values())) <= 1
    assert [round_order(n, r) for r in range(len(rows), 2 * len(rows))] == rows


def test_two_runs_are_abba_and_three_keep_the_old_first_rounds() -> None:
    assert [round_order(2, r) for r in range(4)] == [[0, 1], [1, 0], [0, 1], [1, 0]]
    assert [round_order(3, r) for r in range(2)] == [[0, 1, 2], [2, 1, 0]]

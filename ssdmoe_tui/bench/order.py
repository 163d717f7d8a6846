"""The order in which a bench runs its configurations within each round.

A bench that compares configurations in one process runs each of them once a round; the
machine drifts within a process (±30 % on the lent GPU) and a run can be slowed by the
one before it (a compiled shape, a freed pool, a JSON write). A fixed order, or ABBA with
more than two configurations, leaves some of them always at the edge of a round or always
after the same neighbour: on the H100 (2026-12-05) a `--speculate none` row, whose code is
plain decode's, read 1.22x plain over ten ABBA rounds. A Williams design balances both
effects: over a full cycle every configuration runs at every position equally often and
follows every other configuration equally often. With two configurations it is ABBA.
"""

from __future__ import annotations


def _williams_row(n: int, r: int) -> list[int]:
    """Row r of the Williams square of n (even n: each row a rotation of 0, 1, n-1, 2, ...)."""
    first = [0]
    lo, hi = 1, n - 1
    while len(first) < n:
        first.append(lo)
        lo += 1
        if len(first) < n:
            first.append(hi)
            hi -= 1
    return [(x + r) % n for x in first]


def cycle_length(n: int) -> int:
    """Rounds after which `round_order(n, .)` is balanced: n for even n, 2n for odd n."""
    return 2 * n if n % 2 == 1 and n > 1 else max(n, 1)


def round_order(n: int, r: int) -> list[int]:
    """The order of configurations 0..n-1 in round r (0-based). For odd n the square is
    not carryover-balanced alone, so rounds run row k and then row k reversed."""
    if n <= 1:
        return list(range(n))
    if n % 2 == 0:
        return _williams_row(n, r % n)
    k = r % (2 * n)
    row = _williams_row(n, k // 2)
    return row if k % 2 == 0 else row[::-1]

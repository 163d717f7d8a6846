"""Global slot ids as (bank, rows): the cache's slots live in banks of `bank_slots` rows
each (a bank stays under MLX-CUDA's 2 GiB `gather_qmm` limit), and a copy of some slots'
rows (the mirror's sync, a long chunk's staged gather) works bank by bank."""

from __future__ import annotations

import numpy as np


def rows_by_bank(slots: np.ndarray, bank_slots: int) -> list[tuple[int, np.ndarray]]:
    """(bank, its rows) for each bank `slots` touch, banks ascending, each bank's rows in
    the order `slots` gives them."""
    bank, row = np.divmod(np.asarray(slots, dtype=np.int64), bank_slots)
    return [(int(b), row[bank == b]) for b in np.unique(bank)]

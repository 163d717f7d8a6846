"""Which rank owns which expert: a fixed, balanced map that needs no communication."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class ExpertMap:
    """owner(layer, expert) = (layer + expert) mod ranks.

    Balanced (per layer the ranks' shares differ by at most one expert, and the offset
    by layer spreads the remainders), deterministic, and needs no communication."""

    ranks: int
    num_layers: int
    num_experts: int

    def owner(self, layer: int, expert: int) -> int:
        return (layer + expert) % self.ranks

    def owned_mask(self, layer: int, rank: int) -> np.ndarray:
        return (np.arange(self.num_experts) + layer) % self.ranks == rank

    def owned_count(self, rank: int) -> int:
        return int(sum(self.owned_mask(layer, rank).sum() for layer in range(self.num_layers)))

    def as_dict(self) -> dict:
        total = self.num_layers * self.num_experts
        owned = [self.owned_count(r) for r in range(self.ranks)]
        return {
            "rule": "owner(layer, expert) = (layer + expert) mod ranks",
            "ranks": self.ranks,
            "owned_experts": owned,
            "owned_fraction": [round(n / total, 4) for n in owned],
        }

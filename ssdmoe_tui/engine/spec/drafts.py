"""Draft tokens that cost no forward pass: prompt lookup over the conversation so far
(n-gram), and the bench's oracle (a previous greedy run of the same prompt).

A drafter sees every token of the sequence as it is fixed (`extend`) and proposes up
to `depth` tokens to follow the last one (`propose`). Its drafts are point masses
(one token each, no distribution): verifying them by sampling the target model and
comparing is then exactly the standard acceptance rule (accept d with probability
p(d); on rejection the sample is drawn from p with d removed, renormalized), so the
output distribution is unchanged at any temperature, and greedy output is the
target's own argmax chain.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np

NGRAM_MAX = 3  # longest suffix looked up (the measure: a 3-gram lookup)
NGRAM_MIN = 2  # shortest: a 1-gram match is too often wrong to be worth a draft


class Drafter(Protocol):
    name: str

    def extend(self, tokens: Sequence[int]) -> None:
        """These tokens now follow the sequence (prompt first, then each fixed token)."""

    def propose(self, depth: int) -> list[int]:
        """Up to `depth` tokens to follow the sequence (fewer, or none, when it has none)."""


class NgramDrafter:
    """Prompt lookup: the continuation after the most recent earlier occurrence of the
    sequence's last n tokens (n = NGRAM_MAX down to NGRAM_MIN), from an index kept up to
    date one token at a time (O(1) per token, however long the conversation)."""

    name = "ngram"

    def __init__(self, n_max: int = NGRAM_MAX, n_min: int = NGRAM_MIN) -> None:
        self.n_max, self.n_min = n_max, n_min
        self.tokens: list[int] = []
        # n -> (the n tokens before position i) -> i, for the latest such i
        self._index: dict[int, dict[tuple[int, ...], int]] = {
            n: {} for n in range(n_min, n_max + 1)
        }

    def extend(self, tokens: Sequence[int]) -> None:
        ctx = self.tokens
        for t in tokens:
            i = len(ctx)
            for n, index in self._index.items():
                if i >= n:
                    index[tuple(ctx[i - n : i])] = i
            ctx.append(int(t))

    def propose(self, depth: int) -> list[int]:
        ctx = self.tokens
        if depth <= 0:
            return []
        for n in range(self.n_max, self.n_min - 1, -1):
            if len(ctx) < n:
                continue
            at = self._index[n].get(tuple(ctx[-n:]))
            if at is not None:
                return ctx[at : at + depth]
        return []


class OracleDrafter:
    """Drafts from `reference`, the tokens a previous greedy run of the same prompt
    generated: the token at generated position i is drafted as `reference[i]`, or, with
    probability 1 - `p`, as a wrong one (fixed per position by `seed`, so a position
    drafted twice is drafted alike and the acceptance is `p` in expectation). Measures
    the upside at a known acceptance; greedy output must still be the reference."""

    name = "oracle"

    def __init__(self, reference: Sequence[int], p: float, vocab: int, seed: int = 0) -> None:
        self.reference = [int(t) for t in reference]
        self.p = p
        rng = np.random.default_rng(seed)
        wrong = rng.random(len(self.reference)) >= p
        shift = rng.integers(1, max(vocab, 2), len(self.reference))
        self._drafts = [
            (t + int(s)) % max(vocab, 2) if w else t
            for t, w, s in zip(self.reference, wrong, shift, strict=True)
        ]
        self._prompt: int | None = None  # prompt length (the first extend)
        self._seen = 0  # tokens seen after the prompt

    def extend(self, tokens: Sequence[int]) -> None:
        if self._prompt is None:
            self._prompt = len(tokens)
        else:
            self._seen += len(tokens)

    def propose(self, depth: int) -> list[int]:
        # generated tokens so far = `_seen`: the next one is reference[_seen]
        return self._drafts[self._seen : self._seen + max(depth, 0)]


class NoDrafter:
    """Never drafts (the bench's `none`): every round is d = 0, so a run measures what the
    speculative loop itself costs against plain decode (issue 44: it must cost nothing)."""

    name = "none"

    def extend(self, tokens: Sequence[int]) -> None:
        pass

    def propose(self, depth: int) -> list[int]:
        return []

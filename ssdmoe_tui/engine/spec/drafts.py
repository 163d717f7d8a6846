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

# the oracle's re-anchoring (a reply that left every reference): the longest suffix of
# the reply found in a reference, down to ANCHOR_MIN tokens (shorter ones match by chance)
ANCHOR_MAX, ANCHOR_MIN = 8, 3


class Drafter(Protocol):
    name: str

    def extend(self, tokens: Sequence[int]) -> None:
        """These tokens now follow the sequence (prompt first, then each fixed token)."""

    def propose(self, depth: int) -> list[int]:
        """Up to `depth` tokens to follow the sequence (fewer, or none, when it has none)."""


class NgramDrafter:
    """Prompt lookup: the continuation after the most recent earlier occurrence of the
    sequence's last 3 tokens (a 3-gram lookup), else of its last 2 (a 1-gram match is too
    often wrong to be worth a draft), from an index kept up to date one token at a time
    (O(1) per token, however long the conversation).

    The keys of the next position (the last 2 and 3 tokens) are kept as tuples, built
    from the previous ones and the new token, and `propose` looks exactly those up: no
    slice of the sequence per token. It runs on every token of a speculating turn, also
    where nothing is drafted, and on a 1 ms GPU token a few microseconds showed (the
    demo's chat reply with `ngram`, nothing drafted: 0.96-0.97x plain on the H100)."""

    name = "ngram"

    def __init__(self) -> None:
        self.tokens: list[int] = []
        # (the 3 / 2 tokens before position i) -> i, for the latest such i
        self._at3: dict[tuple[int, int, int], int] = {}
        self._at2: dict[tuple[int, int], int] = {}
        self._last3: tuple[int, int, int] | None = None  # the sequence's last 3 tokens
        self._last2: tuple[int, int] | None = None  # and its last 2

    def extend(self, tokens: Sequence[int]) -> None:
        ctx, at3, at2 = self.tokens, self._at3, self._at2
        last3, last2 = self._last3, self._last2
        for t in tokens:
            i = len(ctx)
            if last3 is not None:
                at3[last3] = i
            if last2 is not None:
                at2[last2] = i
            t = int(t)
            ctx.append(t)
            if last2 is not None:
                last3 = (last2[0], last2[1], t)
            last2 = (ctx[i - 1], t) if i else None
        self._last3, self._last2 = last3, last2

    def propose(self, depth: int) -> list[int]:
        if depth <= 0:
            return []
        last3, last2 = self._last3, self._last2
        at = self._at3.get(last3) if last3 is not None else None
        if at is None and last2 is not None:
            at = self._at2.get(last2)
        return [] if at is None else self.tokens[at : at + depth]


class OracleDrafter:
    """Drafts from `reference`, the tokens a previous greedy run of the same prompt
    generated (and `also`, other runs' tokens): the token that follows the generated
    tokens in a reference they equal so far, or, with probability 1 - `p`, a wrong one
    (fixed per reference position by `seed`, so a position drafted twice is drafted
    alike and the acceptance is `p` in expectation). Measures the upside at a known
    acceptance; greedy output must still be the reference.

    Aligned by context, not by position: on MLX-CUDA a verify chunk's logits differ
    from a one-token step's (docs/benchmarks.md), so one near-tie flip makes the reply
    another text from there on; drafting `reference[i]` at position i then drafts the
    wrong text for the rest of the reply (the H100 run of 2026-12-05: depth 2 accepted
    1.8 %, and the governor, its shadow trials failing, stopped drafting). Once no
    reference equals the reply so far, the drafter re-anchors on the longest suffix of
    the reply (ANCHOR_MAX down to ANCHOR_MIN tokens) that occurs in a reference and
    drafts what follows it there, else nothing; `figures()` says where the reply left
    the first reference and how many proposals were re-anchored or empty."""

    name = "oracle"

    def __init__(self, reference: Sequence[int], p: float, vocab: int, seed: int = 0,
                 also: Sequence[Sequence[int]] = ()) -> None:  # fmt: skip
        self.reference = [int(t) for t in reference]
        self.p = p
        refs = [self.reference] + [[int(t) for t in r] for r in also if len(r)]
        self._refs = refs
        self._drafts = [self._wrong(r, p, vocab, seed) for r in refs]
        self._alive = list(range(len(refs)))  # references equal to the reply so far
        # n -> (n reply tokens) -> (reference, the position after them), first reference
        # and latest position winning
        self._index: dict[int, dict[tuple[int, ...], tuple[int, int]]] = {}
        self._prompt: int | None = None  # prompt length (the first extend)
        self.out: list[int] = []  # tokens generated so far
        self.diverged_at: int | None = None  # first position the reply left `reference`
        self.reanchored = 0  # proposals drafted from a suffix match, not a full prefix
        self.unanchored = 0  # proposals with no reference to draft from

    @staticmethod
    def _wrong(ref: list[int], p: float, vocab: int, seed: int) -> list[int]:
        rng = np.random.default_rng(seed)
        wrong = rng.random(len(ref)) >= p
        shift = rng.integers(1, max(vocab, 2), len(ref))
        v = max(vocab, 2)
        return [(t + int(s)) % v if w else t for t, w, s in zip(ref, wrong, shift, strict=True)]

    def extend(self, tokens: Sequence[int]) -> None:
        if self._prompt is None:
            self._prompt = len(tokens)
            return
        refs, out = self._refs, self.out
        for t in tokens:
            i, t = len(out), int(t)
            out.append(t)
            if self._alive:
                self._alive = [r for r in self._alive if i < len(refs[r]) and refs[r][i] == t]
            if self.diverged_at is None and 0 not in self._alive:
                self.diverged_at = i

    def propose(self, depth: int) -> list[int]:
        if depth <= 0:
            return []
        i = len(self.out)
        if self._alive:  # the reply so far equals this reference: its next tokens
            return self._drafts[self._alive[0]][i : i + depth]
        if not self._index:
            self._build_index()
        for n in range(ANCHOR_MAX, ANCHOR_MIN - 1, -1):
            if i < n:
                continue
            at = self._index[n].get(tuple(self.out[-n:]))
            if at is not None:
                r, j = at
                drafts = self._drafts[r][j : j + depth]
                if drafts:
                    self.reanchored += 1
                    return drafts
        self.unanchored += 1
        return []

    def _build_index(self) -> None:
        """Every n-gram of every reference (built once the reply leaves them all)."""
        for n in range(ANCHOR_MIN, ANCHOR_MAX + 1):
            index: dict[tuple[int, ...], tuple[int, int]] = {}
            for r in range(len(self._refs) - 1, -1, -1):
                ref = self._refs[r]
                for j in range(n, len(ref)):
                    index[tuple(ref[j - n : j])] = (r, j)
            self._index[n] = index

    def figures(self) -> dict:
        """Where the reply left the first reference (None: never), and the proposals
        drafted after a re-anchoring or left empty (JSON: `spec.oracle`)."""
        return {
            "references": len(self._refs),
            "diverged_at": self.diverged_at,
            "reanchored": self.reanchored,
            "unanchored": self.unanchored,
        }


class NoDrafter:
    """Never drafts (the bench's `none`): every round is d = 0, so a run measures what the
    speculative loop itself costs against plain decode (issue 44: it must cost nothing)."""

    name = "none"

    def extend(self, tokens: Sequence[int]) -> None:
        pass

    def propose(self, depth: int) -> list[int]:
        return []

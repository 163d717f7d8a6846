"""Streamed text and the markers that may be cut across its pieces."""

from __future__ import annotations

from collections.abc import Sequence


def held(text: str, markers: Sequence[str]) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of a marker: what
    a streaming reader keeps back until the next piece says whether a marker starts."""
    best = 0
    for m in markers:
        for n in range(min(len(m) - 1, len(text)), best, -1):
            if text.endswith(m[:n]):
                best = n
                break
    return best

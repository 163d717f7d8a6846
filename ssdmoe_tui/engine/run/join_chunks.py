"""How many prompt tokens a sequence joining a running batch prefills between two decode
steps of the others: a time budget per step (issue 43: a joining 1k-token prompt must not
stall the decoding rows more than ~0.3 s).

A fixed token cap does not bound the stall: a chunk's cost is its compute (grows with its
tokens) plus its expert reads (the union of its tokens' experts, which a streamed model
reads again each chunk and which grows far slower), and both depend on the hardware and the
cache. On the H200 with a 4 GiB cache a 64-token chunk of the real trace took 1.1 s, on two
CPU cores a 128-token chunk of the demo 0.8 s; with every expert held on the GPU a
2,048-token chunk takes milliseconds. So the chunk is sized from the last one's measured
time, as vLLM's chunked prefill budgets tokens per step and mlx-lm's `BatchGenerator` its
`prefill_step_size`, but by time: n' = budget x n / t(n). With t(n) = a + b n (a: the
fixed part, reads of the union, syncs; b: per-token compute) this converges to the n that
fills the budget, (budget - a) / b, and to 1 token where even one exceeds it. Growth is at
most GROWTH x a chunk, so one cheap chunk (a cache that happened to hold its experts, a
quiet moment of a shared machine) does not make the next a long one; on two loaded CPU
cores doubling overshot the budget by 1.5-2.5x (a 31-token chunk in 0.07 s, the next 62
in 0.37 s).
"""

from __future__ import annotations

from dataclasses import dataclass

# Tokens in one prefill chunk of a sequence joining rows that decode, at most: each chunk
# runs between two of their steps (a chunk's compute grows with it; its expert reads, the
# union of its tokens' experts, grow more slowly).
JOIN_CHUNK = 128
JOIN_BUDGET_S = 0.25  # a joining sequence's prefill work between two decode steps
FIRST_JOIN_CHUNK = 8  # tokens, before any chunk has been measured beside decoding rows
GROWTH = 1.5  # the most a chunk grows over the last measured one


@dataclass
class JoinSizer:
    """Chunk sizes for a sequence joining rows that decode; kept by the batch across joins
    (the same engine: the same costs)."""

    budget_s: float = JOIN_BUDGET_S
    cap: int | None = None  # at most this many tokens (None: no token cap)
    last: int = 0  # the last measured chunk's tokens
    last_s: float = 0.0  # and its seconds

    def size(self) -> int:
        """The next chunk's tokens (at least 1)."""
        if self.last <= 0 or self.last_s <= 0:
            n = FIRST_JOIN_CHUNK
        else:
            n = min(int(self.budget_s * self.last / self.last_s), int(GROWTH * self.last))
        n = max(n, 1)
        return n if self.cap is None else min(n, self.cap)

    def measure(self, tokens: int, seconds: float) -> None:
        """A chunk of `tokens` stalled the decoding rows `seconds`."""
        if tokens > 0 and seconds > 0:
            self.last, self.last_s = tokens, seconds

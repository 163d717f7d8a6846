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
`prefill_step_size`, but by time. The last chunks' times are fitted to t(n) = a + b n (a:
the fixed part, reads of the union, syncs; b: per-token compute) and the next chunk is the
n that fills the budget, (budget - a) / b.

Where even one token costs more than the budget (a streamed layer's reads: on an H100
with host slots, a 4 GiB cache and the real trace, a one-token chunk beside four decoding
rows stalled them 0.71 s, 2026-12-07 thirteenth session), no size keeps the stall under
it, and one-token chunks (what `budget x n / t(n)` gave) only make the join endless: that
probe prefilled 273 of 1,024 tokens in 273 chunks, each stalling the rows ~0.7 s, and
never finished. So where one token costs more than the budget, the target is
`FIXED_STALL` x t(1), t(1) = a + b: a chunk may stall the rows up to twice what the
smallest chunk costs them anyway, and takes as many tokens as fit in the rest (an H100's
compute: the token cap), so the join ends in a few steps. Where one token fits, the
budget stands. It is t(1) and not the fixed part a alone (as until 2026-12-08) because a
fit on a loaded machine can give a = 0 (the fit clamps it): a target of 2a = 0 then held
every chunk at one token, and once the first chunk left the fit's window the chunks all
had one size, so the line was never refitted (two CPU cores under load, 2026-12-07: the
join went a token a chunk until the row it joined had ended). 2 t(1) is at least two
tokens.

The line only proposes: a chunk more than `OFF_LINE` x over the target is sized from its
own time instead (costs that rose, or a line fitted to noisy first chunks: one 250x too
steep held a review's simulated join at two tokens a chunk), and chunks that all had one
size and fit the target try one token more (else the line, which one size cannot refit,
holds them).

Growth is at most GROWTH x a chunk, so one cheap chunk (a cache that happened to hold its
experts, a quiet moment of a shared machine) does not make the next a long one; on two
loaded CPU cores doubling overshot the budget by 1.5-2.5x (a 31-token chunk in 0.07 s,
the next 62 in 0.37 s).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

# Tokens in one prefill chunk of a sequence joining rows that decode, at most: each chunk
# runs between two of their steps (a chunk's compute grows with it; its expert reads, the
# union of its tokens' experts, grow more slowly).
JOIN_CHUNK = 128
JOIN_BUDGET_S = 0.25  # a joining sequence's prefill work between two decode steps
FIRST_JOIN_CHUNK = 8  # tokens, before any chunk has been measured beside decoding rows
GROWTH = 1.5  # the most a chunk grows over the last measured one
FIXED_STALL = 2.0  # a chunk may stall the rows this many times a one-token chunk's time
FIT_CHUNKS = 8  # the last chunks the cost line is fitted to
OFF_LINE = 1.5  # a chunk this far over the target is sized from its own time instead


@dataclass
class JoinSizer:
    """Chunk sizes for a sequence joining rows that decode; kept by the batch across joins
    (the same engine: the same costs)."""

    budget_s: float = JOIN_BUDGET_S
    cap: int | None = None  # at most this many tokens (None: no token cap)
    # the last FIT_CHUNKS measured chunks: (tokens, seconds)
    seen: deque[tuple[int, float]] = field(default_factory=lambda: deque(maxlen=FIT_CHUNKS))
    # the last (a, b) fitted: kept while the chunks seen all have one size (the token cap)
    line: tuple[float, float] | None = None

    def fit(self) -> tuple[float, float | None]:
        """(a, b) of t(n) = a + b n over the chunks seen, least squares, a >= 0; while
        they all have one size, the last line fitted, else (their mean time, None)."""
        ns = [n for n, _ in self.seen]
        ts = [t for _, t in self.seen]
        n_mean, t_mean = sum(ns) / len(ns), sum(ts) / len(ts)
        var = sum((n - n_mean) ** 2 for n in ns)
        if var == 0:
            return self.line if self.line is not None else (t_mean, None)
        b = sum((n - n_mean) * (t - t_mean) for n, t in self.seen) / var
        self.line = (max(0.0, t_mean - b * n_mean), b)
        return self.line

    def size(self) -> int:
        """The next chunk's tokens (at least 1)."""
        if not self.seen:
            n = FIRST_JOIN_CHUNK
        else:
            last_n, last_t = self.seen[-1]
            a, b = self.fit()
            if b is None:  # one size so far: a is that size's time, fixed part and all
                n = int(self.budget_s * last_n / last_t)
            else:
                # the budget, or, where even a one-token chunk's stall t(1) is over it,
                # twice that (t(1), not the fixed part a, which a noisy fit may clamp to 0)
                one = a + max(b, 0.0)
                target = self.budget_s if one <= self.budget_s else FIXED_STALL * one
                ratio = int(target * last_n / last_t)  # the last chunk scaled to the target
                # (a flat line's tiny b would make the quotient inf: bounded first)
                n = int(min((target - a) / b, 1 << 30)) if b > 0 else ratio
                if last_t > OFF_LINE * target:
                    n = min(n, ratio)  # costs rose, or the line was fitted to noise
                elif n == last_n and len({m for m, _ in self.seen}) == 1 and last_t < target:
                    n = last_n + 1  # a line it cannot refit holds the size: try the next
            n = min(n, max(int(GROWTH * last_n), last_n + 1))
        n = max(n, 1)
        return n if self.cap is None else min(n, self.cap)

    def measure(self, tokens: int, seconds: float) -> None:
        """A chunk of `tokens` stalled the decoding rows `seconds`."""
        if tokens > 0 and seconds > 0:
            self.seen.append((tokens, seconds))

"""The draft depth of each speculative round, priced before the round reads anything.

A round verifies d drafted tokens in one forward pass of d + 1 tokens (the last
fixed token and the drafts). With a running acceptance a (the chance a draft token is
right, given the ones before it were), the round yields

    A(d) = 1 + a + a^2 + ... + a^d            tokens (accepted drafts + one of its own)

and costs

    T(d) = C(d + 1) + M(d + 1) * B / R  [+ (1 - a^d) * C(d)  where the KV cache cannot be
                                          trimmed and a partly accepted chunk is re-run]
           + L + W  where a pipelined d = 0 step was already built

where C(n) is the measured cost of a round of n tokens (wall time from its start to the
next round's, so what a pipelined step overlaps is in it, less expert reads; the median
of the last WINDOW such rounds; the fixed per-pass cost is C(1)), M(n) the expected
expert misses of a pass of n tokens (0 when every expert is held; else measured,
interpolated between measured sizes, or, before any was, those of one token scaled by
the per-layer union growth U(n) / U(1), U measured per chunk size from the cache's
lookups, prior E * (1 - (1 - K/E)^n)), B the bytes of one expert and R the disk's
measured rate; T never falls below a smaller pass's. Where d = 0 rounds are pipelined
(every expert held: the next step is built while this one computes), a verify round
after a pipelined d = 0 round also costs what pipelining saved: L, the measured extra
of a d = 0 round after a verify round (none is built for it), and W, the measured wait
for the built step it gives back (C(1) until measured). After a verify round d = 0 is
cold too: it is priced C(1) + L, a verify round C(d + 1), so a run of drafts that keep
matching goes on. Where a verify round chains (verify.py: the next step built on its
last sample, standing when every draft is kept) it leaves the next round cold only when
a draft is rejected: it is priced (1 - a^d) * L, not L, for it. Without L and W the CPU demo drafted at 88 % acceptance where a
depth-2 round cost 16 ms against 6.6 ms a step, and lost (0.91x). The governor picks the d in
0..D (D: the drafts on offer, at most AUTO_DEPTH) that maximizes A(d) / T(d); d > 0 only
when it beats d = 0 by MARGIN, so estimation noise does not turn into a loss (at a = 0
no depth can). Acceptance is measured on every round, d = 0 included: the drafter's
first proposal is checked against the token the step produced (a shadow trial that
costs nothing), so a governor that stopped drafting sees when drafts would pay again.
docs/engine.md, "The governor".
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from statistics import median

MAX_DEPTH = 8  # drafts per round at most (`--draft-depth` range)
AUTO_DEPTH = 4  # the governor's own ceiling
MARGIN = 0.05  # d > 0 must beat d = 0 by this share of expected tokens/s
DECAY = 0.95  # weight of the past per acceptance trial (an effective window of ~20)
EMA = 0.3  # weight of a new disk-rate measurement
WINDOW = 15  # passes of one size whose median prices the next
PACE = 0.2  # weight of a new one-token pass in the pace (CostModel.pace)
PRIOR_SLOPE = 0.15  # C(n) / C(1) - 1 per extra token before any n > 1 was measured


def geometric_tokens(a: float, d: int) -> float:
    """A(d): expected tokens from a round of depth d at per-token acceptance a."""
    return float(sum(a**i for i in range(d + 1)))


@dataclass
class Acceptance:
    """A running estimate of a: decayed successes over decayed trials, from a 50 % prior
    worth two trials."""

    hits: float = 1.0
    trials: float = 2.0

    @property
    def rate(self) -> float:
        return self.hits / self.trials if self.trials > 0 else 0.0

    def observe(self, accepted: int, trials: int) -> None:
        """`trials` draft tokens were judged, the first `accepted` of them were right."""
        for i in range(trials):
            self.hits = self.hits * DECAY + (1.0 if i < accepted else 0.0)
            self.trials = self.trials * DECAY + 1.0


class PassFigures:
    """What one pass of n tokens cost: medians over the last WINDOW passes of that size of
    compute seconds, lookups (the per-layer union, summed over layers) and misses. Not
    a mean: on a shared machine a pass that waits for a core takes up to ten times the
    others, and one such pass would carry into the next prices. The medians are taken
    when a price asks for them, not per pass: most rounds draft nothing and ask none."""

    def __init__(self) -> None:
        self._samples: deque[tuple[float, float, float]] = deque(maxlen=WINDOW)
        self._medians: tuple[float, float, float] | None = (0.0, 0.0, 0.0)

    @property
    def count(self) -> int:
        return len(self._samples)

    def update(self, compute_s: float, lookups: float, misses: float) -> None:
        self._samples.append((compute_s, lookups, misses))
        self._medians = None

    def _figures(self) -> tuple[float, float, float]:
        if self._medians is None:
            cols = zip(*self._samples, strict=True)
            c, lk, m = (float(median(col)) for col in cols)
            self._medians = (c, lk, m)
        return self._medians

    @property
    def compute_s(self) -> float:
        return self._figures()[0]

    @property
    def lookups(self) -> float:
        return self._figures()[1]

    @property
    def misses(self) -> float:
        return self._figures()[2]


@dataclass
class CostModel:
    """The engine's own figures, measured on every decode pass of this engine."""

    num_experts: int
    k: int
    expert_bytes: int
    all_held: bool = False  # every expert resident for good: no pass reads
    passes: dict[int, PassFigures] = field(default_factory=dict)
    disk_bytes_s: float | None = None  # measured read rate (EMA)
    # Where d = 0 rounds are pipelined (the next step built while this one computes): a
    # d = 0 round that was not (after a verify round, which leaves none built), and the
    # wait for a pipelined step that a verify round gave back (it runs to its end).
    cold: PassFigures = field(default_factory=PassFigures)
    waste: PassFigures = field(default_factory=PassFigures)
    # The pace: a running mean (EMA weight PACE) of the one-token pass's compute. Every
    # compute sample is kept in units of the pace when it was taken, and priced back at
    # today's pace: on a shared CPU the same pass took 4 ms in one second and 16 ms in
    # the next, and medians of absolute seconds taken over different windows (cold
    # rounds are rare, one-token rounds many) priced L at 6-9 ms where a cold step
    # measured alone cost what a warm one did (the governor then declined the repeat
    # check's drafts: 0.97-1.12x where fixed depth 4 gave 1.15-1.21x).
    pace: float | None = None

    def measure(self, n: int, compute_s: float, read_s: float, lookups: int, misses: int,
                bytes_read: int) -> None:  # fmt: skip
        """One pass of `n` tokens computed for `compute_s` and read `bytes_read` in `read_s`."""
        compute = max(compute_s, 0.0)
        if n == 1:
            self.pace = compute if self.pace is None else self.pace + PACE * (compute - self.pace)
        unit = self.pace or 1.0
        self.passes.setdefault(n, PassFigures()).update(
            compute / unit, float(lookups), float(misses)
        )
        if bytes_read > 0 and read_s > 0:
            rate = bytes_read / read_s
            self.disk_bytes_s = (
                rate if self.disk_bytes_s is None
                else self.disk_bytes_s + EMA * (rate - self.disk_bytes_s)
            )  # fmt: skip

    def measure_cold(self, compute_s: float) -> None:
        """A d = 0 round that found no step built for it, where d = 0 rounds pipeline."""
        self.cold.update(max(compute_s, 0.0) / (self.pace or 1.0), 0.0, 0.0)

    def measure_waste(self, seconds: float) -> None:
        """The wait for a pipelined step that was given back for a verify round."""
        self.waste.update(max(seconds, 0.0) / (self.pace or 1.0), 0.0, 0.0)

    def _c(self, figures: PassFigures) -> float:
        """A figure's compute seconds at today's pace (samples are kept in its units)."""
        return figures.compute_s * (self.pace or 1.0)

    def pipeline_loss(self) -> float:
        """L: what the d = 0 round after a verify round costs more than a pipelined one
        (a verify round leaves no next step built); 0 until both were measured."""
        one = self.passes.get(1)
        if one is None or not one.count or not self.cold.count:
            return 0.0
        return max(self._c(self.cold) - self._c(one), 0.0)

    def give_back_s(self) -> float:
        """W: the compute lost when a pipelined step is given back for a verify round;
        before one was measured, the whole step (C(1))."""
        if self.waste.count:
            return self._c(self.waste)
        return self.compute(1) or 0.0

    def compute(self, n: int) -> float | None:
        """C(n): measured, interpolated between measured sizes, or C(1) scaled by the prior;
        never below the compute of a smaller pass (more tokens never cost less)."""
        c = self._compute(n)
        if c is None:
            return None
        smaller = [self._c(self.passes[m]) for m in self.passes if m < n]
        return max([c, *smaller])

    def _compute(self, n: int) -> float | None:
        if not self.passes:
            return None
        one = self.passes.get(1)
        if len(self.passes) == 1 or (n not in self.passes and one is None):
            m = next(iter(self.passes))
            c = self._c(self.passes[m])
            return c * (1 + PRIOR_SLOPE * (n - 1)) / (1 + PRIOR_SLOPE * (m - 1))
        return self._between(n, "compute_s") * (self.pace or 1.0)

    def _between(self, n: int, attr: str) -> float:
        """A figure at size n: measured, or linear between (beyond: along) the two nearest
        measured sizes (at least two are)."""
        if n in self.passes:
            return getattr(self.passes[n], attr)
        known = sorted(self.passes)
        lo = max((m for m in known if m < n), default=None)
        hi = min((m for m in known if m > n), default=None)
        if lo is None:
            lo, hi = known[0], known[1]
        elif hi is None:
            lo, hi = known[-2], known[-1]
        vlo, vhi = getattr(self.passes[lo], attr), getattr(self.passes[hi], attr)
        return max(vlo + (vhi - vlo) * (n - lo) / (hi - lo), 0.0)

    def union_growth(self, n: int) -> float:
        """U(n) / U(1): measured lookups per pass where both sizes were seen, else the
        prior of independent routing."""
        one = self.passes.get(1)
        if one is not None and n in self.passes and one.lookups > 0:
            return self.passes[n].lookups / one.lookups
        e, k = max(self.num_experts, 1), min(self.k, self.num_experts)
        return (e * (1 - (1 - k / e) ** n)) / k if k > 0 else float(n)

    def misses(self, n: int) -> float:
        """M(n): expected misses of a pass of n tokens."""
        if self.all_held:
            return 0.0
        if n in self.passes:
            return self.passes[n].misses
        if len(self.passes) >= 2:
            return self._between(n, "misses")
        one = self.passes.get(1)
        return 0.0 if one is None else one.misses * self.union_growth(n)

    def read_s(self, n: int) -> float:
        m = self.misses(n)
        if m <= 0:
            return 0.0
        rate = self.disk_bytes_s or 1e9  # before any read: 1 GB/s
        return m * self.expert_bytes / rate

    def pass_s(self, n: int) -> float | None:
        """T(n): compute and reads; never below a smaller pass's (more tokens never cost less:
        at acceptance 0 no depth can then beat d = 0)."""
        c = self.compute(n)
        if c is None:
            return None
        t = c + self.read_s(n)
        smaller = [self._c(self.passes[m]) + self.read_s(m) for m in self.passes if m < n]
        return max([t, *smaller])


@dataclass(frozen=True)
class Choice:
    depth: int
    expected_tokens: float
    expected_s: float | None  # None: nothing measured yet


class Governor:
    """Chooses each round's depth from the cost model and the running acceptance.

    `fixed`: a depth set by the user (`--draft-depth`): used whenever that many drafts
    are on offer (fewer: as many as there are), the price is not asked."""

    def __init__(self, costs: CostModel, acceptance: Acceptance, fixed: int | None = None,
                 rerun: bool = False, chains: bool = False) -> None:  # fmt: skip
        self.costs = costs
        self.acceptance = acceptance
        self.fixed = fixed
        self.rerun = rerun  # a partly accepted chunk is re-run (non-trimmable KV cache)
        # a verify round builds the next step on its last sample (verify.py, "Chaining"):
        # the next d = 0 round is cold only when a draft is rejected
        self.chains = chains

    def choose(self, offered: int, pending: bool = False) -> Choice:
        """The depth of this round; `pending`: a pipelined d = 0 step is already built
        (a verify round gives it back, its compute lost: W)."""
        if offered <= 0:
            return Choice(0, 1.0, self.costs.pass_s(1))
        if self.fixed is not None:
            d = min(self.fixed, offered)
            return Choice(d, geometric_tokens(self.acceptance.rate, d), self.costs.pass_s(d + 1))
        a = self.acceptance.rate
        base = self.costs.pass_s(1)
        if base is None or base <= 0:
            return Choice(0, 1.0, base)  # the first decode pass is measured before drafting
        loss = self.costs.pipeline_loss()
        if pending:  # d = 0 is the built step; a verify round gives it back (W) and leaves
            extra = self.costs.give_back_s()  # the next d = 0 round cold (L, below)
        else:  # after a verify round: d = 0 is cold, it costs L itself
            base, extra = base + loss, 0.0
        best = Choice(0, 1.0, base)
        best_rate = (1.0 / base) * (1 + MARGIN)
        for d in range(1, min(offered, AUTO_DEPTH) + 1):
            t = self.costs.pass_s(d + 1)
            if t is None:
                continue
            if self.chains:  # the round after is cold only when a draft is rejected
                t += extra + (1 - a**d) * loss
            elif pending:  # it is always cold (once cold, it stays so: no L again)
                t += extra + loss
            if self.rerun:
                t += (1 - a**d) * (self.costs.compute(d) or 0.0)
            tokens = geometric_tokens(a, d)
            if t > 0 and tokens / t > best_rate:
                best, best_rate = Choice(d, tokens, t), tokens / t
        return best

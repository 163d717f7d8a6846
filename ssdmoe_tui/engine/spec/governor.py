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

Probing: a price is only re-measured when the governor drafts at that size, so one
expensive sample (a chunk shape compiling on MLX-CUDA, a burst of load) priced drafting
out for good: on the H100 (2026-12-05) `auto` drafted once in 195 rounds at 100 %
acceptance, 0.78x; a simulation with a 100 ms first chunk gives the same {0: 195, 4: 1}.
After PROBE_EVERY rounds in a row that had drafts on offer and drafted none, where the
prior prices (C(n) = C(1) (1 + PRIOR_SLOPE (n - 1)), with the measured C(1), L, W and
acceptance) say a depth would pay, the governor forgets its n > 1 figures and drafts
that depth once (a probe: `probes` in the figures); a probe that still finds no gain
doubles the wait (at most PROBE_MAX rounds), so where refusing is right it costs a
round in hundreds. At acceptance 0 the prior never pays: no probe.

Cost when nothing is drafted: the prices of every depth are kept in a table per set of
conditions (a step pending, chaining, re-running), rebuilt when a figure other than the
one-token pass moved (a verify round, a cold or given-back step, a disk read), or every
REPRICE rounds (the pace) unless even NEAR more acceptance would not draft (the prices
then move with the pace together, the choice stands); a round then costs a few float
operations, and none where even the best depth at this acceptance could not pay. The
one-token rounds a table is priced from are kept unfolded until it is built
(CostModel.note_step).
docs/engine.md, "The governor".
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
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
PROBE_EVERY = 32  # refused rounds with drafts on offer before a probe (then doubling)
PROBE_MAX = 512  # the longest wait between probes
REPRICE = 8  # rounds a price table serves while no figure but the one-token pass moved
# ... and longer while even this much more acceptance would not draft: its prices move
# with the pace together (no reads: a read moves `version`), so its choice stands
NEAR = 0.1
# pipelined one-token rounds a cost model keeps before folding them (CostModel.note_step;
# they are folded whenever a price is built or another figure measured)
FOLD_EVERY = 64


def geometric_tokens(a: float, d: int) -> float:
    """A(d): expected tokens from a round of depth d at per-token acceptance a (the sum in
    closed form: it is asked every round that has drafts on offer)."""
    if a == 1.0:
        return float(d + 1)
    return (1.0 - a ** (d + 1)) / (1.0 - a)


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
    # bumped whenever a figure other than the one-token pass (and the pace) moves: the
    # governor's price table is rebuilt then
    version: int = 0
    # pipelined one-token rounds that read nothing, (seconds, lookups), not folded yet
    _steps: list[tuple[float, int]] = field(
        default_factory=list, init=False, repr=False, compare=False
    )

    def measure(self, n: int, compute_s: float, read_s: float, lookups: int, misses: int,
                bytes_read: int) -> None:  # fmt: skip
        """One pass of `n` tokens computed for `compute_s` and read `bytes_read` in `read_s`."""
        self.fold()  # the rounds before this one first: the pace moves in order
        compute = max(compute_s, 0.0)
        if n == 1:
            self.pace = compute if self.pace is None else self.pace + PACE * (compute - self.pace)
        unit = self.pace or 1.0
        self.passes.setdefault(n, PassFigures()).update(
            compute / unit, float(lookups), float(misses)
        )
        if n > 1 or misses:
            self.version += 1
        if bytes_read > 0 and read_s > 0:
            self.version += 1
            rate = bytes_read / read_s
            self.disk_bytes_s = (
                rate if self.disk_bytes_s is None
                else self.disk_bytes_s + EMA * (rate - self.disk_bytes_s)
            )  # fmt: skip

    def note_step(self, seconds: float, lookups: int) -> None:
        """A pipelined one-token round that read nothing: kept, and folded (`fold`) only
        when a price is built or another figure is measured. Most rounds of a speculating
        turn are such rounds, and on a 1 ms GPU token the loop's bookkeeping showed (the
        demo's chat reply with `ngram`, nothing drafted: 0.95-0.97x plain on the H100
        while each round with drafts on offer folded and priced)."""
        steps = self._steps
        steps.append((seconds, lookups))
        if len(steps) >= FOLD_EVERY:
            self.fold()

    def fold(self) -> None:
        """The kept one-token rounds, in the order they ran, with the figures
        `measure(1, s, 0.0, lookups, 0, 0)` one at a time would give: the pace moves with
        each; only the last WINDOW stay in the pass's window (the others would be pushed
        out of it), each in units of the pace it was taken at."""
        steps = self._steps
        if not steps:
            return
        pace = self.pace
        figures = self.passes.setdefault(1, PassFigures())
        keep_from = len(steps) - WINDOW
        for i, (seconds, lookups) in enumerate(steps):
            compute = max(seconds, 0.0)
            pace = compute if pace is None else pace + PACE * (compute - pace)
            if i >= keep_from:
                figures.update(compute / (pace or 1.0), float(lookups), 0.0)
        self.pace = pace
        steps.clear()

    def measure_cold(self, compute_s: float) -> None:
        """A d = 0 round that found no step built for it, where d = 0 rounds pipeline."""
        self.fold()
        self.cold.update(max(compute_s, 0.0) / (self.pace or 1.0), 0.0, 0.0)
        self.version += 1

    def measure_waste(self, seconds: float) -> None:
        """The wait for a pipelined step that was given back for a verify round."""
        self.fold()
        self.waste.update(max(seconds, 0.0) / (self.pace or 1.0), 0.0, 0.0)
        self.version += 1

    def forget_chunks(self) -> None:
        """Drop every figure of passes of n > 1 tokens (a probe re-measures them: they may
        date from a chunk shape's compilation or a burst of load)."""
        for n in [m for m in self.passes if m > 1]:
            del self.passes[n]
        self.version += 1

    def prior_pass_s(self, n: int) -> float | None:
        """T(n) as if no pass of n > 1 tokens had been measured: C(1) scaled by the
        prior, plus the reads M(n) (a probe's what-if)."""
        one = self.passes.get(1)
        if one is None or not one.count:
            return None
        return self._c(one) * (1 + PRIOR_SLOPE * (n - 1)) + self.read_s(n)

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
    probe: bool = False  # drafted to re-measure, against the measured prices (see above)


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
        self.idle = 0  # rounds in a row with drafts on offer that drafted none
        self.probe_after = PROBE_EVERY
        # price tables by conditions (all held, pending, chains, rerun): a round's
        # conditions alternate (whether the drafts run out decides `chains`), and one
        # table, rebuilt at each change, cost 14 us in isolation, ~75 in the decode loop
        self._tables: dict[tuple[bool, bool, bool, bool], _Table] = {}

    def choose(self, offered: int, pending: bool = False) -> Choice:
        """The depth of this round; `pending`: a pipelined d = 0 step is already built
        (a verify round gives it back, its compute lost: W)."""
        if offered <= 0:
            return Choice(0, 1.0, None)
        if self.fixed is not None:
            self.costs.fold()
            d = min(self.fixed, offered)
            return Choice(d, geometric_tokens(self.acceptance.rate, d), self.costs.pass_s(d + 1))
        a = self.acceptance.rate
        depths = min(offered, AUTO_DEPTH)
        table = self._prices(pending, a)
        if table is None:
            return Choice(0, 1.0, None)  # the first decode pass is measured before drafting
        best = table.best(a, depths)
        if best.depth:
            self.idle, self.probe_after = 0, PROBE_EVERY
            return best
        self.idle += 1
        if self.idle < self.probe_after:
            return best
        self.idle = 0
        prior = self._build(pending, self.costs.prior_pass_s)
        trial = prior.best(a, depths) if prior is not None else best
        if not trial.depth:
            return best
        self.probe_after = min(self.probe_after * 2, PROBE_MAX)
        self.costs.forget_chunks()
        return Choice(trial.depth, trial.expected_tokens, trial.expected_s, probe=True)

    def _prices(self, pending: bool, a: float) -> _Table | None:
        """The price table for these conditions: kept while only the one-token figures
        moved, for REPRICE rounds, or longer while acceptance `a` is NEAR from none of its
        depths paying (a rebuild cost ~50-75 us in the CPU demo's loop, on one round in
        eight of those with drafts on offer)."""
        c = self.costs
        key = (c.all_held, pending, self.chains, self.rerun)
        t = self._tables.get(key)
        if (
            t is not None and t.version == c.version and t.uses >= REPRICE
            and not t.best(min(a + NEAR, 1.0), AUTO_DEPTH).depth
        ):  # fmt: skip
            t.uses = 0
        if t is None or t.version != c.version or t.uses >= REPRICE:
            t = self._build(pending, c.pass_s)
            if t is None:
                return None
            t.version = c.version
            self._tables[key] = t
        t.uses += 1
        return t

    def _build(self, pending: bool, pass_s: Callable[[int], float | None]) -> _Table | None:
        """Each depth's cost up to AUTO_DEPTH, split into what does not depend on the
        acceptance a and the coefficient of (1 - a^d): T(d) = fixed + (1 - a^d) * per_miss."""
        self.costs.fold()  # the one-token rounds kept since the last price
        base = pass_s(1)
        if base is None or base <= 0:
            return None
        costs = self.costs
        loss = costs.pipeline_loss()
        if pending:  # d = 0 is the built step; a verify round gives it back (W) and leaves
            extra = costs.give_back_s()  # the next d = 0 round cold (L, below)
        else:  # after a verify round: d = 0 is cold, it costs L itself
            base, extra = base + loss, 0.0
        rows: list[tuple[int, float, float]] = []
        for d in range(1, AUTO_DEPTH + 1):
            t = pass_s(d + 1)
            if t is None:
                continue
            per_miss = 0.0
            if self.chains:  # the round after is cold only when a draft is rejected
                t, per_miss = t + extra, loss
            elif pending:  # it is always cold (once cold, it stays so: no L again)
                t += extra + loss
            if self.rerun:
                per_miss += costs.compute(d) or 0.0
            rows.append((d, t, per_miss))
        return _Table(base, rows)


class _Table:
    """A governor's prices for one set of conditions: d = 0 costs `base`; depth d (1 up
    to AUTO_DEPTH) costs fixed + (1 - a^d) * per_miss. `best(a, depths)` is the choice at
    acceptance a with `depths` drafts on offer."""

    def __init__(self, base: float, rows: list[tuple[int, float, float]]) -> None:
        self.base, self.rows = base, rows
        self.version = -1  # the cost model's version it was built at
        self.uses = 0
        self.bar = (1.0 / base) * (1 + MARGIN)  # d > 0 must beat this rate
        self.zero = Choice(0, 1.0, base)
        # no depth can pay where even the most tokens over the cheapest round fall short:
        # the cheapest round of depth <= n, for each n
        self.cheapest = [0.0] * (AUTO_DEPTH + 1)
        low = None
        for n in range(1, AUTO_DEPTH + 1):
            for d, t, _ in rows:
                if d == n:
                    low = t if low is None else min(low, t)
            self.cheapest[n] = low or 0.0

    def best(self, a: float, depths: int) -> Choice:
        zero = self.zero
        cheapest = self.cheapest[min(depths, AUTO_DEPTH)]
        if cheapest <= 0:
            return zero
        if geometric_tokens(a, depths) / cheapest <= self.bar:
            return zero
        best, best_rate = zero, self.bar
        for d, fixed, per_miss in self.rows:
            if d > depths:
                break
            t = fixed + (1 - a**d) * per_miss if per_miss else fixed
            tokens = geometric_tokens(a, d)
            if t > 0 and tokens / t > best_rate:
                best, best_rate = Choice(d, tokens, t), tokens / t
        return best

"""Offline replay of a routing trace against the expert-cache policies.

The simulated cache drives each policy through exactly the calls the engine's cache
makes (`hit`, `victim(pinned, incoming)`, `remove`, `insert`, `step` per token), so a
number here is the number the engine would get on that routing.

Two settings:
- global (the engine's): one cache of `capacity` slots shared by all layers;
- per-layer (`per_layer=True`): each layer has its own cache of `capacity` slots, the
  method behind the [computed] numbers in tests/fixtures/traces/TARGETS.md.

Hit rates count decode tokens (what the user waits for); prefill steps, when the trace
has them, warm the cache unless `decode_only`. `warmup` decode tokens warm it further
without being counted.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass

from ssdmoe_tui.engine.policy.policies import (
    BeladyPolicy,
    CooccurrencePredictor,
    EvictionPolicy,
    Key,
    NoVictimError,
    make_policy,
)
from ssdmoe_tui.engine.policy.traces import DECODE, Trace
from ssdmoe_tui.errors import BadValueError

BELADY = "belady"


@dataclass
class ReplayResult:
    policy: str
    capacity: int  # slots in one cache (per layer when per_layer)
    per_layer: bool
    experts_per_layer: float  # capacity spread over the layers
    hits: int  # counted lookups only
    lookups: int
    hits_all: int  # every replayed lookup, prefill and warm-up included
    lookups_all: int
    seconds: float
    # prefetch (co-occurrence, as the engine's --prefetch in trace-driven runs), counted
    # over the decode tokens: experts read ahead, of those looked up by the next layer
    # (a prefetched expert still counts as a miss: its bytes came from disk), and wasted
    prefetch_issued: int = 0
    prefetch_used: int = 0
    counted_steps: int = 0  # decode tokens the counted lookups come from

    @property
    def hit_rate(self) -> float:
        return self.hits / self.lookups if self.lookups else 0.0

    @property
    def prefetch_wasted(self) -> int:
        return self.prefetch_issued - self.prefetch_used

    @property
    def us_per_lookup(self) -> float:
        return 1e6 * self.seconds / self.lookups_all if self.lookups_all else 0.0

    def to_json(self) -> dict[str, object]:
        d = asdict(self)
        d["hit_rate"] = round(self.hit_rate, 6)
        d["prefetch_wasted"] = self.prefetch_wasted
        d["us_per_lookup"] = round(self.us_per_lookup, 3)
        return d


@dataclass
class _Lookups:
    """The trace flattened into the order the cache sees it."""

    # one entry per (step, layer): (keys of that layer's selection, counted?)
    cells: list[tuple[tuple[Key, ...], bool]]
    step_ends: list[int]  # index into cells after which policy.step() runs
    max_selection: int  # widest decode selection (a prefill union may be wider)
    decode: list[bool] | None = None  # per cell: a decode step's (prefetch runs there)
    counted_steps: int = 0  # decode steps counted (after the warm-up)

    def grouped(self, capacity: int) -> _Lookups:
        """Cells wider than the cache split into groups of `capacity` keys, in order: what
        the engine does with a prefill chunk whose union exceeds the cache."""
        if all(len(keys) <= capacity for keys, _ in self.cells):
            return self
        cells: list[tuple[tuple[Key, ...], bool]] = []
        decode: list[bool] = []
        ends: list[int] = []
        it = iter(self.step_ends)
        nxt = next(it, -1)
        for i, (keys, counted) in enumerate(self.cells):
            while nxt != -1 and nxt <= i:
                ends.append(len(cells))
                nxt = next(it, -1)
            for start in range(0, len(keys), capacity):
                cells.append((keys[start : start + capacity], counted))
                decode.append(bool(self.decode and self.decode[i]))
        while nxt != -1:
            ends.append(len(cells))
            nxt = next(it, -1)
        return _Lookups(cells, ends, self.max_selection, decode, self.counted_steps)


def _flatten(trace: Trace, decode_only: bool, warmup: int) -> _Lookups:
    cells: list[tuple[tuple[Key, ...], bool]] = []
    decode: list[bool] = []
    ends: list[int] = []
    decode_seen = 0
    widest = 0
    for step in trace.steps:
        if step.phase == DECODE:
            counted = decode_seen >= warmup
            decode_seen += 1
        else:
            if decode_only:
                continue
            counted = False
        for layer, experts in step.layers:
            keys = tuple(dict.fromkeys((layer, e) for e in experts))  # dedupe, keep order
            if keys:
                cells.append((keys, counted))
                decode.append(step.phase == DECODE)
                if step.phase == DECODE:
                    widest = max(widest, len(keys))
        ends.append(len(cells))
    return _Lookups(cells, ends, widest, decode, max(0, decode_seen - warmup))


def _run(
    policy: EvictionPolicy, capacity: int, cells, ends, prefetch: list[bool] | None = None
) -> tuple[int, ...]:
    """Drive one cache; returns (hits, lookups) counted and over everything, then the
    prefetch counts (issued, used) when `prefetch` (per cell: a decode step's) is given.

    Prefetch is the engine's (`ExpertCache.prefetch` after each decode layer): the
    co-occurrence predictor names as many next-layer ids as this layer selected; those
    not resident get slots now (the current layer's keys and the predicted ones pinned),
    and one the next layer looks up counts as a miss that was read early."""
    resident: set[Key] = set()
    hits = lookups = hits_all = lookups_all = 0
    predictor = (
        CooccurrencePredictor(1 + max((k[0][0] for k, _ in cells), default=0)) if prefetch else None
    )
    early: set[Key] = set()  # prefetched, not yet looked up
    issued = used = 0
    hit, insert, victim, remove = policy.hit, policy.insert, policy.victim, policy.remove
    end_iter = iter(ends)
    next_end = next(end_iter, -1)
    for i, (keys, counted) in enumerate(cells):
        while next_end != -1 and next_end <= i:  # steps that ended before this cell,
            policy.step()  # empty ones (no lookups) included: they still age the policy
            next_end = next(end_iter, -1)
            if predictor is not None:
                predictor.reset_token()
        pinned = keys
        h = 0
        for key in keys:
            if key in resident:
                if early and key in early:
                    early.discard(key)
                    if counted:
                        used += 1
                    h -= 1  # read from disk, only earlier
                h += 1
                hit(key)
            else:
                if len(resident) >= capacity:
                    v = victim(pinned, key)
                    remove(v)
                    resident.discard(v)
                    early.discard(v)
                insert(key)
                resident.add(key)
        hits_all += h
        lookups_all += len(keys)
        if counted:
            hits += h
            lookups += len(keys)
        if predictor is not None:
            layer = keys[0][0]
            ids = [e for _, e in keys]
            predictor.observe(layer, ids)
            if prefetch[i]:
                want = [(layer + 1, e) for e in predictor.predict(layer, ids, len(ids))]
                want = [k for k in want if k not in resident][: max(capacity - len(keys), 0)]
                n = _prefetch(policy, capacity, resident, early, set(keys) | set(want), want)
                issued += n if counted else 0
    return hits, lookups, hits_all, lookups_all, issued, used


def _prefetch(
    policy: EvictionPolicy,
    capacity: int,
    resident: set[Key],
    early: set[Key],
    guard: set[Key],
    want: list[Key],
) -> int:
    """Give `want` slots (evicting, never from `guard`, until the policy has no victim):
    they become resident and `early`. Returns how many were read."""
    read = 0
    for key in want:
        if len(resident) >= capacity:
            try:
                v = policy.victim(guard, key)
            except NoVictimError:
                break
            policy.remove(v)
            resident.discard(v)
            early.discard(v)
        policy.insert(key)
        resident.add(key)
        early.add(key)
        read += 1
    return read


def replay(
    trace: Trace,
    policy: str,
    capacity: int,
    *,
    per_layer: bool = False,
    decode_only: bool = False,
    warmup: int = 0,
    prefetch: bool = False,
) -> ReplayResult:
    """Replay `trace` through one policy at one capacity (slots; per layer if per_layer).

    `prefetch`: replay the engine's co-occurrence prefetch too (global cache only)."""
    if prefetch and per_layer:
        raise BadValueError("prefetch is replayed with one global cache, not --per-layer")
    flat = _flatten(trace, decode_only, warmup)
    num_layers = max(1, trace.meta.num_layers)
    if capacity < flat.max_selection:
        raise BadValueError(
            f"cache of {capacity} experts is below one layer's selection "
            f"({flat.max_selection}): the experts in use must all be resident"
        )
    flat = flat.grouped(capacity)
    t0 = time.perf_counter()
    issued = used = 0
    if per_layer:
        totals = [0, 0, 0, 0, 0, 0]
        for layer in sorted({keys[0][0] for keys, _ in flat.cells}):
            # that layer alone, as layer 0 of a one-layer model
            cells = [
                (tuple((0, e) for _, e in keys), counted)
                for keys, counted in flat.cells
                if keys[0][0] == layer
            ]
            # one cell per step for this layer: step() after each
            ends = list(range(1, len(cells) + 1))
            pol = _policy(policy, capacity, 1, cells)
            for j, v in enumerate(_run(pol, capacity, cells, ends)):
                totals[j] += v
        hits, lookups, hits_all, lookups_all, _, _ = totals
        spread = float(capacity)
    else:
        pol = _policy(policy, capacity, num_layers, flat.cells)
        hits, lookups, hits_all, lookups_all, issued, used = _run(
            pol, capacity, flat.cells, flat.step_ends, flat.decode if prefetch else None
        )
        spread = capacity / num_layers
    return ReplayResult(
        policy=policy,
        capacity=capacity,
        per_layer=per_layer,
        experts_per_layer=round(spread, 3),
        hits=hits,
        lookups=lookups,
        hits_all=hits_all,
        lookups_all=lookups_all,
        seconds=time.perf_counter() - t0,
        prefetch_issued=issued,
        prefetch_used=used,
        counted_steps=flat.counted_steps,
    )


def _policy(name: str, capacity: int, num_layers: int, cells) -> EvictionPolicy:
    if name == BELADY:
        return BeladyPolicy([k for keys, _ in cells for k in keys])
    return make_policy(name, capacity, num_layers)


def next_token_overlap(trace: Trace, decode_only: bool = True) -> float:
    """Mean |S_t ∩ S_t-1| / |S_t| over layers and consecutive decode tokens."""
    prev: dict[int, frozenset[int]] = {}
    total = 0.0
    n = 0
    for step in trace.steps:
        if decode_only and step.phase != DECODE:
            continue
        for layer, experts in step.layers:
            cur = frozenset(experts)
            if layer in prev and cur:
                total += len(cur & prev[layer]) / len(cur)
                n += 1
            prev[layer] = cur
    return total / n if n else 0.0

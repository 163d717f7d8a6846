"""Eviction policies for the global expert cache, keyed by `(layer, expert)`.

The cache owns residency; a policy only orders the resident keys. Call pattern for one
layer of one token, with `pinned` = every expert the router selected for that layer:

    for key in selected:
        if key resident:  policy.hit(key)
        else:
            if cache full:
                v = policy.victim(pinned, incoming=key); policy.remove(v)
            policy.insert(key)
    ...
    policy.step()   # once per token, after the last layer

Every operation is O(1) or amortised O(log n), plus skipping pinned keys (once per set
of pins where `pinned` is a frozenset, as the cache passes it: the LFU heaps set pinned
entries aside until other pins come); the one exception is layer-lru borrowing a slot
(a layer under quota), which walks back over the layers. The LFU partitions choose across layers with a segment tree, O(log layers). Why
the default is what it is, with measured hit rates and costs: docs/cache-policy.md.
"""

from __future__ import annotations

import heapq
import math
from collections import OrderedDict
from collections.abc import Collection, Sequence
from typing import Protocol

from ssdmoe_tui.errors import BadValueError

Key = tuple[int, int]  # (layer, expert)


def _check_num_layers(num_layers: int) -> int:
    """`num_layers` of a per-layer policy, refused below 1 (a bad value, not a crash later)."""
    if num_layers < 1:
        raise BadValueError(f"num_layers must be >= 1, got {num_layers}")
    return num_layers


def _layer_outside(layer: int, num_layers: int) -> BadValueError:
    """The error for a key whose layer a per-layer policy was not sized for."""
    return BadValueError(
        f"cache key layer {layer} is outside 0..{num_layers - 1}: "
        "num_layers must exceed every layer index used in keys"
    )


class NoVictimError(RuntimeError):
    """Every resident key is pinned: the cache is smaller than one layer's selection."""


class EvictionPolicy(Protocol):
    name: str

    def hit(self, key: Key) -> None: ...
    def insert(self, key: Key) -> None: ...
    def victim(self, pinned: Collection[Key], incoming: Key | None = None) -> Key: ...
    def remove(self, key: Key) -> None: ...
    def step(self) -> None: ...


def _no_victim(pinned: Collection[Key]) -> NoVictimError:
    return NoVictimError(
        f"expert cache too small: all resident experts are in use ({len(pinned)} pinned)"
    )


# --------------------------------------------------------------------------- LRU


class LRUPolicy:
    """Least recently used. Under one token cycle it floods (0 % hits): see docs."""

    name = "lru"

    def __init__(self) -> None:
        self._order: OrderedDict[Key, None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._order)

    def __contains__(self, key: object) -> bool:
        return key in self._order

    def hit(self, key: Key) -> None:
        self._order.move_to_end(key)

    def insert(self, key: Key) -> None:
        self._order[key] = None
        self._order.move_to_end(key)

    def pick(self, pinned: Collection[Key]) -> Key | None:
        for key in self._order:  # oldest first; skips at most len(pinned) keys
            if key not in pinned:
                return key
        return None

    def victim(self, pinned: Collection[Key], incoming: Key | None = None) -> Key:
        key = self.pick(pinned)
        if key is None:
            raise _no_victim(pinned)
        return key

    def remove(self, key: Key) -> None:
        self._order.pop(key, None)

    def step(self) -> None:
        pass

    def recent_first(self, keys: Collection[Key]) -> list[Key]:
        wanted = set(keys)
        return [k for k in reversed(self._order) if k in wanted]


# --------------------------------------------------------------------------- LFU with decay


class _DecayClock:
    """growth ** tokens, shared by the parts of a partition so their scores compare."""

    def __init__(self, decay: float) -> None:
        if not 0.0 < decay <= 1.0:
            raise BadValueError(f"lfu decay must be in (0, 1], got {decay}")
        self.decay = decay
        self.growth = 1.0 / decay
        self.weight = 1.0

    def tick(self) -> bool:
        """Advance one token; True when scores must be rescaled (divided by weight)."""
        self.weight *= self.growth
        return self.weight > 1e150


class LFUDecayPolicy:
    """Evict the lowest exponentially decayed use count; ties go to the least recent.

    score(key) = sum over its uses of decay ** (tokens since that use). Instead of
    decaying every score each token, a use adds growth ** token (growth = 1 / decay),
    which orders keys identically; scores are rescaled when they get large. Counts
    survive eviction (bounded by layers x experts), so a popular expert that was pushed
    out comes back with its history. decay = 1 is plain LFU.
    """

    name = "lfu-decay"

    def __init__(self, decay: float = 0.9, clock: _DecayClock | None = None) -> None:
        self._own_clock = clock is None
        self._clock = clock or _DecayClock(decay)
        self._score: dict[Key, float] = {}  # every key seen, resident or not
        self._seq: dict[Key, int] = {}  # resident key -> last-use counter (heap validity)
        self._heap: list[tuple[float, int, Key]] = []
        self._count = 0
        # Entries found pinned under `_aside_for` (a frozenset: it cannot change), set
        # aside instead of pushed back: the next search under the same pins skips them.
        # A prefill chunk assigns a whole layer's slots under one pin set, its own new
        # keys (the coldest) pinned: pushed back each time, every victim re-scanned them
        # (129 us a victim, 16 ms a layer at 128 experts; profiled on the H100's warm 4k
        # prefill shape). Back in the heap at the first search under other pins.
        self._aside: list[tuple[float, int, Key]] = []
        self._aside_for: frozenset | None = None

    def __len__(self) -> int:
        return len(self._seq)

    def __contains__(self, key: object) -> bool:
        return key in self._seq

    def _touch(self, key: Key) -> None:
        score = self._score.get(key, 0.0) + self._clock.weight
        self._score[key] = score
        self._count += 1
        self._seq[key] = self._count
        heapq.heappush(self._heap, (score, self._count, key))
        if len(self._heap) > 4 * len(self._seq) + 64:
            self._rebuild()

    hit = _touch
    insert = _touch

    def _rebuild(self) -> None:
        score, seq = self._score, self._seq
        self._aside, self._aside_for = [], None  # every resident key is in the new heap
        self._heap = [(score[k], s, k) for k, s in seq.items()]
        heapq.heapify(self._heap)

    def coldest(self, pinned: Collection[Key]) -> tuple[float, Key] | None:
        """(score, key) of the key `victim` would pick; None if every key is pinned."""
        heap, seq = self._heap, self._seq
        if pinned is not self._aside_for:
            for entry in self._aside:  # pinned under other pins: searchable again
                heapq.heappush(heap, entry)
            self._aside = []
            self._aside_for = pinned if type(pinned) is frozenset and pinned else None
        while heap:  # fast path: drop stale entries, return the top if it is free
            score, count, key = heap[0]
            if seq.get(key) != count:
                heapq.heappop(heap)  # stale: key touched again or removed
            elif key in pinned:
                break
            else:
                return score, key
        # pinned entries: set aside under a frozen pin set, else pushed back at the end
        keep = self._aside_for is not None
        held = self._aside if keep else []
        try:
            while heap:
                entry = heap[0]
                if seq.get(entry[2]) != entry[1]:
                    heapq.heappop(heap)
                elif entry[2] in pinned:
                    held.append(heapq.heappop(heap))
                else:
                    return entry[0], entry[2]
            return None
        finally:
            if not keep:
                for entry in held:
                    heapq.heappush(heap, entry)

    def pick(self, pinned: Collection[Key]) -> Key | None:
        found = self.coldest(pinned)
        return found[1] if found is not None else None

    def victim(self, pinned: Collection[Key], incoming: Key | None = None) -> Key:
        found = self.coldest(pinned)
        if found is None:
            raise _no_victim(pinned)
        return found[1]

    def remove(self, key: Key) -> None:
        self._seq.pop(key, None)  # its heap entry goes stale; its score is kept

    def recent_first(self, keys: Collection[Key]) -> list[Key]:
        seq = self._seq
        return sorted((k for k in keys if k in seq), key=lambda k: -seq[k])

    def step(self) -> None:
        if self._own_clock and self._clock.decay < 1.0 and self._clock.tick():
            self.rescale(self._clock.weight)
            self._clock.weight = 1.0

    def rescale(self, w: float) -> None:
        # Keys whose decayed count is negligible are forgotten, bounding the history.
        self._score = {k: s / w for k, s in self._score.items() if s / w > 1e-9 or k in self._seq}
        self._rebuild()


# --------------------------------------------------------------------------- ARC


class ARCPolicy:
    """Adaptive Replacement Cache (Megiddo & Modha 2003) over a fixed slot count.

    T1 holds keys seen once recently, T2 keys seen at least twice; B1/B2 are ghost lists
    of keys evicted from them, whose hits move the target size p of T1.
    """

    name = "arc"

    def __init__(self, capacity: int) -> None:
        self._c = max(1, capacity)
        self._p = 0.0
        self._t1: OrderedDict[Key, None] = OrderedDict()
        self._t2: OrderedDict[Key, None] = OrderedDict()
        self._b1: OrderedDict[Key, None] = OrderedDict()
        self._b2: OrderedDict[Key, None] = OrderedDict()
        self._adapted: Key | None = None

    def __len__(self) -> int:
        return len(self._t1) + len(self._t2)

    def hit(self, key: Key) -> None:
        if key in self._t1:
            del self._t1[key]
            self._t2[key] = None
        else:
            self._t2.move_to_end(key)

    def _adapt(self, key: Key) -> None:
        if self._adapted == key:
            return
        self._adapted = key
        b1, b2 = len(self._b1), len(self._b2)
        if key in self._b1:
            self._p = min(float(self._c), self._p + max(b2 / b1, 1.0))
        elif key in self._b2:
            self._p = max(0.0, self._p - max(b1 / b2, 1.0))

    def insert(self, key: Key) -> None:
        self._adapt(key)
        self._adapted = None
        if key in self._b1 or key in self._b2:
            self._b1.pop(key, None)
            self._b2.pop(key, None)
            self._t2[key] = None
        else:
            self._t1[key] = None
        # Directory bounds: |T1| + |B1| <= c, total <= 2c.
        while self._b1 and len(self._t1) + len(self._b1) > self._c:
            self._b1.popitem(last=False)
        while self._b2 and len(self) + len(self._b1) + len(self._b2) > 2 * self._c:
            self._b2.popitem(last=False)

    def victim(self, pinned: Collection[Key], incoming: Key | None = None) -> Key:
        if incoming is not None:
            self._adapt(incoming)
        t1_first = len(self._t1) > self._p or (
            incoming is not None and incoming in self._b2 and len(self._t1) >= self._p
        )
        lists = (self._t1, self._t2) if t1_first else (self._t2, self._t1)
        for lst in lists:
            for key in lst:
                if key not in pinned:
                    return key
        raise _no_victim(pinned)

    def remove(self, key: Key) -> None:
        if key in self._t1:
            del self._t1[key]
            self._b1[key] = None
        elif key in self._t2:
            del self._t2[key]
            self._b2[key] = None

    def step(self) -> None:
        pass

    def recent_first(self, keys: Collection[Key]) -> list[Key]:
        """Seen twice or more (T2), then once (T1), each most recent first: ARC keeps no
        order across its two lists."""
        wanted = set(keys)
        return [k for lst in (self._t2, self._t1) for k in reversed(lst) if k in wanted]


# --------------------------------------------------------------------------- per-layer partition


class _MinTree:
    """Segment tree over layers: point update, min over a layer range, O(log n)."""

    def __init__(self, n: int) -> None:
        self._size = 1 << max(0, n - 1).bit_length()
        self._t: list[tuple[float, int]] = [(math.inf, 0)] * (2 * self._size)

    def set(self, i: int, value: tuple[float, int]) -> None:
        t = self._t
        i += self._size
        if t[i] == value:
            return
        t[i] = value
        i >>= 1
        while i:
            a, b = t[2 * i], t[2 * i + 1]
            m = a if a <= b else b
            if t[i] == m:
                return  # nothing above changes
            t[i] = m
            i >>= 1

    def min(self, lo: int, hi: int) -> tuple[float, int]:
        """Min over [lo, hi)."""
        t = self._t
        best = (math.inf, 0)
        lo += self._size
        hi += self._size
        while lo < hi:
            if lo & 1:
                best = min(best, t[lo])
                lo += 1
            if hi & 1:
                hi -= 1
                best = min(best, t[hi])
            lo >>= 1
            hi >>= 1
        return best


class LayerPartitioned:
    """Per-layer sub-policies (LRU, or LFU-decay on one shared clock) under one budget.

    Global recency floods when the budget is under one token cycle: the keys about to be
    used are always the oldest. Two ways out, both here:

    - Strict partition (`floor` = quota = capacity // num_layers, `own_bias` 0; the
      "layer-lru" and "layer-lfu" policies): a layer at or over its quota evicts its own
      coldest key. While the cache is not full a layer may spill over its quota; once
      full, a layer under quota, or one whose own keys are all pinned (quota < K), takes a
      slot from a layer over quota, else from any layer. LRU parts give it up from the
      nearest layer before this one (layers run in order: its next use is the furthest);
      LFU parts from the coldest layer, as below.
    - Cycle-aware competition (`floor` 0, `own_bias` 0.5; "cycle-lfu"): every eviction
      takes the lowest decayed-frequency key of the whole cache, but scores are compared
      as of each layer's next visit: a layer already served this token counts one decay
      step colder (its next use is a token later; ties go to the furthest next visit),
      and the layer being served counts its own keys `own_bias` times their score (it
      knows its own working set best). Layers no longer starve one another at any budget,
      and big-working-set layers can still take more than an equal share.

    A segment tree over the layers' coldest scores keeps the cross-layer choice
    O(log layers). The layer of the incoming key comes from `incoming`, else `pinned`.
    """

    def __init__(
        self,
        name: str,
        capacity: int,
        num_layers: int,
        decay: float | None,
        *,
        strict: bool = True,
        own_bias: float = 0.0,
    ) -> None:
        self.name = name
        self._n = _check_num_layers(num_layers)
        self._floor = max(0, capacity) // num_layers if strict else 0
        self._own_bias = own_bias
        self._clock = _DecayClock(decay) if decay is not None else None
        self._parts: dict[int, LRUPolicy | LFUDecayPolicy] = {}
        self._count: dict[int, int] = {}
        # LFU parts: tree of (coldest score, -layer) over layers above the floor; leaves
        # of layers changed since the last eviction are refreshed lazily.
        self._tree = _MinTree(num_layers)
        self._dirty: set[int] = set()

    def _part(self, layer: int) -> LRUPolicy | LFUDecayPolicy:
        part = self._parts.get(layer)
        if part is None:
            if not 0 <= layer < self._n:
                raise _layer_outside(layer, self._n)
            clock = self._clock
            part = LRUPolicy() if clock is None else LFUDecayPolicy(clock=clock)
            self._parts[layer] = part
            self._count[layer] = 0
        return part

    def hit(self, key: Key) -> None:
        self._parts[key[0]].hit(key)
        self._dirty.add(key[0])

    def insert(self, key: Key) -> None:
        self._part(key[0]).insert(key)
        self._count[key[0]] += 1
        self._dirty.add(key[0])

    def remove(self, key: Key) -> None:
        part = self._parts.get(key[0])
        if part is not None and key in part:
            part.remove(key)
            self._count[key[0]] -= 1
            self._dirty.add(key[0])

    def step(self) -> None:
        clock = self._clock
        if clock is not None and clock.decay < 1.0 and clock.tick():
            for part in self._parts.values():
                part.rescale(clock.weight)  # type: ignore[union-attr]
            clock.weight = 1.0
            self._dirty.update(self._parts)

    def recent_first(self, keys: Collection[Key]) -> list[Key]:
        """Most recent first within each layer (the parts keep no order across layers)."""
        by_layer: dict[int, list[Key]] = {}
        for k in keys:
            by_layer.setdefault(k[0], []).append(k)
        return [
            k
            for layer, ks in sorted(by_layer.items())
            for k in (self._parts[layer].recent_first(ks) if layer in self._parts else ks)
        ]

    def victim(self, pinned: Collection[Key], incoming: Key | None = None) -> Key:
        layer = incoming[0] if incoming is not None else None
        if layer is None and pinned:
            layer = next(iter(pinned))[0]
        own = self._parts.get(layer) if layer is not None else None
        if own is not None and self._count[layer] < self._floor:  # type: ignore[index]
            own = None  # under its floor: take a slot from another layer
        if self._clock is None:  # LRU parts: own first, then the nearest layer before
            key = own.pick(pinned) if own is not None else None
        else:
            key = self._coldest(pinned, own, layer if layer is not None else -1)
        if key is not None:
            return key
        here = layer if layer is not None else -1
        for limit in (self._floor, 0):  # layers above the floor first, then any layer
            key = self._borrow_nearest(pinned, here, limit)
            if key is not None:
                return key
        raise _no_victim(pinned)

    def _borrow_nearest(self, pinned: Collection[Key], here: int, limit: int) -> Key | None:
        n, count = self._n, self._count
        for d in range(1, n + 1):  # walk back from the layer being served
            m = (here - d) % n
            if m != here and count.get(m, 0) > limit:
                key = self._parts[m].pick(pinned)
                if key is not None:
                    return key
        return None

    def _coldest(self, pinned: Collection[Key], own: object, here: int) -> Key | None:
        """The key to evict by score: the own layer's (scaled by own_bias) or the coldest
        other layer above the floor, compared as of each layer's next visit."""
        if own is not None and not self._own_bias:  # strict: own layer first, always
            key = own.pick(pinned)  # type: ignore[attr-defined]
            if key is not None:
                return key
            own = None
        tree, parts, floor, dirty = self._tree, self._parts, self._floor, self._dirty
        for m in dirty:
            if m != here:  # the layer being served is scored apart; it stays dirty
                found = parts[m].coldest(()) if self._count[m] > floor else None  # type: ignore[union-attr]
                tree.set(m, (found[0] if found else math.inf, -m))
        dirty.clear()
        if here in parts:
            dirty.add(here)
        decay = self._clock.decay  # type: ignore[union-attr]
        lo = max(here, 0)
        served = tree.min(0, lo)  # [0, here): next use a token later, one decay colder
        later = tree.min(lo + 1 if here >= 0 else 0, self._n)
        pick = served if served[0] * decay <= later[0] else later
        best = served[0] * decay if pick is served else later[0]
        found = own.coldest(pinned) if own is not None else None  # type: ignore[attr-defined]
        if found is not None and found[0] * self._own_bias <= best:
            return found[1]
        if best == math.inf:
            return None
        return parts[-pick[1]].pick(pinned)  # differs from the tree's key only if pinned


# --------------------------------------------------------------------------- next-token reuse


class ReusePolicy:
    """Evict the key least likely to be used at its layer's next visit, as learned online.

    Each layer learns which experts follow which from one token to the next (a count per
    pair e at token t, e' at token t+1, same layer: about a third of a layer's experts
    recur on the next token, and the rest follow its ids more than chance). A key's score
    is the Bayesian estimate of its use at its layer's next visit given the layer's latest
    selection: mean over that selection's ids e of (n(e -> key) + a * rate) / (n(e) + a),
    where rate is the key's own exponentially decayed use rate (decay 0.95 per token),
    the prior that dominates while a row has few counts. The latest selection is this
    token's for the layers already served and for the layer being served (the pinned
    ids), the previous token's for the layers still to come. As in cycle-lfu, layers
    already served count `served` colder (their next visit is a token later), the layer
    being served counts its own keys `own_bias` times (it knows its working set best),
    and ties go to the layer whose next visit is furthest.

    Cost: a victim is one numpy argmin over layers x experts, plus a row update (ids x
    experts) for each layer whose selection changed since the last victim; counts take
    layers x experts^2 float32 at most (rows are allocated when an id is first seen).
    Measured (docs/cache-policy.md): +0.4 to +2.6 points over cycle-lfu at 1-4 top-k
    sets per layer on the three real traces, -0.5 at worst.
    """

    def __init__(
        self,
        name: str,
        num_layers: int,
        decay: float = 0.95,
        prior: float = 4.0,
        served: float = 0.9,
        own_bias: float = 0.5,
    ) -> None:
        import numpy as np

        self._np = np
        self.name = name
        self._n = _check_num_layers(num_layers)
        self._clock = _DecayClock(decay)
        self._prior = prior
        self._served = served
        self._own = own_bias
        self._e = 64  # expert-id capacity of the arrays; doubles as ids appear
        self._m = np.zeros((num_layers, self._e))  # decayed uses, in clock weights
        self._resident = np.zeros((num_layers, self._e), bool)
        self._score = np.full((num_layers, self._e), np.inf)  # resident keys' scores
        self._rows: dict[Key, np.ndarray] = {}  # (layer, e) -> counts of e' next token
        self._prev: dict[int, tuple[int, ...]] = {}  # layer -> ids at its previous visit
        self._cur: dict[int, list[int]] = {}  # layer -> ids this token, in lookup order
        self._dirty: set[int] = set(range(num_layers))
        self._steps = 0

    def __len__(self) -> int:
        return int(self._resident.sum())

    def __contains__(self, key: object) -> bool:
        if not isinstance(key, tuple) or len(key) != 2:
            return False
        layer, e = key
        return 0 <= layer < self._n and 0 <= e < self._e and bool(self._resident[layer, e])

    def _grow(self, e: int) -> None:
        np = self._np
        if e < 0:
            raise BadValueError(f"cache key expert {e} is negative")
        size = self._e
        while size <= e:
            size *= 2
        pad = ((0, 0), (0, size - self._e))
        self._m = np.pad(self._m, pad)
        self._resident = np.pad(self._resident, pad)
        self._score = np.pad(self._score, pad, constant_values=np.inf)
        self._e = size

    def _use(self, key: Key) -> None:
        layer, e = key
        if not 0 <= layer < self._n:
            raise _layer_outside(layer, self._n)
        if e >= self._e:
            self._grow(e)
        ids = self._cur.setdefault(layer, [])
        if e in ids:
            return
        ids.append(e)
        self._m[layer, e] += self._clock.weight
        for p in self._prev.get(layer, ()):
            row = self._rows.get((layer, p))
            if row is None:
                row = self._rows[(layer, p)] = self._np.zeros(self._e, self._np.float32)
            elif len(row) < self._e:
                row = self._rows[(layer, p)] = self._np.pad(row, (0, self._e - len(row)))
            row[e] += 1.0
        self._dirty.add(layer)

    def hit(self, key: Key) -> None:
        self._use(key)

    def insert(self, key: Key) -> None:
        self._use(key)
        self._resident[key] = True
        self._dirty.add(key[0])

    def remove(self, key: Key) -> None:
        layer, e = key
        if 0 <= layer < self._n and 0 <= e < self._e and self._resident[layer, e]:
            self._resident[layer, e] = False
            self._score[layer, e] = self._np.inf

    def step(self) -> None:
        for layer, ids in self._cur.items():
            if len(ids) <= 32:  # a prefill union is not a next-token selection
                self._prev[layer] = tuple(ids)
            else:
                self._prev.pop(layer, None)
        self._cur = {}
        self._steps += 1
        if self._clock.tick():
            self._m /= self._clock.weight
            self._clock.weight = 1.0
        self._dirty = set(range(self._n))

    def _refresh(self, layer: int, ids: Sequence[int]) -> None:
        np = self._np
        decay = self._clock.decay
        steps = max(self._steps, 1)  # decayed number of tokens seen, for a per-token rate
        tokens = (1.0 - decay**steps) / (1.0 - decay) if decay < 1 else float(steps)
        rate = self._m[layer] / (self._clock.weight * tokens)
        res = self._resident[layer]
        if ids:
            rows = [self._rows.get((layer, i)) for i in ids]
            prob = np.zeros(self._e)
            for row in rows:
                if row is not None:
                    c = np.zeros(self._e)
                    c[: len(row)] = row
                    prob += (c + self._prior * rate) / (c.sum() + self._prior)
                else:
                    prob += rate
            prob /= len(ids)
        else:
            prob = rate
        self._score[layer] = np.where(res, prob, np.inf)

    def victim(self, pinned: Collection[Key], incoming: Key | None = None) -> Key:
        np = self._np
        here = incoming[0] if incoming is not None else next(iter(pinned))[0] if pinned else -1
        for layer in self._dirty:
            if layer == here:
                continue
            ids = self._cur.get(layer) if layer in self._cur else self._prev.get(layer, ())
            self._refresh(layer, ids or ())
        self._dirty = set()
        if 0 <= here < self._n:
            own = sorted({e for m, e in pinned if m == here} | set(self._cur.get(here, ())))
            self._refresh(here, own)
            self._dirty.add(here)
        score = self._score.copy()
        if here > 0:
            score[:here] *= self._served
        if 0 <= here < self._n:
            score[here] *= self._own
        for m, e in pinned:
            if 0 <= m < self._n and 0 <= e < self._e:
                score[m, e] = np.inf
        # ties: the furthest next visit (layers just served first, then the last ones)
        best = score.min()
        if best == np.inf:
            raise _no_victim(pinned)
        layers, experts = np.nonzero(score == best)
        far = (layers - here) % self._n if here >= 0 else layers
        j = int(np.argmax(far))  # equal scores are rare; the furthest next visit wins
        return (int(layers[j]), int(experts[j]))


# --------------------------------------------------------------------------- Belady


class BeladyPolicy:
    """Offline optimum (evict the key whose next use is furthest): a reference only.

    Needs the whole future lookup sequence, in the exact order the cache will call
    `hit`/`insert`; each of those calls advances one position.
    """

    name = "belady"

    def __init__(self, future: Sequence[Key]) -> None:
        nxt = [math.inf] * len(future)
        last: dict[Key, int] = {}
        for i in range(len(future) - 1, -1, -1):
            k = future[i]
            nxt[i] = last.get(k, math.inf)
            last[k] = i
        self._future = future
        self._next = nxt
        self._pos = 0
        self._due: dict[Key, float] = {}  # resident key -> next use position
        self._heap: list[tuple[float, Key]] = []  # (-next use, key), lazy

    def _touch(self, key: Key) -> None:
        pos = self._pos
        if pos >= len(self._future) or self._future[pos] != key:
            raise RuntimeError(f"belady: lookup {pos} is {key}, not the recorded future")
        due = self._next[pos]
        self._pos = pos + 1
        self._due[key] = due
        heapq.heappush(self._heap, (-due, key))

    hit = _touch
    insert = _touch

    def victim(self, pinned: Collection[Key], incoming: Key | None = None) -> Key:
        heap, due = self._heap, self._due
        held: list[tuple[float, Key]] = []
        try:
            while heap:
                neg, key = heap[0]
                if due.get(key) != -neg:
                    heapq.heappop(heap)
                elif key in pinned:
                    held.append(heapq.heappop(heap))
                else:
                    return key
            raise _no_victim(pinned)
        finally:
            for entry in held:
                heapq.heappush(heap, entry)

    def remove(self, key: Key) -> None:
        self._due.pop(key, None)

    def step(self) -> None:
        pass


# --------------------------------------------------------------------------- prediction


class CooccurrencePredictor:
    """Online next-layer predictor: which experts layer L+1 selects, given layer L's ids.

    Learns from the lookups it is shown (no weights): for every token, each pair
    (e in S_L, e' in S_L+1) adds one count; the prediction for L+1 is the ids with the
    highest summed (row-normalised) counts over S_L, plus `reuse_weight` for layer
    L+1's last selection (temporal reuse; 0 by default: adding it lowered top-K precision
    from 0.56 to 0.39 on the Qwen3-30B trace, docs/cache-policy.md). Selections wider than
    `max_learn` (prefill unions) are not learned from.
    """

    def __init__(self, num_layers: int, max_learn: int = 32, reuse_weight: float = 0.0) -> None:
        self._n = num_layers
        self._max_learn = max_learn
        self._reuse = reuse_weight
        self._counts: dict[int, dict[int, dict[int, float]]] = {}  # layer -> e -> e' -> n
        self._last: dict[int, tuple[int, ...]] = {}  # layer -> its last selection
        self._prev: tuple[int, tuple[int, ...]] | None = None  # (layer, ids) this token

    def observe(self, layer: int, ids: Sequence[int]) -> None:
        """Layer `layer` selected `ids` (call in forward order; `reset_token` between tokens)."""
        ids = tuple(ids)
        if len(ids) > self._max_learn:
            self._prev = None
            return
        prev = self._prev
        if prev is not None and prev[0] == layer - 1:
            table = self._counts.setdefault(prev[0], {})
            for e in prev[1]:
                row = table.setdefault(e, {})
                for f in ids:
                    row[f] = row.get(f, 0.0) + 1.0
        self._last[layer] = ids
        self._prev = (layer, ids)

    def reset_token(self) -> None:
        self._prev = None

    def predict(self, layer: int, ids: Sequence[int], m: int) -> list[int]:
        """Up to `m` ids layer `layer + 1` is likely to select, best first."""
        nxt = layer + 1
        if nxt >= self._n or m < 1:
            return []
        score: dict[int, float] = {}
        table = self._counts.get(layer, {})
        for e in ids:
            row = table.get(e)
            if row:
                total = sum(row.values())
                for f, c in row.items():
                    score[f] = score.get(f, 0.0) + c / total
        for f in self._last.get(nxt, ()):
            score[f] = score.get(f, 0.0) + self._reuse
        return [f for f, _ in sorted(score.items(), key=lambda kv: -kv[1])[:m]]


class PredictivePolicy:
    """An eviction policy that protects what is predicted to be used soon.

    Wraps a base policy (default cycle-lfu). It watches the lookups (layer by layer, in
    forward order) to learn a `CooccurrencePredictor`; when a victim is needed while
    layer L is served, the experts predicted for layer L+1 (its very next use: one layer
    later) are protected as if pinned, so the base policy's victim is, of the keys not
    needed right away, its usual choice: an approximation of Belady's "evict the key
    used furthest in the future" with a predicted reuse distance of one layer for the
    protected keys. If only protected keys are left, the base policy's choice stands.
    """

    def __init__(
        self, name: str, base: EvictionPolicy, num_layers: int, protect: int, reuse: float = 1.0
    ) -> None:
        self.name = name
        self._base = base
        self._protect = protect
        self.predictor = CooccurrencePredictor(num_layers, reuse_weight=reuse)
        self._layer: int | None = None
        self._ids: list[int] = []
        # (hash of the pins' layer and ids, the prediction, the frozen pins it was for)
        self._pred_for: tuple[int, frozenset[Key], frozenset | None] | None = None
        # (pins, guard, both): the union kept while the same frozen pins and guard come,
        # so the base's heaps can set pinned entries aside (LFUDecayPolicy.coldest)
        self._both: tuple[Collection[Key], frozenset, frozenset] | None = None

    def _see(self, key: Key) -> None:
        if key[0] != self._layer:
            self._flush()
            self._layer = key[0]
        self._ids.append(key[1])

    def _flush(self) -> None:
        if self._layer is not None and self._ids:
            self.predictor.observe(self._layer, self._ids)
        self._ids = []

    def hit(self, key: Key) -> None:
        self._see(key)
        self._base.hit(key)

    def insert(self, key: Key) -> None:
        self._see(key)
        self._base.insert(key)

    def remove(self, key: Key) -> None:
        self._base.remove(key)

    def recent_first(self, keys: Collection[Key]) -> list[Key]:
        return recent_first(self._base, keys)

    def step(self) -> None:
        self._flush()
        self._layer = None
        self.predictor.reset_token()
        self._base.step()

    def protected(self, pinned: Collection[Key]) -> frozenset[Key]:
        """Keys of the next layer predicted from the selection being served."""
        if not pinned:
            return frozenset()
        kept = self._pred_for
        if kept is not None and kept[2] is pinned:  # the same frozen pins: no sort again
            return kept[1]
        layer = next(iter(pinned))[0]
        ids = tuple(sorted(e for _, e in pinned))
        key = hash((layer, ids))
        if kept is None or kept[0] != key:
            pred = self.predictor.predict(layer, ids, self._protect)
            guard = frozenset((layer + 1, e) for e in pred)
        else:
            guard = kept[1]
        self._pred_for = (key, guard, pinned if type(pinned) is frozenset else None)
        return guard

    def victim(self, pinned: Collection[Key], incoming: Key | None = None) -> Key:
        guard = self.protected(pinned)
        if guard:
            both = self._both
            if both is None or both[0] is not pinned or both[1] is not guard:
                both = (pinned, guard, frozenset(pinned) | guard)
                if type(pinned) is frozenset:  # pins that may change: no union kept
                    self._both = both
            try:
                return self._base.victim(both[2], incoming)
            except NoVictimError:
                pass
        return self._base.victim(pinned, incoming)


# --------------------------------------------------------------------------- recency


def recent_first(policy: EvictionPolicy, keys: Sequence[Key]) -> list[Key]:
    """`keys` (resident), most recently used first as far as `policy` knows; a policy
    that keeps no recency (reuse, belady) leaves them in the order given. Off the hot
    path: the cache calls it between turns (warm resume, `ExpertCache.working_set`).
    Keys the policy does not hold keep their place after those it orders."""
    order = getattr(policy, "recent_first", None)
    if order is None:
        return list(keys)
    ranked = order(keys)
    seen = set(ranked)
    return ranked + [k for k in keys if k not in seen]


# --------------------------------------------------------------------------- factory

POLICY_NAMES = (
    "lru",
    "lfu",
    "lfu-decay",
    "arc",
    "layer-lru",
    "layer-lfu",
    "cycle-lfu",
    "reuse",
    "predict",
)
DEFAULT_POLICY = "cycle-lfu"
LFU_DECAY = 0.9  # per token; see docs/cache-policy.md for the sweep
REUSE_DECAY = 0.95  # the reuse policy's rate decay, fitted on the Qwen3-30B trace only
PREDICT_PROTECT = 12  # next-layer experts a predictive policy protects (predict:N sets N)


def make_policy(name: str, capacity: int, num_layers: int) -> EvictionPolicy:
    """A fresh policy for a cache of `capacity` slots over `num_layers` layers.

    Key layers must be in 0..num_layers-1 (pass the model's layer count when MoE layers
    are numbered by model layer).

    `name` may carry a decay for the LFU family: "lfu-decay:0.8", "layer-lfu:0.95".
    """
    base, _, arg = name.partition(":")
    decay = LFU_DECAY
    if arg and not base.startswith("predict"):
        try:
            decay = float(arg)
        except ValueError:
            raise BadValueError(f"bad policy parameter in {name!r}: expected a decay") from None
        if base not in ("lfu-decay", "layer-lfu", "cycle-lfu", "reuse"):
            raise BadValueError(f"policy {base!r} takes no parameter (got {name!r})")
    if base == "lru":
        return LRUPolicy()
    if base == "lfu":
        return _named(LFUDecayPolicy(1.0), "lfu")
    if base == "lfu-decay":
        return _named(LFUDecayPolicy(decay), name)
    if base == "arc":
        return ARCPolicy(capacity)
    if base == "layer-lru":
        return LayerPartitioned(name, capacity, num_layers, None)
    if base == "layer-lfu":
        return LayerPartitioned(name, capacity, num_layers, decay)
    if base == "cycle-lfu":
        return LayerPartitioned(name, capacity, num_layers, decay, strict=False, own_bias=0.5)
    if base == "reuse":
        return ReusePolicy(name, num_layers, decay if arg else REUSE_DECAY)
    if base.startswith("predict"):  # predict (cycle-lfu base), predict-lru, predict-layer-lfu
        inner = base.removeprefix("predict").removeprefix("-") or "cycle-lfu"
        if inner.startswith("predict") or inner not in POLICY_NAMES:
            raise BadValueError(f"unknown cache policy {name!r} (predict-<policy>)")
        if arg and not arg.isdigit():
            raise BadValueError(f"bad policy parameter in {name!r}: expected a count")
        protect = int(arg) if arg else PREDICT_PROTECT
        return PredictivePolicy(name, make_policy(inner, capacity, num_layers), num_layers, protect)
    known = ", ".join(POLICY_NAMES)
    raise BadValueError(f"unknown cache policy {name!r} (known: {known})")


def parse_policy(text: str) -> str:
    """An expert-cache eviction policy name (`auto`: the engine's default), checked by
    building it once on a toy cache, so a typo fails before any model loads."""
    name = str(text).strip()
    if name != "auto":
        make_policy(name, 8, 2)  # BadValueError naming the policy and the known ones
    return name


def _named(policy: LFUDecayPolicy, name: str) -> LFUDecayPolicy:
    policy.name = name
    return policy

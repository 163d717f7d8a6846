"""Warm resume: read a saved working set of experts back into the cache while the
engine is idle, so the first reply after a restart starts from a warm cache.

The engine takes ids only: `(layer, [expert ids, most recent first])` per layer, as
`ExpertCache.working_set` reports them (the sessions side saves them with a
conversation's KV checkpoint and hands them back on resume).

How it stays out of the way of tokens:

- `start` (engine thread) maps every wanted expert to a slot at once: free slots first,
  then the slots of resident experts the set does not name (least recent first), never
  one it names; it stops where neither is left, so it never evicts more than the cache
  holds. No MLX call, no compute: nothing reads those slots until the job has ended.
- One background thread reads them in small chunks (the r-th `per_round` most recent
  experts of every layer in round r, at most `CHUNK_BYTES` per reader call), so the
  most recently used experts land first.
- Any command the engine takes (a Generate, a load, a shutdown) first calls `stop`: the
  chunk being read finishes (at most `CHUNK_BYTES`), the chunks not read give their
  slots back, and the command runs. A new warm request replaces the old one.
- With a budget that holds every expert, whole layers are read in id order and then
  frozen (the layer needs no host sync, as after its first visit).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from ssdmoe_tui.engine.experts.cache import ExpertCache
from ssdmoe_tui.engine.experts.reader import ReadError

CHUNK_BYTES = 16 << 20  # the most one reader call of the warm-up reads (a command waits for it)

WorkingSet = Sequence[tuple[int, Sequence[int]]]


@dataclass
class WarmFigures:
    """What one warm-up did: experts asked for, already resident, read, without room."""

    requested: int = 0
    resident: int = 0
    read: int = 0
    no_room: int = 0
    bytes_read: int = 0
    seconds: float = 0.0
    cancelled: bool = False
    error: str = ""


def check_working_set(ws: WorkingSet, num_layers: int, num_experts: int) -> tuple[list, int]:
    """The entries in range for this model, each id once per layer (first place kept);
    and how many were dropped."""
    out: list[tuple[int, list[int]]] = []
    dropped = 0
    seen_layers: set[int] = set()
    for layer, ids in ws:
        if not _is_int(layer) or not 0 <= layer < num_layers or layer in seen_layers:
            dropped += len(ids) if isinstance(ids, (list, tuple)) else 1
            continue
        seen_layers.add(layer)
        keep: list[int] = []
        seen: set[int] = set()
        for e in ids:
            if _is_int(e) and 0 <= e < num_experts and e not in seen:
                seen.add(e)
                keep.append(int(e))
            else:
                dropped += 1
        if keep:
            out.append((int(layer), keep))
    return out, dropped


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


@dataclass
class _Chunk:
    layer: int
    experts: np.ndarray
    slots: np.ndarray


@dataclass
class WarmUp:
    """One warm-up job over `cache`; `on_finished` is called on the reading thread once
    it has read everything (the engine then calls `finish` on its own thread)."""

    cache: ExpertCache
    on_finished: Callable[[], None] | None = None
    figures: WarmFigures = field(default_factory=WarmFigures)
    _chunks: list[_Chunk] = field(default_factory=list)
    _next: int = 0  # chunks before it are read (or being read)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _done: bool = False
    _t0: float = 0.0

    def start(self, ws: WorkingSet, per_round: int) -> None:
        """Claim slots for `ws` (checked, in range) and start reading. Engine thread."""
        cache = self.cache
        self._t0 = time.perf_counter()
        plan = _plan(cache, ws, max(1, per_round))
        f = self.figures
        f.requested = sum(len(ids) for _, ids in ws)
        wanted = {(layer, e) for layer, ids in plan for e in ids}
        f.resident = sum(1 for layer, ids in ws for e in ids if cache.resident(layer, e))
        # Resident experts the set does not name may give their slots, least recent first
        # (`claim` takes them from the end: ranked by recency within each layer).
        spare = sorted(
            (
                (rank, (layer, e))
                for layer, ids in cache.working_set()
                for rank, e in enumerate(ids)
                if (layer, e) not in wanted
            ),
        )
        keys = [(layer, e) for layer, ids in plan for e in ids if not cache.resident(layer, e)]
        slots = cache.claim(keys, [k for _, k in spare])
        f.no_room = len(keys) - len(slots)
        keys = keys[: len(slots)]
        per_call = max(1, CHUNK_BYTES // max(1, cache.index.expert_bytes))
        i = 0
        while i < len(keys):  # consecutive keys of one layer, at most per_call each
            layer = keys[i][0]
            j = i
            while j < len(keys) and keys[j][0] == layer and j - i < per_call:
                j += 1
            exp = np.array([k[1] for k in keys[i:j]], dtype=np.int64)
            self._chunks.append(_Chunk(layer, exp, slots[i:j]))
            i = j
        if not self._chunks:
            self._done = True
            self.figures.seconds = time.perf_counter() - self._t0
            return
        self._thread = threading.Thread(target=self._run, name="ssdmoe-warm", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            while self._next < len(self._chunks) and not self._stop.is_set():
                c = self._chunks[self._next]
                self._next += 1
                try:
                    self.figures.bytes_read += self.cache.read_into(c.layer, c.experts, c.slots)
                except Exception as e:  # noqa: BLE001 - a ReadError, or anything else
                    self.figures.error = str(e) if isinstance(e, ReadError) else repr(e)
                    self._next -= 1  # its slots hold garbage: given back with the rest
                    return
                self.figures.read += len(c.experts)
        finally:
            if self.on_finished is not None and not self._stop.is_set():
                self.on_finished()

    @property
    def running(self) -> bool:
        return not self._done

    def stop(self) -> WarmFigures:
        """End the job (engine thread): wait for the chunk being read, give back the
        slots of the chunks not read, freeze layers a full budget now holds whole."""
        if self._done:
            return self.figures
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self._done = True
        unread = self._chunks[self._next :]
        if unread:
            self.figures.cancelled = not self.figures.error
            self.cache.forget(np.concatenate([c.slots for c in unread]))
        self.cache.freeze_full_layers()
        self.figures.seconds = time.perf_counter() - self._t0
        return self.figures

    finish = stop  # after `on_finished`: nothing is left to read, the same bookkeeping


def _plan(cache: ExpertCache, ws: WorkingSet, per_round: int) -> list[tuple[int, list[int]]]:
    """Read order: round r takes the r-th `per_round` most recent experts of every layer
    (the experts the next token most likely needs land first). A budget holding every
    expert reads the named layers whole, in id order (so each freezes on its own rows)."""
    if cache.holds_everything:
        e = cache.index.num_experts
        return [(layer, list(range(e))) for layer, _ in sorted(ws)]
    plan: list[tuple[int, list[int]]] = []
    depth = max((len(ids) for _, ids in ws), default=0)
    for start in range(0, depth, per_round):
        for layer, ids in ws:
            part = list(ids[start : start + per_round])
            if part:
                plan.append((layer, part))
    return plan

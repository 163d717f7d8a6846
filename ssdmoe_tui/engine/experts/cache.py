"""RAM expert cache: experts live in slots of preallocated MLX arrays, one array per component.

A hit costs nothing: compute indexes the slot arrays directly (`gather_qmm` with slot
ids), so no bytes are copied. A miss is read by the native reader straight from the
shard into the slot's memory (no staging buffer). One cache spans all MoE layers,
keyed by (layer, expert), within a byte budget; an eviction policy picks victims.

Slot banks: MLX kernels index arrays with 32-bit offsets in places (MLX-CUDA 0.32.4's
`gather_qmm` returns wrong results for experts that start 2 GiB or more into one array;
Metal has int32 limits at 2^31 elements), so each component's slots are split into
banks that each stay under 2 GiB. A slot id is global; its bank is `slot // bank_slots`
and its row inside the bank `slot % bank_slots`. `SSDMOE_SLOT_BANK_BYTES` lowers the
bank size (tests force several banks on tiny models with it).

Safety rule: a slot may only be overwritten once the work that reads it has been
evaluated. The streamed block guarantees it: every layer syncs its router indices
to the host before asking for slots, and those indices depend on every earlier
layer's output, so all earlier expert compute has finished. Slots asked for by the
current call are pinned for that call.
"""

from __future__ import annotations

import os
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field, replace
from pathlib import Path

import mlx.core as mx
import numpy as np

from ssdmoe_tui.engine.experts.device_memory import PlacementResult, place_slots
from ssdmoe_tui.engine.experts.index import ExpertIndex
from ssdmoe_tui.engine.experts.mirror import SlotMirror, mirror_mode, mirrors
from ssdmoe_tui.engine.experts.page_moves import slot_ranges
from ssdmoe_tui.engine.experts.reader import (
    COPY,
    WIDEN_KIND,
    Reader,
    ReadError,
    buffer_address,
    split_requests,
)
from ssdmoe_tui.engine.experts.slack import SPARE_SLOTS, slot_array
from ssdmoe_tui.errors import ModelError
from ssdmoe_tui.memory import available_memory_bytes

_MX_DTYPES = {
    "U8": mx.uint8, "I8": mx.int8, "U16": mx.uint16, "I16": mx.int16,
    "U32": mx.uint32, "I32": mx.int32, "F16": mx.float16, "BF16": mx.bfloat16,
    "F32": mx.float32,
}  # fmt: skip


@dataclass
class CacheCounters:
    hits: int = 0
    misses: int = 0
    bytes_read: int = 0
    read_s: float = 0.0
    read_calls: int = 0
    prefetch_issued: int = 0  # experts read ahead on the next layer's predicted routing
    prefetch_used: int = 0  # of those, experts the layer then really needed
    prefetch_wait_s: float = 0.0  # time a layer waited for its prefetch to land
    prefetch_overlaps: int = 0  # lookups that did not wait for their guesses (`overlap`)
    prefetch_dropped: int = 0  # guesses not read: their layer's lookup came first
    demand_read_s: float = 0.0  # engine thread: reading a layer's misses (`complete`)
    ensure_s: float = 0.0  # time in `ensure` (lookups, eviction policy, reads)

    def snapshot(self) -> CacheCounters:
        return CacheCounters(**self.__dict__)

    @property
    def hit_rate(self) -> float:
        n = self.hits + self.misses
        return self.hits / n if n else 0.0


_NONE = np.zeros(0, dtype=np.int64)


@dataclass(frozen=True)
class Pending:
    """A lookup whose misses are not read yet (`ExpertCache.lookup` -> `complete`)."""

    layer: int
    slots: np.ndarray  # the slot of each expert asked for, in order
    read_experts: np.ndarray  # experts still to read (with a budget holding every
    read_slots: np.ndarray  # expert, the rest of the layer too), and their slots
    # slots a read-ahead guess for this layer is still filling in the background (used
    # or not): `complete` waits for them; until then no compute may read them
    landing: np.ndarray | None = None

    @property
    def waiting(self) -> np.ndarray:
        """Every slot that a read fills before `complete` returns."""
        if self.landing is None:
            return self.read_slots
        return np.concatenate([self.read_slots, self.landing])


class _Stop:
    """Where the guesses' read stops: the prefetch thread reads them one expert at a time,
    most likely first, only while their layer's lookup has not come; the lookup stops it
    and learns how many were started (those land; the rest are never read)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._asked = False
        self._started = 0

    def may_read(self, i: int) -> bool:
        """Prefetch thread: whether guess `i` may still be read (it is then started)."""
        with self._lock:
            if self._asked:
                return False
            self._started = i + 1
            return True

    def ask(self) -> int:
        """Engine thread: no guess starts from now on; returns how many did."""
        with self._lock:
            self._asked = True
            return self._started


@dataclass(frozen=True)
class _Background:
    """A read ahead in flight on the prefetch thread."""

    future: Future  # -> (bytes, seconds)
    layer: int
    slots: np.ndarray
    # read-ahead v2 with `overlap`: its experts (in `slots`' order, most likely first),
    # their keys, which the layer's lookup keeps out of its victims instead of waiting
    # for them, and where the read stops (None: every lookup waits first)
    keys: frozenset | None = None
    experts: np.ndarray | None = None
    stop: _Stop | None = None
    # per slot, the cold expert it held and that expert's last use (None: a free slot),
    # given back where the guess is never read: its bytes are still there
    held: tuple | None = None


MAX_BANK_BYTES = (2 << 30) - 1  # every bank array stays under 2 GiB
BANK_BYTES_ENV = "SSDMOE_SLOT_BANK_BYTES"


def bank_slot_count(
    slot_bytes_max: int, capacity: int, num_experts: int, bank_bytes: int | None = None
) -> int:
    """Slots per bank: as many as fit under the bank size in the largest component with
    the bank's spare slot (slack.py), rounded down to whole layers (multiples of
    `num_experts`) when at least one fits, so a layer read whole (a budget holding every
    expert) lands in one bank."""
    limit = bank_bytes if bank_bytes is not None else _env_bank_bytes()
    limit = min(limit, MAX_BANK_BYTES)
    n = max(1, limit // max(1, slot_bytes_max) - SPARE_SLOTS)
    if n >= num_experts:
        n -= n % num_experts
    return min(n, capacity)


def _env_bank_bytes() -> int:
    text = os.environ.get(BANK_BYTES_ENV, "").strip()
    if not text:
        return MAX_BANK_BYTES
    try:
        v = parse_size(text)
    except ValueError:
        v = 0
    if v < 1:
        raise ModelError(f"{BANK_BYTES_ENV}={text!r}: expected a positive size such as 64M")
    return v


SPLIT_ENV = "SSDMOE_READ_SPLIT"


def _env_split() -> int:
    """Smallest piece a read is split into (`reader.split_requests`); 0: off (default).

    Off until it wins: on the development VM's disk, cutting a layer's 1-2 missed
    experts into 128-384 KiB pieces read no faster, nor on the H100 machine's disk at
    256K (2026-12-07, the trace at 4 GiB: its misses already read at the disk's rate;
    docs/benchmarks.md)."""
    text = os.environ.get(SPLIT_ENV, "").strip().lower()
    if text in ("", "0", "off"):
        return 0
    try:
        v = parse_size(text)
    except ValueError:
        v = 0
    if v < 4096:
        raise ModelError(
            f"{SPLIT_ENV}={text!r}: expected off or a size of at least 4K, such as 256K"
        )
    return v


def _slot_dtypes(index: ExpertIndex, act_dtype: mx.Dtype | None) -> tuple[list[bool], list]:
    """Per component: whether its values are widened to float32 as they are read, and
    the slot array's dtype. An unsupported dtype is one line naming the tensor."""
    widen, dtypes = [], []
    for c in index.layers[0].components:
        dt = _MX_DTYPES.get(c.dtype)
        if dt is None:
            raise ModelError(
                f"expert tensor {c.name} of {index.layers[0].prefix} has unsupported dtype {c.dtype}"
            )
        w = _widened(c, act_dtype)
        widen.append(w)
        dtypes.append(mx.float32 if w else dt)
    return widen, dtypes


def _make_banks(comps, dtypes: list, capacity: int, bank_slots: int) -> list[dict[str, mx.array]]:
    """banks[b][component] -> an array of `bank_slots` slots (the last bank: the
    remainder), each bank under the size MLX-CUDA's gather_qmm handles."""
    banks: list[dict[str, mx.array]] = []
    for start in range(0, capacity, bank_slots):
        n = min(bank_slots, capacity - start)
        # each with a spare slot behind its last (slack.py: the kernel reads past the end)
        banks.append(
            {c.name: slot_array(n, tuple(c.shape), dt) for c, dt in zip(comps, dtypes, strict=True)}
        )
    return banks


def _open_layer_files(
    index: ExpertIndex, model_dir: Path, reader: Reader
) -> tuple[list[np.ndarray], list[np.ndarray], list[np.ndarray]]:
    """Per layer and component: the shard's file handle (each shard opened once, advised
    random), the file offset of expert 0, and the file bytes between consecutive experts."""
    fds_all, offsets_all, steps_all = [], [], []
    handles: dict[str, int] = {}
    for layer in index.layers:
        fds, offs = [], []
        for c in layer.components:
            if c.shard not in handles:
                handles[c.shard] = fd = reader.open(Path(model_dir) / c.shard)
                _advise_random(fd)
            fds.append(handles[c.shard])
            offs.append(c.offset)
        fds_all.append(np.array(fds, dtype=np.int64))
        offsets_all.append(np.array(offs, dtype=np.int64))
        steps_all.append(np.array([c.file_step for c in layer.components], dtype=np.int64))
    return fds_all, offsets_all, steps_all


@dataclass
class _Layout:
    names: list[str]
    strides: np.ndarray  # int64 per component: bytes of one expert in the file
    mem_strides: np.ndarray = field(
        default_factory=lambda: np.zeros(0, np.int64)
    )  # bytes of one slot in memory (twice the file's where widened to float32)
    kinds: np.ndarray = field(
        default_factory=lambda: np.zeros(0, np.intc)
    )  # the reader's request kind per component (COPY, or WIDEN_* into float32)
    bases: np.ndarray = field(
        default_factory=lambda: np.zeros((0, 0), np.int64)
    )  # [bank, comp] slot-0 address

    @classmethod
    def of(cls, comps, widen: list[bool], banks: list[dict[str, mx.array]]) -> _Layout:
        """The components' names, strides and read kinds, and every bank's slot-0
        address of each."""
        strides = np.array([c.stride for c in comps], dtype=np.int64)
        return cls(
            names=[c.name for c in comps],
            strides=strides,
            mem_strides=strides * np.array([2 if w else 1 for w in widen], dtype=np.int64),
            kinds=np.array(
                [WIDEN_KIND[c.dtype] if w else COPY for c, w in zip(comps, widen, strict=True)],
                dtype=np.intc,
            ),
            bases=np.array(
                [[buffer_address(memoryview(bank[c.name])) for c in comps] for bank in banks],
                dtype=np.int64,
            ),
        )


def _place_banks(
    banks: list[dict[str, mx.array]], placement: str | None, share: float
) -> PlacementResult:
    """Where MLX-CUDA keeps every slot array (`device_memory.place_slots`)."""
    return place_slots(
        [(buffer_address(memoryview(a)), int(a.nbytes)) for bank in banks for a in bank.values()],
        placement,
        share=share,
    )


class ExpertCache:
    """Slots for `capacity` experts, shared by every MoE layer."""

    def __init__(
        self,
        index: ExpertIndex,
        model_dir: Path,
        capacity: int,
        reader: Reader,
        policy: str = "auto",
        act_dtype: mx.Dtype | None = None,
        placement: str | None = None,
        bank_bytes: int | None = None,
    ) -> None:
        """`act_dtype` float32: bf16/f16 scales and biases are widened to float32 as they
        are read (exact), because MLX's CPU `gather_qmm` would otherwise convert the whole
        slot array on every call. Packed weights always land in the slots untouched.
        `placement`: where MLX-CUDA keeps the slots (see `device_memory`).
        `bank_bytes`: largest bank array (default: under 2 GiB, or $SSDMOE_SLOT_BANK_BYTES)."""
        from ssdmoe_tui.engine.policy.policies import DEFAULT_POLICY, make_policy

        if capacity < 1:
            raise ValueError("expert cache needs at least one slot")
        self.index = index
        self.capacity = capacity
        self.reader = reader
        self.counters = CacheCounters()
        self.policy_name = DEFAULT_POLICY if policy == "auto" else policy
        self.policy = make_policy(self.policy_name, capacity, index.num_layers)
        comps = index.layers[0].components
        widen, dtypes = _slot_dtypes(index, act_dtype)
        mem_strides = [c.stride * (2 if w else 1) for c, w in zip(comps, widen, strict=True)]
        self.bank_slots = bank_slot_count(max(mem_strides), capacity, index.num_experts, bank_bytes)
        self.banks = _make_banks(comps, dtypes, capacity, self.bank_slots)
        self.placement = _place_banks(
            self.banks, placement, share=capacity / (index.num_experts * index.num_layers)
        )
        # `device` placement: the compute reads a device-resident twin of the banks, the
        # rows a read fills copied over before use (mirror.py); None: it reads the banks.
        self.mirror = (
            SlotMirror(self.banks, self.bank_slots)
            if mirrors(mirror_mode(), self.placement.placement)
            else None
        )
        self._layout = _Layout.of(comps, widen, self.banks)
        self._widens = any(widen)
        # Per layer: file handle and file offset of expert 0 for each component.
        self._fds, self._offsets, self._steps = _open_layer_files(index, model_dir, reader)
        self._model_dir = Path(model_dir)
        # read-ahead v2's own reader and its handles, opened at its first guess: its
        # guesses are read beside the layer's misses, not queued behind them
        # (False: it could not be opened)
        self._guess_io: tuple[Reader, list[np.ndarray]] | bool | None = None
        self._slot_of: dict[tuple[int, int], int] = {}
        # When the budget holds every expert nothing is ever evicted: once a layer's
        # experts are all resident, its expert->slot map lives on the device and the
        # layer needs no host sync at all (the graph stays lazy, as in plain mlx-lm).
        self.holds_everything = capacity >= index.num_experts * index.num_layers
        self._device_lut: list[tuple[int, mx.array] | None] = [None] * index.num_layers
        # A frozen layer whose experts sit in rows r..r+E-1 of one bank in id order: its
        # own views of those rows, so it runs mlx-lm's call with the router's indices.
        self._layer_rows: list[dict | None] = [None] * index.num_layers
        computed = self.banks if self.mirror is None else self.mirror.banks
        self._bank_arrays: list[dict] = [_by_projection(bank) for bank in computed]
        self._host_arrays: list[dict] = (
            self._bank_arrays if self.mirror is None else [_by_projection(b) for b in self.banks]
        )
        self._layer_count = [0] * index.num_layers  # resident experts per layer
        self._key_of = [None] * capacity
        self._free = list(range(capacity - 1, -1, -1))
        self.on_route = None  # optional callback(layer, experts) for trace recording
        self.routing = None  # a TraceRouting when the run is trace-driven
        self.predictor = None  # a CooccurrencePredictor learning from the lookups (prefetch)
        self._prefetched: set[tuple[int, int]] = set()  # read ahead, not yet used
        self._inflight: _Background | None = None  # the read ahead in flight
        # Decode read-ahead v2 (engine/experts/prefetch.py): the token each slot was last
        # asked for (cold slots are the ones a guess may take), and the per-layer governor.
        self._token = 0
        self._last_use = np.full(capacity, -(1 << 40), dtype=np.int64)
        self.governor = None  # a prefetch.PrefetchGovernor while decode read-ahead is on
        self._guessed: tuple[int, np.ndarray] | None = None  # (layer, ids read ahead for it)
        self._pool = None
        self._split_min = _env_split()

    @property
    def token(self) -> int:
        """Tokens decoded since the load (`step`)."""
        return self._token

    @property
    def num_banks(self) -> int:
        return len(self.banks)

    @property
    def slot_bytes(self) -> int:
        """Memory of one slot (widened scales count double)."""
        return sum(int(p.nbytes) for b in self.banks for p in b.values()) // self.capacity

    @property
    def budget_bytes(self) -> int:
        return self.capacity * self.slot_bytes

    @property
    def used_bytes(self) -> int:
        return (self.capacity - len(self._free)) * self.slot_bytes

    @property
    def all_frozen(self) -> bool:
        """Every layer maps experts to slots on the device: decode needs no host sync."""
        return None not in self._device_lut  # C speed: asked per round by the spec loop

    def device_lut(self, layer: int) -> tuple[int, mx.array] | None:
        """(bank, expert id -> row in that bank) on the device, once every expert of
        `layer` is resident for good (only when the budget holds all experts); else None."""
        return self._device_lut[layer]

    def bank_arrays(self, bank: int) -> dict[str, tuple]:
        """Projection name -> (weight, scales, biases, bias; None where absent) of one bank
        (built once): the bank's mirror where there is one, which is what compute reads."""
        return self._bank_arrays[bank]

    def host_bank_arrays(self, bank: int) -> dict[str, tuple]:
        """As `bank_arrays`, of the banks the reader writes (the same without a mirror):
        a copy staged from them needs no mirror row (prestage.py)."""
        return self._host_arrays[bank]

    def layer_arrays(self, layer: int) -> dict[str, tuple] | None:
        """A frozen layer's experts as their own arrays (rows = expert ids), or None."""
        return self._layer_rows[layer]

    def _maybe_freeze_layer(self, layer: int) -> None:
        e = self.index.num_experts
        if self._layer_count[layer] == e and self._device_lut[layer] is None:
            self.sync_mirror()  # its rows in the mirror before a table points at them
            slots = np.array([self._slot_of[(layer, i)] for i in range(e)], dtype=np.int64)
            banks = slots // self.bank_slots
            if (banks != banks[0]).any():
                return  # split over banks: the layer keeps its host-side lookup
            b = int(banks[0])
            rows = slots % self.bank_slots
            lut = mx.array(rows.astype(np.uint32))
            mx.eval(lut)
            self._device_lut[layer] = (b, lut)
            r0 = int(rows[0])
            # Views would hold the mirror's buffer, and every later copy into that bank
            # would then copy the whole bank (mirror.py): a mirrored layer uses the table.
            if self.mirror is None and (rows == r0 + np.arange(e)).all():
                views = {
                    proj: tuple(None if a is None else a[r0 : r0 + e] for a in arrays)
                    for proj, arrays in self._bank_arrays[b].items()
                }
                mx.eval([a for t in views.values() for a in t if a is not None])
                self._layer_rows[layer] = views

    def slots_of(self, layer: int, experts: np.ndarray) -> np.ndarray:
        """The slot holding each of `layer`'s `experts` now, -1 where it is not resident
        (no bookkeeping: a read-ahead's guesses count only when looked up)."""
        get = self._slot_of.get
        return np.array([get((layer, int(e)), -1) for e in experts], dtype=np.int64)

    def slot_ranges(self, slots: np.ndarray) -> list[tuple[int, int]]:
        """(address, bytes) of `slots`' rows in the host banks the reader writes, adjacent
        rows coalesced (page_moves.py moves them)."""
        lay = self._layout
        return slot_ranges(slots, self.bank_slots, lay.bases, lay.mem_strides)

    def resident(self, layer: int, expert: int) -> bool:
        return (layer, expert) in self._slot_of

    def ensure(self, layer: int, experts: np.ndarray, observe: bool = True) -> np.ndarray:
        """Make `experts` (unique ids) of `layer` resident; return their slots, in order.

        `observe=False`: the caller already gave the layer's whole selection to the trace
        recorder and the predictor (a distributed rank looks up only its share).

        All misses of the call are read in one batched reader call. The time spent here
        is counted (`counters.ensure_s`): minus read time, it is the cache's bookkeeping.
        `lookup` + `complete` are the same two halves, for a caller that computes the
        hits between them (the pipelined layer, engine/model/streamed.py).
        """
        pending = self.lookup(layer, experts, observe)
        self.complete(pending)
        return pending.slots

    def lookup(
        self, layer: int, experts: np.ndarray, observe: bool = True, mirror: bool = True
    ) -> Pending:
        """The first half of `ensure`: slots for `experts` (misses get theirs now, by
        eviction), counted as hits and misses, but nothing read yet. Until `complete`
        the missed slots hold stale bytes: only the hits' slots may be computed from,
        and no other cache call may come between the two. `mirror` False: rows read
        stay marked for the mirror's next sync (a caller computing from the host banks,
        prestage.py)."""
        t0 = time.perf_counter()
        try:
            pending = self._lookup(layer, experts, observe)
        finally:
            self.counters.ensure_s += time.perf_counter() - t0
        if mirror:
            self.sync_mirror()  # read-ahead guesses that landed, a warm resume's rows
        return pending

    def complete(self, pending: Pending, mirror: bool = True) -> None:
        """The second half of `ensure`: read the misses of `pending` (one batched reader
        call) and freeze the layer where the budget holds every expert. `mirror`: as
        `lookup`'s."""
        if pending.landing is not None:
            if len(pending.read_experts):
                try:
                    self._complete_reads(pending, mirror)  # beside the guess still landing
                except BaseException:
                    try:  # nothing may outlive the layer's call: the guess lands or is forgotten
                        self.wait_prefetch()
                    except ReadError:
                        pass  # the first error is the one raised
                    raise
            self.wait_prefetch()
            return
        if len(pending.read_experts):
            self._complete_reads(pending, mirror)

    def _complete_reads(self, pending: Pending, mirror: bool) -> None:
        t0 = time.perf_counter()
        try:
            self._read(pending.layer, pending.read_experts, pending.read_slots)
        finally:
            dt = time.perf_counter() - t0
            self.counters.ensure_s += dt
            self.counters.demand_read_s += dt
        if mirror:
            self.sync_mirror()  # the misses, copied to the mirror before their compute
        if self.holds_everything:
            self._maybe_freeze_layer(pending.layer)

    def sync_mirror(self) -> None:
        """Copy the rows reads filled since the last call into the mirror (queued on the
        device before any compute that may read them); nothing without a mirror."""
        if self.mirror is not None:
            self.mirror.sync()

    def _lookup(self, layer: int, experts: np.ndarray, observe: bool = True) -> Pending:
        n = len(experts)
        if n > self.capacity:
            raise ValueError(f"{n} experts requested, cache holds {self.capacity}")
        if observe and self.on_route is not None:
            self.on_route(layer, experts)
        if observe and self.predictor is not None:
            self.predictor.observe(layer, experts.tolist())
        pinned = [(layer, int(e)) for e in experts]
        landing = self._inflight
        if landing is not None and (
            landing.keys is None
            or landing.layer != layer
            or self.mirror is not None
            or self.holds_everything
        ):
            landing = None
        if landing is not None:
            landing = self._stop_guesses(landing)
        if landing is not None and len(landing.keys.union(pinned)) > self.capacity:
            landing = None  # too few victims without their slots: they land first
        if landing is None:
            self.wait_prefetch()
        if self.holds_everything and self._layer_count[layer] == 0:
            return self._first_visit(layer, experts)
        slots = np.empty(n, dtype=np.int64)
        miss_pos: list[int] = []
        slot_of = self._slot_of
        prefetched = self._prefetched
        used_prefetch = 0
        guard = frozenset(pinned)  # frozen: the policy sets pinned entries aside (policies.py)
        if landing is not None:
            guard = guard | landing.keys  # a slot still being written is nobody's victim
            self.counters.prefetch_overlaps += 1
        for i, key in enumerate(pinned):
            s = slot_of.get(key)
            if s is None:
                # Evict and insert in lookup order, interleaved with the hits: the calls
                # `ssdmoe trace replay` makes, so its numbers are the engine's.
                miss_pos.append(i)
                self._assign(pinned, [i], slots, guard)
            else:
                slots[i] = s
                if prefetched and key in prefetched:
                    prefetched.discard(key)
                    used_prefetch += 1
                self.policy.hit(key)
        # An expert that had to come from disk is a miss, even when prefetch read it early.
        self.counters.prefetch_used += used_prefetch
        self._last_use[slots] = self._token
        guessed = self._guessed
        if guessed is not None and guessed[0] == layer:
            self._guessed = None
            if self.governor is not None:
                self.governor.settle(
                    layer, len(guessed[1]), int(np.isin(guessed[1], experts).sum())
                )
        self.counters.hits += n - len(miss_pos) - used_prefetch
        self.counters.misses += len(miss_pos) + used_prefetch
        land = None if landing is None else landing.slots
        if not miss_pos:
            return Pending(layer, slots, _NONE, _NONE, land)
        to_read, read_slots = experts[miss_pos], slots[miss_pos]
        if self.holds_everything:
            # Nothing will ever be evicted: read the rest of the layer in the same batch,
            # so the layer freezes (device-side lookup, no more syncs) after one visit.
            rest = [(layer, e) for e in range(self.index.num_experts) if (layer, e) not in slot_of]
            if rest:
                rest_slots = np.empty(len(rest), dtype=np.int64)
                self._assign(rest, list(range(len(rest))), rest_slots, guard | set(rest))
                to_read = np.concatenate([to_read, np.array([k[1] for k in rest], dtype=np.int64)])
                read_slots = np.concatenate([read_slots, rest_slots])
        return Pending(layer, slots, np.asarray(to_read, dtype=np.int64), read_slots, land)

    def _stop_guesses(self, landing: _Background) -> _Background | None:
        """The layer's lookup has come: the guesses not started are not read (their
        slots back to the cold experts they held, or free; not counted as read ahead);
        returns what still lands, or None where nothing was started."""
        n = landing.stop.ask()
        dropped = len(landing.slots) - n
        if dropped:
            for s, held in zip(landing.slots[n:], landing.held[n:], strict=True):
                self._drop_guess(int(s), held)  # nothing was written there
            self.counters.prefetch_issued -= dropped
            self.counters.prefetch_dropped += dropped
            guessed = self._guessed
            if guessed is not None and guessed[0] == landing.layer:
                self._guessed = (guessed[0], guessed[1][:n])
        if n == 0:
            landing.future.cancel()  # or it finds the stop and reads nothing
            self._inflight = None
            return None
        if dropped:
            read = landing.experts[:n]
            landing = replace(
                landing,
                slots=landing.slots[:n],
                keys=frozenset((landing.layer, int(e)) for e in read),
                experts=read,
            )
            self._inflight = landing
        return landing

    def _drop_guess(self, s: int, held: tuple | None) -> None:
        """A guess never read: slot `s` goes back to the cold expert it held, whose bytes
        are still there (with its last use, so it stays the cold slot it was), or to the
        free list."""
        key = self._key_of[s]
        if key is not None and self._slot_of.get(key) == s:
            self._evict(key)
        if held is not None and held[0] not in self._slot_of:
            old, last = held
            self._slot_of[old] = s
            self._key_of[s] = old
            self._layer_count[old[0]] += 1
            self.policy.insert(old)
            self._last_use[s] = last
        else:
            self._key_of[s] = None
            self._free.append(s)

    def _first_visit(self, layer: int, experts: np.ndarray) -> Pending:
        """A budget holding every expert, a layer not seen yet: read the whole layer in
        one batch, slots in expert-id order (consecutive while layers arrive in order,
        so the frozen layer runs on its own rows of one bank: no lookup on the device).
        Counted as the misses of the experts asked for, as the replay counts them."""
        e = self.index.num_experts
        keys = [(layer, i) for i in range(e)]
        slots = np.empty(e, dtype=np.int64)
        self._assign(keys, list(range(e)), slots, frozenset(keys))
        self.counters.misses += len(experts)
        return Pending(
            layer, slots[np.asarray(experts, dtype=np.int64)], np.arange(e, dtype=np.int64), slots
        )

    def _assign(
        self, keys: list, positions: list[int], slots: np.ndarray, pinned: frozenset
    ) -> None:
        slot_of = self._slot_of
        for i in positions:
            if self._free:
                s = self._free.pop()
            else:
                victim = self.policy.victim(pinned, keys[i])
                self.policy.remove(victim)
                self._prefetched.discard(victim)
                s = slot_of.pop(victim)
                self._layer_count[victim[0]] -= 1
            key = keys[i]
            self._layer_count[key[0]] += 1
            slot_of[key] = s
            self._key_of[s] = key
            self.policy.insert(key)
            slots[i] = s

    def prefetch(self, layer: int, experts: np.ndarray, pinned: set) -> None:
        """Start reading `layer`'s predicted experts in the background.

        `pinned`: keys the work in flight still reads (the current layer's experts);
        they are never chosen as victims. The next `ensure` waits for the bytes.
        """
        self.wait_prefetch()
        keys = [(layer, int(e)) for e in experts if (layer, int(e)) not in self._slot_of]
        if not keys:
            return
        room = self.capacity - len(pinned)
        keys = keys[: max(room, 0)]
        if not keys:
            return
        from ssdmoe_tui.engine.policy.policies import NoVictimError

        slots = np.empty(len(keys), dtype=np.int64)
        guard = frozenset(pinned).union(keys)  # frozen: see `lookup`
        n = 0
        while n < len(keys):  # best effort: stop where no slot can be freed
            try:
                self._assign(keys, [n], slots, guard)
            except NoVictimError:
                break
            n += 1
        keys, slots = keys[:n], slots[:n]
        if not keys:
            return
        self._prefetched.update(keys)
        self.counters.prefetch_issued += len(keys)
        exp = np.array([k[1] for k in keys], dtype=np.int64)
        self._read_behind(layer, exp, slots)

    def prefetch_cold(self, layer: int, ranked: np.ndarray, pinned: set) -> int:
        """Decode read-ahead v2: read up to `governor.limit` of `layer`'s predicted
        experts (`ranked`, most likely first) that are not resident, into free slots or
        cold ones (`PrefetchGovernor.cold_tokens`: not asked for in that many tokens; the
        coldest first), never evicting a warm expert nor one of `pinned`; nothing where
        the governor has the layer off. Returns the experts issued (read in the
        background; the layer's `lookup` waits for them and tells the governor how many
        it used)."""
        gov = self.governor
        self.wait_prefetch()
        if gov is None or not gov.allowed(layer):
            return 0
        slot_of = self._slot_of
        want = [int(e) for e in ranked if (layer, int(e)) not in slot_of][: gov.limit]
        if not want:
            return 0
        slots: list[int] = []
        held: list[tuple | None] = []  # what each slot held (`_Background.held`)
        while self._free and len(slots) < len(want):
            slots.append(self._free.pop())
            held.append(None)
        if len(slots) < len(want):
            cold = np.flatnonzero(self._last_use < self._token - gov.cold_tokens)
            cold = cold[np.argsort(self._last_use[cold], kind="stable")]
            for s in cold.tolist():
                if len(slots) == len(want):
                    break
                key = self._key_of[s]
                if key is None or key in pinned:
                    continue
                self.policy.remove(key)
                self._prefetched.discard(key)
                del slot_of[key]
                self._layer_count[key[0]] -= 1
                slots.append(s)
                held.append((key, int(self._last_use[s])))
        keys = [(layer, e) for e in want[: len(slots)]]
        if not keys:
            return 0
        for key, s in zip(keys, slots, strict=True):
            self._layer_count[layer] += 1
            slot_of[key] = s
            self._key_of[s] = key
            self.policy.insert(key)
        arr = np.array(slots, dtype=np.int64)
        self._last_use[arr] = -(1 << 40)  # cold until asked for: an unused guess goes first
        self._prefetched.update(keys)
        self.counters.prefetch_issued += len(keys)
        exp = np.array([k[1] for k in keys], dtype=np.int64)
        self._guessed = (layer, exp)
        if gov.overlap and self.mirror is None and not self.holds_everything:
            self._read_behind(layer, exp, arr, frozenset(keys), tuple(held))
        else:
            self._read_behind(layer, exp, arr)
        return len(keys)

    def _read_behind(
        self,
        layer: int,
        experts: np.ndarray,
        slots: np.ndarray,
        keys: frozenset | None = None,
        held: tuple | None = None,
    ) -> None:
        """Read `layer`'s `experts` into `slots` on the prefetch thread. `keys`: theirs,
        read by the guesses' own reader, one at a time until the layer's lookup comes,
        which need not wait for them (see `_Background`); None: in one batch by the
        cache's reader, and every lookup waits first. The thread touches no bookkeeping:
        `wait_prefetch` counts the read, or forgets the slots where it failed."""
        if self._pool is None:
            from concurrent.futures import ThreadPoolExecutor

            self._pool = ThreadPoolExecutor(1, thread_name_prefix="ssdmoe-prefetch")
        io = self._guess_reader() if keys is not None else None
        if io is None:  # no reader of its own: the cache's, and the lookup waits
            fut = self._pool.submit(self._timed_read, layer, experts, slots, None)
            self._inflight = _Background(fut, layer, slots)
            return
        stop = _Stop()
        fut = self._pool.submit(self._read_guesses, layer, experts, slots, io, stop)
        self._inflight = _Background(fut, layer, slots, keys, experts, stop, held)

    def _read_guesses(
        self, layer: int, experts: np.ndarray, slots: np.ndarray, io, stop: _Stop
    ) -> tuple:
        """Prefetch thread: the guesses one expert at a time, most likely first, until
        their layer's lookup stops it, so a guess never holds the disk once the layer's
        own misses are asked for (beyond the one expert being read)."""
        t0 = time.perf_counter()
        nbytes = 0
        for i in range(len(experts)):
            if not stop.may_read(i):
                break
            nbytes += self.read_into(layer, experts[i : i + 1], slots[i : i + 1], io)
        return nbytes, time.perf_counter() - t0

    def _guess_reader(self) -> tuple[Reader, list[np.ndarray]] | None:
        """The guesses' reader and its handles per layer, opened once: the cache's own
        handles, unless it reads direct (then its own, with their O_DIRECT twins). None
        where it cannot be had (a process out of file handles: the guesses are then read
        as before, the lookup waiting for them)."""
        if self._guess_io is None:
            from ssdmoe_tui.engine.experts.reader import open_reader

            rd = self.reader
            guess = None
            try:
                guess = open_reader(rd.queue_depth, rd.direct, prefer=rd.name)
                if rd.direct:
                    fds, _, _ = _open_layer_files(self.index, self._model_dir, guess)
                else:
                    guess.borrow(rd)
                    fds = self._fds
                self._guess_io = (guess, fds)
            except OSError:
                if guess is not None:
                    guess.close()  # with every handle it opened
                self._guess_io = False
        return self._guess_io or None

    def _timed_read(self, layer: int, experts: np.ndarray, slots: np.ndarray, io) -> tuple:
        t0 = time.perf_counter()
        nbytes = self.read_into(layer, experts, slots, io)
        return nbytes, time.perf_counter() - t0

    def clear(self) -> None:
        """Forget every resident expert and the policy's state (a bench round starts
        from an empty cache, as a fresh engine would). Engine thread, between turns."""
        from ssdmoe_tui.engine.policy.policies import make_policy

        self.wait_prefetch()
        cap, layers = self.capacity, self.index.num_layers
        self._slot_of = {}
        self._key_of = [None] * cap
        self._free = list(range(cap - 1, -1, -1))
        self._layer_count = [0] * layers
        self._device_lut = [None] * layers
        self._layer_rows = [None] * layers
        self._prefetched.clear()
        self._guessed = None
        self._last_use[:] = -(1 << 40)
        self.policy = make_policy(self.policy_name, cap, layers)
        if self.predictor is not None:
            self.predictor.reset_token()
        if self.governor is not None:
            self.governor.reset()

    def wait_prefetch(self) -> None:
        """Wait for the read ahead in flight, if any (engine thread): counted, or, where
        it failed, its slots forgotten (they hold garbage) and its ReadError raised."""
        bg = self._inflight
        if bg is None:
            return
        self._inflight = None
        t0 = time.perf_counter()
        try:
            nbytes, seconds = bg.future.result()
        except ReadError:
            self.forget(bg.slots)
            raise
        finally:
            self.counters.prefetch_wait_s += time.perf_counter() - t0
        self.counters.read_s += seconds
        self.counters.read_calls += 1
        self.counters.bytes_read += int(nbytes)

    def _read(self, layer: int, experts: np.ndarray, slots: np.ndarray) -> None:
        t0 = time.perf_counter()
        try:
            nbytes = self.read_into(layer, experts, slots)
        except ReadError:
            self.forget(slots)  # the slots now hold garbage: nothing may read them as valid
            raise
        self.counters.read_s += time.perf_counter() - t0
        self.counters.read_calls += 1
        self.counters.bytes_read += int(nbytes)

    def read_into(
        self, layer: int, experts: np.ndarray, slots: np.ndarray, io: tuple | None = None
    ) -> int:
        """Read `layer`'s `experts` into `slots` (one batched reader call; bf16/f16 scales
        widened to float32 by the reader's threads where the slots hold float32); returns
        the bytes read. No bookkeeping and no MLX call (a mirror is only told which rows
        changed), so the warm-up's thread may run it while the engine thread is idle.
        `io`: (reader, its handles per layer) to read with instead of the cache's own.

        The widening was numpy's on the calling thread, through staging rows (issue 29);
        in the reader it costs the engine thread nothing and copies nothing twice: on the
        loaded 2-core VM it was 258 numpy calls a token of the 8-layer Qwen3-30B shape."""
        lay = self._layout
        n = len(experts)
        e = np.asarray(experts, dtype=np.int64)[:, None]
        bank, row = np.divmod(np.asarray(slots, dtype=np.int64), self.bank_slots)
        offsets = (self._offsets[layer] + e * self._steps[layer]).ravel()
        dests = (lay.bases[bank] + row[:, None] * lay.mem_strides).ravel()
        reader, layer_fds = (self.reader, self._fds) if io is None else io
        fds = np.tile(layer_fds[layer], n)
        lengths = np.tile(lay.strides, n)
        kinds = np.tile(lay.kinds, n) if self._widens else None
        if self._split_min:  # a layer's few misses as more, smaller reads ($SSDMOE_READ_SPLIT)
            fds, offsets, lengths, dests, kinds = split_requests(
                fds, offsets, lengths, dests, 2 * reader.queue_depth, self._split_min, kinds
            )
        nbytes = reader.read_batch(fds, offsets, lengths, dests, kinds)
        if self.mirror is not None:
            self.mirror.mark(slots)  # copied to the mirror before any compute reads them
        return int(nbytes)

    def forget(self, slots: np.ndarray) -> None:
        """Give `slots` back as free, forgetting the experts mapped to them (a failed read,
        or a warm-up stopped before it read them)."""
        for sl in slots:
            key = self._key_of[int(sl)]
            if key is not None and self._slot_of.get(key) == int(sl):
                del self._slot_of[key]
                self.policy.remove(key)
                self._prefetched.discard(key)
                self._layer_count[key[0]] -= 1
            self._key_of[int(sl)] = None
            self._free.append(int(sl))

    # ------------------------------------------------------------------ warm resume
    # Off the hot path: called between turns on the engine thread (engine/experts/warm.py).

    def working_set(self) -> list[tuple[int, list[int]]]:
        """The resident experts per layer, most recently used first (the eviction
        policy's recency where it keeps one, else the most recently read first); experts
        read ahead by prefetch and never used are left out. At most `capacity` ids."""
        from ssdmoe_tui.engine.policy.policies import recent_first

        keys = [k for k in reversed(self._slot_of) if k not in self._prefetched]
        by_layer: dict[int, list[int]] = {}
        for layer, expert in recent_first(self.policy, keys):
            by_layer.setdefault(layer, []).append(expert)
        return sorted(by_layer.items())

    def claim(self, keys: list[tuple[int, int]], spare: list[tuple[int, int]]) -> np.ndarray:
        """Slots for `keys` (none resident), engine thread: free slots first, then the
        slots of `spare` (resident keys not wanted, least wanted first, consumed from its
        end), never a policy victim. Returns the slots of the first keys that got one
        (fewer than `keys` when neither is left)."""
        self.wait_prefetch()
        slots: list[int] = []
        for key in keys:
            if self._free:
                s = self._free.pop()
            elif spare:
                s = self._evict(spare.pop())
            else:
                break
            self._layer_count[key[0]] += 1
            self._slot_of[key] = s
            self._key_of[s] = key
            slots.append(s)
        # `keys` come most wanted first; an insert is the policy's most recent use, so
        # they go in least wanted first: the most wanted end up the last to be evicted.
        for key in reversed(keys[: len(slots)]):
            self.policy.insert(key)
        out = np.array(slots, dtype=np.int64)
        self._last_use[out] = self._token  # wanted: warm, no read-ahead guess takes them
        return out

    def _evict(self, key: tuple[int, int]) -> int:
        self.policy.remove(key)
        self._prefetched.discard(key)
        s = self._slot_of.pop(key)
        self._layer_count[key[0]] -= 1
        self._key_of[s] = None
        return s

    def freeze_full_layers(self) -> None:
        """A budget holding every expert: layers the warm-up filled run without host syncs."""
        if self.holds_everything:
            for layer in range(self.index.num_layers):
                self._maybe_freeze_layer(layer)

    def step(self) -> None:
        """Called once per generated token (policy aging)."""
        self.policy.step()
        self._token += 1
        if self.governor is not None:
            self.governor.step()
        if self.predictor is not None:
            self.predictor.reset_token()

    def close(self) -> None:
        try:
            self.wait_prefetch()
        except ReadError:
            pass
        if self._pool is not None:
            self._pool.shutdown(wait=True)
        if self._guess_io:
            self._guess_io[0].close()
        self._guess_io = None
        self.banks.clear()
        if self.mirror is not None:
            self.mirror.close()
        self._bank_arrays.clear()
        self._host_arrays = []
        self._layer_rows = [None] * len(self._layer_rows)
        self._device_lut = [None] * len(self._device_lut)
        self.reader.close()


def _by_projection(bank: dict[str, mx.array]) -> dict[str, tuple]:
    """{'gate_proj.weight': w, ...} -> {'gate_proj': (weight, scales, biases or None,
    bias or None)}: the quantization's scales and biases, then the projection's own bias."""
    projs = dict.fromkeys(name.rsplit(".", 1)[0] for name in bank)
    return {
        p: tuple(bank.get(f"{p}.{part}") for part in ("weight", "scales", "biases", "bias"))
        for p in projs
    }


def _widened(comp, act_dtype: mx.Dtype | None) -> bool:
    """bf16/f16 scales and biases held as float32 (float32 activations on the CPU)."""
    return (
        act_dtype == mx.float32
        and comp.dtype in ("BF16", "F16")
        and not comp.name.endswith(".weight")
    )


def slot_memory_bytes(index: ExpertIndex, act_dtype: mx.Dtype | None) -> int:
    """Bytes one cached expert takes in memory (>= its bytes on disk)."""
    return sum(c.stride * (2 if _widened(c, act_dtype) else 1) for c in index.layers[0].components)


def _advise_random(fd: int) -> None:
    """Expert reads are random: kernel readahead would only inflate device bytes."""
    if hasattr(os, "posix_fadvise"):
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
        except OSError:
            pass


def parse_size(text: str | int) -> int:
    """'512M', '4G', '1.5GiB', '123456' -> bytes (`options.parse_bytes`; BadValueError,
    a ValueError, on anything else)."""
    from ssdmoe_tui.options import parse_bytes

    return parse_bytes(text)


def auto_budget(
    index: ExpertIndex,
    resident_bytes: int,
    min_bytes: int,
    sharers: int = 1,
    slot_bytes: int | None = None,
) -> int:
    """The one `auto` rule: half of what is left after the resident weights (the rest is
    the page cache's), split over `sharers` processes on this machine (the ranks of a
    distributed launch), never below `min_bytes` nor above every expert.

    `slot_bytes`: one expert's memory in the cache (`slot_memory_bytes`; default its bytes
    on disk). "Every expert" is counted in slots: counted in file bytes, a model whose
    slots widen their scales (float32 activations) got 99 % of its experts, so no layer
    ever froze and every layer kept its host sync."""
    avail = available_memory_bytes() - resident_bytes
    per_expert = index.expert_bytes if slot_bytes is None else max(slot_bytes, 1)
    all_experts = per_expert * index.num_experts * index.num_layers
    return int(min(all_experts, max(min_bytes, avail // (2 * max(1, sharers)))))

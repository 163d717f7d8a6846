"""Continuous batching: several sequences decode together, one forward pass per step.

A streamed engine gains more from batching than a resident one: B sequences in one
forward pass share each MoE layer's fixed cost (one router sync, the launches, the
Python) and read the union of their experts once (`StreamedSwitch` already takes any
number of rows: one host sync per layer, the union looked up, the misses read in one
batched call). The KV caches follow mlx-lm's `BatchGenerator`: per-sequence caches are
merged into mlx-lm's batch caches (`BatchKVCache`, left-padded, with the paddings kept
on the host too: batch_cache.py; `ArraysCache` rows for the recurrent state of the
hybrid models), extended as sequences join and filtered as they leave.

Continuous: `add` queues a sequence; each `step` runs one prefill chunk of the first
waiting sequence (alone, `Runner.begin`: the same code and arithmetic as one sequence),
then one decode step of the running ones. A sequence joins at the token boundary after
its prefill (and its first token, which the prefill's last step samples), so the
running ones stall for at most one prefill chunk (or that first token) per step. While
rows decode, those chunks are sized to a time budget per step (`join_budget_s`,
engine/run/join_chunks.py: from the last chunk's measured time) and hold at most
`join_chunk` tokens (`JOIN_CHUNK`). And a chunk pauses for the rows: at a MoE layer
boundary where its next layer would keep them waiting past the budget, their decode step
runs there (`_pause`, inside `Runner.outside_prefill`; events to `emit` at once), so a
token too costly for the budget (a streamed model's K experts a layer read from disk)
still stalls them about the budget; such a chunk is sized by its longest layer. A
sequence leaves when it ends
(end of sequence, max tokens, `should_stop`), and its KV cache is extracted for reuse.

K per sequence: rows are grouped by K and each group runs its own forward pass per
step (a row at K=2 beside rows at K=8 computes exactly what it computes alone at K=2;
the groups still share the expert cache, so the second group hits what the first read).
A row whose K is None follows the runner's live K (`Runner.set_k`), as one sequence does.

A group of one row runs on the row's own cache, so one sequence alone in the batch runs
exactly the single-sequence step. Rows that share one sampler object (greedy rows share
mlx-lm's `greedy_sampler`; unseeded rows with equal settings share one from
`sampling.sampler_for`) sample in one call on the batch's log-probs, as mlx-lm's
`BatchGenerator` does; a seeded row draws from its own key (`SeededSampler`), so its draws
do not depend on which sequences run beside it.

A step syncs to the host once: every group's tokens (and routing masses) come back in one
`mx.eval`. When every layer's experts are resident for good (no layer syncs its router)
the step pipelines as `BatchGenerator` and the single-sequence loop do: the next step is
built on this step's lazy tokens and queued before this step's tokens are read, so the
device never waits for the host's Python. A row then leaves with one more token fed to its
KV cache (counted in `covered_generated`), and a joining row enters the next step beside
the queued one (its input is its first token, already known).

`invariant=True` (the batch-invariant mode): every row is a group of its own, so each
row's matmuls run in the B = 1 shapes and its tokens equal its run alone on any device;
rows still share the expert cache (a step's second row hits what the first read) and
the step's one sync, not a forward pass.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable, Generator, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

import mlx.core as mx
from mlx_lm.models.cache import KVCache, RotatingKVCache

from ssdmoe_tui.engine.experts.device_memory import is_cuda
from ssdmoe_tui.engine.run.batch_cache import HostPaddedKVCache, HostPaddedRotatingKVCache
from ssdmoe_tui.engine.run.join_chunks import JOIN_BUDGET_S, JOIN_CHUNK, JoinSizer
from ssdmoe_tui.engine.run.runner import (
    Begun,
    Done,
    Pause,
    PrefillProgress,
    Runner,
    RunnerEvent,
    Snapshot,
    TokenEvent,
    _totals,
)
from ssdmoe_tui.engine.run.sampling import greedy
from ssdmoe_tui.options import env_choice

HOST_COPY_ENV = "SSDMOE_BATCH_HOST_COPY"
# A joining chunk that pauses for the rows is sized so its longest layer takes at most
# this share of the join's budget: a pause (before a layer that would overrun it) then
# keeps each stretch the rows wait within the budget.
LAYER_SHARE = 0.5


def host_read_way() -> str:
    """$SSDMOE_BATCH_HOST_COPY: how the loop reads each step's tokens (and routing
    masses). `auto` (the default): `pairs` on MLX-CUDA, the arrays themselves elsewhere;
    `off` reads the step's own arrays; `on` copies them on the CPU stream, queued with
    the step, and reads the copy; `pairs` copies them on the device into arrays of 8
    bytes (2 tokens) each, and reads those. Why: MLX-CUDA keeps arrays over 8 bytes in
    device memory and the host's read of one copies it synchronously (`Buffer::raw_ptr`):
    ~60 us with the device idle at B >= 4 on an H100 (`scripts/cuda_tolist_probe.py`)
    and 1.5-7.3 ms of a B = 8 step with the next step queued, while an array of up to 8
    bytes lives in MLX's managed small pool, which the host reads in place (5 us at
    B = 8 as pairs). Measured (H100, docs/benchmarks.md, 2026-12-07 twelfth session,
    every expert held, engine / BatchGenerator): `pairs` B = 4 / 8 0.860 / 0.886x
    against 0.823 / 0.709x `off`, the read 0.008 against 6.1 ms at B = 8; `on` moved the
    wait into the next step's queueing and lost (0.645x at B = 8, eleventh session). On
    the CPU and Metal (one memory) each way reads the same values, and `auto` adds no
    copies there."""
    way = env_choice(HOST_COPY_ENV, ("auto", "on", "off", "pairs"))
    if way == "auto":
        return "pairs" if is_cuda() else "direct"
    return {"off": "direct", "on": "cpu"}.get(way, way)


# values per array under `pairs`: MLX-CUDA's small pool holds arrays of up to 8 bytes
PAIR = 2


def host_copies(a: mx.array, way: str) -> list[mx.array]:
    """What the host reads of `a` (1-D, 4-byte values) the way given (`host_read_way`),
    queued lazily with it."""
    if way == "cpu":
        return [mx.add(a, mx.array(0, dtype=a.dtype), stream=mx.cpu)]
    if way == "pairs":
        zero = mx.array(0, dtype=a.dtype)
        return [mx.add(a[i : i + PAIR], zero) for i in range(0, int(a.shape[0]), PAIR)]
    return [a]


@dataclass
class SeqSpec:
    """One sequence to generate (what `Runner.stream` takes, plus its K and id)."""

    uid: Hashable
    prompt: Sequence[int]
    max_tokens: int = 256
    sampler: Callable[[mx.array], mx.array] | None = None  # None: greedy
    cache: list | None = None  # holds prompt[:reused_tokens]
    reused_tokens: int = 0
    k: int | None = None  # None: the runner's live K
    # None: the row is never stopped from outside (bench, `generate --batch`), and its
    # prefill keeps the fixed chunks of `generate` (a stop test sizes them by speed)
    should_stop: Callable[[], bool] | None = None
    trace_offset: int = 0  # trace-driven runs: the decode step of the trace this row starts at
    logits_processors: Sequence[Callable[[mx.array, mx.array], mx.array]] = ()  # penalties


@dataclass
class DecodeShare:
    """A row's share of the batch steps it ran in: each step's counters divided by the
    rows in it (so per-sequence figures add up to the batch's)."""

    hits: float = 0.0
    misses: float = 0.0
    bytes_read: float = 0.0
    device_bytes: float | None = 0.0
    read_s: float = 0.0
    router_sync_s: float = 0.0
    batch_rows: int = 0  # sum over its steps of the rows in the step (mean batch = / steps)
    steps: int = 0

    @staticmethod
    def part(d: Snapshot, rows: int) -> tuple:
        """One step's share of each of its `rows` (divided once a step, not once a row)."""
        dev = None if d.device_bytes is None else d.device_bytes / rows
        return (d.hits / rows, d.misses / rows, d.bytes_read / rows, dev,
                d.read_s / rows, d.router_sync_s / rows, rows)  # fmt: skip

    def add(self, part: tuple) -> None:
        """Add one step's `part` (from `part`)."""
        hits, misses, bytes_read, dev, read_s, sync_s, rows = part
        self.hits += hits
        self.misses += misses
        self.bytes_read += bytes_read
        if self.device_bytes is not None:
            self.device_bytes = None if dev is None else self.device_bytes + dev
        self.read_s += read_s
        self.router_sync_s += sync_s
        self.batch_rows += rows
        self.steps += 1


@dataclass
class _Row:
    spec: SeqSpec
    sampler: Callable
    gen: Generator[PrefillProgress, None, Begun] | None = None
    begun: Begun | None = None
    detok: Any = None
    tokens: list[int] = field(default_factory=list)
    cache: list | None = None  # its own cache, while its group has no batch cache
    dstart: float = 0.0
    prefill: Snapshot | None = None  # its prefill's work (counters at its end - at its start)
    trace_pos: int = 0
    fed: int = 0  # generated tokens its KV cache holds
    started: bool = False  # its prefill's first (work-free) progress event is out
    prefilled: int = 0  # prompt tokens its prefill has done (its last progress event)

    @property
    def uid(self) -> Hashable:
        return self.spec.uid


@dataclass
class _Pass:
    """One forward pass built (maybe still computing): the next token of each of its rows."""

    tokens: mx.array  # [rows], lazy until the step's sync
    mass: mx.array | None  # [rows] routing mass (None: not measured)
    k: int  # the K it ran at (`StepTimes.last_k`)
    # what the host reads of tokens and mass (`host_copies`); None: the arrays themselves
    host: tuple[list[mx.array], list[mx.array] | None] | None = None

    def wanted(self) -> list[mx.array]:
        """The arrays the step's sync waits for."""
        if self.host is None:
            return [self.tokens] if self.mass is None else [self.tokens, self.mass]
        toks, mass = self.host
        return [self.tokens, *toks, *(mass or ())]

    def read(self) -> tuple[list[int], list[float] | None]:
        """The tokens and masses on the host (after the sync)."""
        if self.host is None:
            toks, mass = [self.tokens], None if self.mass is None else [self.mass]
        else:
            toks, mass = self.host
        return _flat(toks), None if mass is None else _flat(mass)


def _flat(parts: list[mx.array]) -> list:
    """The host's values of `parts`, in order (one `tolist` for one part)."""
    return parts[0].tolist() if len(parts) == 1 else [v for p in parts for v in p.tolist()]


@dataclass
class _Group:
    """Rows decoding at one K; `cache` is their batch cache once there are two or more.
    `pending`: a pass already queued (pipelined) for `rows[:n]`, n = its length; rows
    after those joined since and have no token in it."""

    k: int
    rows: list[_Row] = field(default_factory=list)
    cache: list | None = None
    pending: _Pass | None = None
    _plan: list[tuple[Callable, list[int] | None]] | None = None  # samplers -> rows
    _windows: list[tuple[int, Any]] | None = None  # (row, its logits window) of rows with one

    def sample_plan(self) -> list[tuple[Callable, list[int] | None]]:
        """Rows grouped by sampler object (None: all rows, in order); made once per
        change of the rows, so a step's Python does not grow with them."""
        if self._plan is None:
            by: dict[int, tuple[Callable, list[int]]] = {}
            for i, row in enumerate(self.rows):
                by.setdefault(id(row.sampler), (row.sampler, []))[1].append(i)
            plan = list(by.values())
            self._plan = [(plan[0][0], None)] if len(plan) == 1 else plan
        return self._plan

    def windows(self) -> list[tuple[int, Any]]:
        """(row index, its logits processors' window) of the rows that have one; made
        once per change of the rows, as the plan."""
        if self._windows is None:
            self._windows = [
                (i, r.begun.window) for i, r in enumerate(self.rows) if r.begun.window is not None
            ]
        return self._windows

    def changed(self) -> None:
        self._plan = None
        self._windows = None


@dataclass
class BatchFigures:
    """What the batch did since it was made (the server's /v1/stats `batch`)."""

    steps: int = 0  # forward passes of decode rows (one per K group and step)
    rounds: int = 0  # decode steps (each syncs once, whatever its groups)
    row_tokens: int = 0  # tokens they produced (sum of the rows of each step)
    max_rows: int = 0
    decode_s: float = 0.0  # wall time in decode steps
    # ... of it: building the passes (the host's Python; a layer that syncs waits there
    # too), queueing the next (`mx.async_eval`: kernel launches on a GPU; on the CPU the
    # work itself), and waiting in the step's one sync (the device's work not yet done;
    # a host-bound pipelined step waits ~0 there), then handing the rows their tokens
    # (`deliver_s`: the tokens read to the host, `to_host_s` of it, and each row's event;
    # `leave_s` of it: rows that ended leaving, their caches split off and results built,
    # a step's cost only where rows end). scripts/batch_vs_mlx.py reports them; a step's
    # time outside all four is the loop's
    build_s: float = 0.0
    queue_s: float = 0.0
    sync_s: float = 0.0
    deliver_s: float = 0.0
    to_host_s: float = 0.0
    leave_s: float = 0.0
    prefill_chunk_s: float = 0.0  # wall time in the prefill chunks of joining rows
    max_stall_s: float = 0.0  # longest prefill chunk (+ first token) run between two decode steps
    join_pauses: int = 0  # decode steps run inside joining chunks (at a MoE layer boundary)
    requested_bytes: int = 0  # during decode steps
    union_experts: int = 0  # experts looked up per MoE layer, summed over the decode steps
    union_calls: int = 0

    def as_dict(self, rows_now: int, joining: int) -> dict:
        mib = self.requested_bytes / max(self.row_tokens, 1) / 2**20
        return {
            "rows": rows_now,
            "joining": joining,
            "max_rows": self.max_rows,
            "steps": self.steps,
            "mean_rows": round(self.row_tokens / self.steps, 3) if self.steps else 0.0,
            "aggregate_decode_tok_s": round(self.row_tokens / self.decode_s, 2)
            if self.decode_s > 0
            else 0.0,
            "requested_mib_per_token_per_sequence": round(mib, 4),
            "union_experts_per_layer": round(self.union_experts / self.union_calls, 3)
            if self.union_calls
            else None,
            "max_join_stall_s": round(self.max_stall_s, 4),
            "join_pauses": self.join_pauses,
        }


RowEvent = tuple[Hashable, RunnerEvent]


# a layer's cache class -> its batch class that keeps the row paddings on the host
_HOST_PADDED: dict[type, type] = {
    KVCache: HostPaddedKVCache,
    RotatingKVCache: HostPaddedRotatingKVCache,
}


def merge_caches(caches: list[list]) -> list:
    """Per-layer batch caches from per-sequence ones (mlx-lm's `merge` of each layer's
    cache class: KVCache -> left-padded BatchKVCache and RotatingKVCache ->
    BatchRotatingKVCache, as the batch_cache.py classes whose rows leave without a device
    read; ArraysCache -> stacked rows)."""
    return [
        _HOST_PADDED.get(type(layer[0]), type(layer[0])).merge(list(layer))
        for layer in zip(*caches, strict=True)
    ]


class BatchRunner:
    """Sequences that decode together on one Runner (see the module docstring)."""

    def __init__(
        self,
        runner: Runner,
        max_batch: int = 4,
        *,
        invariant: bool = False,
        join_chunk: int | None = JOIN_CHUNK,
        join_budget_s: float | None = JOIN_BUDGET_S,
    ) -> None:
        if max_batch < 1:
            raise ValueError("max_batch must be at least 1")
        if join_chunk is not None and join_chunk < 1:
            raise ValueError("join_chunk must be at least 1 token")
        if join_budget_s is not None and not 0 < join_budget_s < math.inf:
            raise ValueError("join_budget_s must be a positive number of seconds")
        self.runner = runner
        self.max_batch = max_batch
        self.invariant = invariant  # every row its own pass (B = 1 shapes)
        # a joining sequence's prefill chunks while rows decode (None: the prefill step)
        self.join_chunk = join_chunk
        # ... sized to a time budget per step (None: `join_chunk` tokens each)
        self._join = None if join_budget_s is None else JoinSizer(join_budget_s, join_chunk)
        self._waiting: deque[_Row] = deque()  # FIFO; the first prefills, one at a time
        # K -> its rows' group; invariant: (K, row) -> a group of that row alone
        self._groups: dict[Hashable, _Group] = {}
        self.figures = BatchFigures()
        self._host_read = host_read_way()
        self._eos = runner.eos_ids()
        # Called before a sequence leaves the queue to prefill: False keeps it waiting
        # (the service's KV budget); never asked while no sequence runs.
        self.admit: Callable[[SeqSpec], bool] = lambda spec: True
        # Where the rows' events of a step run inside a joining chunk go at once (the
        # server's loop streams them); None: they join the events `step` returns.
        self.emit: Callable[[list[RowEvent]], None] | None = None
        self._segment_t = 0.0  # when the rows last decoded, during a joining chunk
        self._segment_max = 0.0  # ... and the longest they waited in it so far
        self._layer_t = 0.0  # the chunk's last MoE layer boundary
        self._layer_max = 0.0  # its longest stretch between two
        self._pausing = False  # whether the chunk running may pause
        self._step_events: list[RowEvent] = []  # the events `step` will return

    # ------------------------------------------------------------------ queries
    @property
    def rows(self) -> int:
        """Sequences decoding now."""
        return sum(len(g.rows) for g in self._groups.values())

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    @property
    def idle(self) -> bool:
        return not self._waiting and not self._groups

    def running_caches(self) -> list[list]:
        """The KV caches in use (batch caches and single rows' caches), for memory accounting."""
        out = []
        for g in self._groups.values():
            out.extend([g.cache] if g.cache is not None else [r.cache for r in g.rows])
        head = self._waiting[0] if self._waiting else None
        if head is not None and head.gen is not None and head.spec.cache is not None:
            out.append(head.spec.cache)
        return out

    # ------------------------------------------------------------------ updates
    def add(self, spec: SeqSpec) -> None:
        """Queue a sequence; it prefills when the ones before it have joined."""
        self._waiting.append(_Row(spec, spec.sampler or greedy()))

    def step(self) -> list[RowEvent]:
        """One scheduling step: stopped rows leave, one prefill chunk of the first waiting
        sequence runs (while there is room), then one decode step per K group."""
        events: list[RowEvent] = []
        self._step_events = events
        self._leave_stopped(events)
        self._follow_live_k(events)
        t0 = self._segment_t = self._layer_t = time.perf_counter()
        self._segment_max = self._layer_max = 0.0
        paused0 = self.runner.paused_s
        self._pausing = False
        decoding = self.rows > 0  # a chunk stalls only the rows already decoding
        chunk = self._prefill_one(events)
        if chunk is not None:
            now = time.perf_counter()
            # the rows' steps run inside it left out
            self.figures.prefill_chunk_s += now - t0 - (self.runner.paused_s - paused0)
            # the longest the rows waited between two of their steps: the whole chunk, or
            # where it paused for them (`_pause`), its longest stretch
            stall = max(self._segment_max, now - self._segment_t)
            if decoding:
                self.figures.max_stall_s = max(self.figures.max_stall_s, stall)
                if self._join is not None and chunk > 0:
                    # a chunk that may pause is sized by its longest layer (at most
                    # LAYER_SHARE of the budget, so a pause lands within it); one that
                    # may not, by its whole time
                    layer = max(self._layer_max, now - self._layer_t)
                    self._join.measure(chunk, layer / LAYER_SHARE if self._pausing else stall)
        if self._groups:
            self._decode(sorted(self._groups.values(), key=lambda g: g.k), events)
        return events

    def _leave_stopped(self, events: list[RowEvent]) -> None:
        """Rows whose `should_stop` says so leave now, cancelled."""
        for group in list(self._groups.values()):
            stopped = [r for r in group.rows if r.spec.should_stop and r.spec.should_stop()]
            if stopped:
                self._leave_all(group, [(r, "cancelled") for r in stopped], events)

    def drain(self) -> Generator[RowEvent, None, None]:
        """Step until every sequence has ended (headless batches, tests)."""
        while not self.idle:
            yield from self.step()

    # ------------------------------------------------------------------ prefill / join
    def _prefill_one(self, events: list[RowEvent]) -> int | None:
        """Advance the first waiting sequence by one chunk: the prompt tokens it prefilled
        (0: its first token, the last prompt token's step), None if nothing ran."""
        if not self._waiting:
            return None
        row = self._waiting[0]
        if row.gen is None:
            if self.rows >= self.max_batch or (self.rows and not self.admit(row.spec)):
                return None
            spec = row.spec
            row.gen = self.runner.begin(
                spec.prompt,
                max_tokens=spec.max_tokens,
                sampler=row.sampler,
                cache=spec.cache,
                reused_tokens=spec.reused_tokens,
                should_stop=spec.should_stop,
                k=spec.k,
                reset_peaks=self.idle_decoding,
                logits_processors=spec.logits_processors,
                chunk_cap=self._join_cap,
                pauser=self._pauser,
            )
            row.trace_pos = spec.trace_offset
        routing = self.runner.sm.cache.routing
        if routing is not None:
            routing.rows = [row.trace_pos]  # its first token: the trace's step at its offset
        try:
            # Run to the next chunk or the first token: the progress before any work
            # (the first yield) and the end after the first token cost no step.
            while True:
                ev = next(row.gen)
                events.append((row.uid, ev))
                if ev.done == ev.total:  # the first token is out: Begun comes next
                    next(row.gen)
                    raise AssertionError("Runner.begin went on after its first token")
                done, row.prefilled = row.prefilled, ev.done
                if row.started:
                    return ev.done - done
                row.started = True  # that was the work-free first event: go on
        except StopIteration as stop:
            self._waiting.popleft()
            self._joined(row, stop.value, events)
        finally:
            if routing is not None:
                routing.rows = None
        return 0

    def _join_cap(self) -> int | None:
        """A joining sequence's chunk bound while rows decode (each chunk stalls them):
        the time budget's size (`JoinSizer`) or `join_chunk`; none while nothing does."""
        if not self.rows:
            return None
        return self.join_chunk if self._join is None else self._join.size()

    def _pauser(self) -> Pause | None:
        """A joining chunk's pause while rows decode under a time budget (None: it runs
        whole): the chunk stops at each MoE layer boundary to ask `_pause`."""
        if not self.rows or self._join is None:
            return None
        self._pausing = True
        return Pause(self._pause, self._join.budget_s)

    def _pause(self) -> None:
        """At a MoE layer boundary of a joining chunk: once the rows have waited the
        join's budget, run their decode step here (the chunk's own state set aside), so
        a long chunk stalls them about a budget and a layer's work instead of its whole
        time (issue 43: a token of a streamed model reads K experts a layer, more than
        the budget on a disk, so no chunk size alone bounds the stall)."""
        now = time.perf_counter()
        layer, self._layer_t = now - self._layer_t, now  # the layer just done, about the next
        self._layer_max = max(self._layer_max, layer)
        if not self._groups or self._join is None:
            return
        if now - self._segment_t + layer < self._join.budget_s:
            return  # the next layer fits in the budget too
        self._segment_max = max(self._segment_max, now - self._segment_t)
        events = self._step_events  # what `step` returns: the order rows' tokens keep
        with self.runner.outside_prefill():
            self._leave_stopped(events)  # rows stopped meanwhile leave first
            if self._groups:
                self.figures.join_pauses += 1
                self._decode(sorted(self._groups.values(), key=lambda g: g.k), events)
        if self.emit is not None and events:
            # at once, with what the step had before (a queued pass settled at its start
            # holds the rows' previous tokens): a turn gets its tokens in order
            self.emit(list(events))
            events.clear()
        self._segment_t = self._layer_t = time.perf_counter()

    @property
    def idle_decoding(self) -> bool:
        return not self._groups

    def _joined(self, row: _Row, begun: Begun, events: list[RowEvent]) -> None:
        runner = self.runner
        row.begun = begun
        row.cache = begun.cache
        row.detok = runner.sm.tokenizer.detokenizer
        if begun.token is None:  # stopped in prefill, or no tokens asked for
            events.append((row.uid, Done(runner.finish(begun, [], row.detok, "cancelled", 0))))
            return
        begun.decode_share = DecodeShare()
        row.prefill = Snapshot.take(runner.sm) - begun.start
        row.dstart = time.perf_counter()
        row.trace_pos += 1
        finish = self._emit(row, begun.token, events)
        if finish is not None:
            events.append((row.uid, Done(self._result(row, finish))))
            return
        self._attach(self._group_for(row, self._k(row)), row)

    def _group_for(self, row: _Row, k: int) -> _Group:
        key: Hashable = (k, id(row)) if self.invariant else k
        return self._groups.setdefault(key, _Group(k))

    def _follow_live_k(self, events: list[RowEvent]) -> None:
        """Rows without a K of their own move to the runner's live K when it changes
        (a group's queued pass is read first: its tokens are out before the move)."""
        live = self.runner.k
        for group in [g for g in self._groups.values() if g.k != live]:
            movers = [r for r in group.rows if r.spec.k is None]
            if movers and group.pending is not None:
                self._settle(group, events)
            movers = [r for r in movers if r in group.rows]  # settling may end some
            if movers:  # out together (one filter of the batch cache), then in one by one
                for row, cache in zip(movers, self._detach_rows(group, movers), strict=True):
                    row.cache = cache
                    self._attach(self._group_for(row, live), row)

    def _k(self, row: _Row) -> int:
        return self.runner.k if row.spec.k is None else row.spec.k

    def _attach(self, group: _Group, row: _Row) -> None:
        group.changed()
        if not group.rows:
            group.rows.append(row)
            return
        if group.cache is None:  # one row so far: merge the two
            first = group.rows[0]
            group.cache = merge_caches([first.cache, row.cache])
            first.cache = None
        else:
            new = merge_caches([row.cache])
            for mine, theirs in zip(group.cache, new, strict=True):
                mine.extend(theirs)
        row.cache = None
        group.rows.append(row)

    def _detach_rows(self, group: _Group, leaving: list[_Row]) -> list[list]:
        """Take `leaving` out of their group together; returns each one's own KV cache.
        Together: the batch cache is filtered once a layer for all of them, not once a
        row and layer. The KV layers read nothing from the device for it (their paddings
        are kept on the host, batch_cache.py, sliding-window layers' too)."""
        gone = [group.rows.index(r) for r in leaving]
        out_idx = set(gone)
        group.rows[:] = [r for j, r in enumerate(group.rows) if j not in out_idx]
        group.changed()
        pend = group.pending
        if pend is not None:
            n = int(pend.tokens.shape[0])
            kept = [j for j in range(n) if j not in out_idx]
            if len(kept) < n:  # their tokens in the queued pass are dropped (their
                # caches hold the input); the host reads the rest the loop's way
                if not kept:
                    group.pending = None
                else:
                    keep = mx.array(kept, dtype=mx.uint32)
                    toks = pend.tokens[keep]
                    mass = None if pend.mass is None else pend.mass[keep]
                    group.pending = _Pass(toks, mass, pend.k, self._host(toks, mass))
        if group.cache is None:  # one row, its own cache
            caches = [r.cache for r in leaving]
        else:
            caches = [[c.extract(i) for c in group.cache] for i in gone]
            left = [j for j in range(len(group.rows) + len(gone)) if j not in out_idx]
            if len(left) == 1:  # back to the single-sequence step
                group.rows[0].cache = [c.extract(left[0]) for c in group.cache]
                group.cache = None
            elif left:
                for c in group.cache:
                    c.filter(left)
            else:
                group.cache = None
        for r in leaving:
            r.cache = None
        if not group.rows:
            for key, g in list(self._groups.items()):
                if g is group:
                    del self._groups[key]
        return caches

    # ------------------------------------------------------------------ decode
    def _decode(self, groups: list[_Group], events: list[RowEvent]) -> None:
        """One decode step: a forward pass per group, one token per row, one host sync."""
        sm = self.runner.sm
        times = sm.times
        u0, c0 = times.union_experts, times.union_calls
        # live: device bytes read from /proc at most every LIVE_IO_AGE_S, not twice a step
        # (a pread and a parse, ~50 us, the largest host cost a step had beyond mlx-lm's)
        before = Snapshot.take(sm, live=True)
        pipeline = self.runner._can_pipeline()
        ready: list[tuple[_Group, list[_Row], _Pass]] = []
        t_build, queued = before.t, 0.0
        for group in groups:
            rows = list(group.rows)
            cur, group.pending = group.pending, None
            if cur is None:
                cur = self._build(group, rows, None)
                if not pipeline:
                    # A streamed layer may reuse these slots in the next group's pass:
                    # its reads of them must be done first.
                    mx.eval(cur.tokens)
            n = int(cur.tokens.shape[0])
            if pipeline and any(len(r.tokens) + 1 < r.spec.max_tokens for r in rows):
                # Nothing syncs a layer: queue the next pass on these lazy tokens (and the
                # first tokens of rows that joined since) before reading them.
                nxt = (
                    cur.tokens
                    if n == len(rows)
                    else mx.concatenate(
                        [cur.tokens, mx.array([r.tokens[-1] for r in rows[n:]], dtype=mx.uint32)]
                    )
                )
                group.pending = self._build(group, rows, nxt)
                t_queue = time.perf_counter()
                mx.async_eval(group.pending.wanted())
                queued += time.perf_counter() - t_queue
            ready.append((group, rows[:n], cur))
        fig = self.figures
        fig.build_s += time.perf_counter() - t_build - queued
        fig.queue_s += queued
        self._deliver(ready, before, times.union_experts - u0, times.union_calls - c0, events)

    def _build(self, group: _Group, rows: list[_Row], inputs: mx.array | None) -> _Pass:
        """Build one forward pass of `rows` (inputs: their last tokens) and its sampling;
        lazy where no layer syncs."""
        runner, sm = self.runner, self.runner.sm
        if inputs is None:
            inputs = mx.array([r.tokens[-1] for r in rows], dtype=mx.uint32)
        runner._use_k(group.k)
        sm.cache.step()
        routing = sm.cache.routing
        if routing is not None:
            routing.rows = [r.trace_pos for r in rows]
        cache = group.cache if group.cache is not None else rows[0].cache
        try:
            logits = sm.model(inputs[:, None], cache=cache)[:, -1, :]
        finally:
            if routing is not None:
                routing.rows = None
        for row in rows:
            row.fed += 1
            row.trace_pos += 1
        meter = sm.routing_mass
        mass = meter.take() if meter is not None else None
        windows = group.windows()
        if windows:  # penalties: each row's own processors over its own tokens
            parts = [logits[i : i + 1] for i in range(len(rows))]
            for i, window in windows:
                parts[i] = window(inputs[i : i + 1], parts[i])
            logits = mx.concatenate(parts)
        logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
        plan = group.sample_plan()
        if len(plan) == 1:
            toks = plan[0][0](logprobs).reshape(-1)
        else:
            parts, order = [], []
            for sampler, idx in plan:
                assert idx is not None
                sel = logprobs[idx[0] : idx[0] + 1] if len(idx) == 1 else logprobs[mx.array(idx)]
                parts.append(sampler(sel).reshape(-1))
                order.extend(idx)
            inverse = [0] * len(order)
            for pos, i in enumerate(order):
                inverse[i] = pos
            toks = mx.concatenate(parts)[mx.array(inverse)]
        toks = toks.astype(mx.uint32)
        return _Pass(toks, mass, sm.times.last_k, self._host(toks, mass))

    def _host(
        self, toks: mx.array, mass: mx.array | None
    ) -> tuple[list[mx.array], list[mx.array] | None] | None:
        """What the host reads of a pass's tokens and masses (`_Pass.host`)."""
        way = self._host_read
        if way == "direct":
            return None
        return host_copies(toks, way), None if mass is None else host_copies(mass, way)

    def _settle(self, group: _Group, events: list[RowEvent]) -> None:
        """Read a group's queued pass now (its tokens go out; nothing new is queued)."""
        cur, group.pending = group.pending, None
        if cur is not None:
            rows = group.rows[: int(cur.tokens.shape[0])]
            self._deliver([(group, rows, cur)], Snapshot.take(self.runner.sm), 0, 0, events)

    def _deliver(
        self,
        ready: list[tuple[_Group, list[_Row], _Pass]],
        before: Snapshot,
        union: int,
        union_calls: int,
        events: list[RowEvent],
    ) -> None:
        """The step's one host sync, then each row's token out (and the rows that end)."""
        t_sync = time.perf_counter()
        mx.eval([a for _, _, p in ready for a in p.wanted()])
        after = Snapshot.take(self.runner.sm, live=True)
        d = after - before
        rows_now = sum(len(rows) for _, rows, _ in ready)
        fig = self.figures
        fig.sync_s += after.t - t_sync
        fig.rounds += 1
        fig.steps += len(ready)
        fig.row_tokens += rows_now
        fig.max_rows = max(fig.max_rows, self.rows)
        fig.decode_s += d.t
        fig.requested_bytes += d.bytes_read
        fig.union_experts += union
        fig.union_calls += union_calls
        # per row: only what its turn needs (its token, text piece and live figures);
        # the step's share is divided once, and its clock (the snapshot's) read once
        part = DecodeShare.part(d, rows_now)
        now = after.t
        emit = self._emit
        for group, rows, p in ready:
            t_host = time.perf_counter()
            toks, masses = p.read()
            fig.to_host_s += time.perf_counter() - t_host
            k = p.k
            ending: list[tuple[_Row, str]] = []
            for i, row in enumerate(rows):
                begun = row.begun
                stats = begun.stats
                stats.k_per_token.append(k)
                if stats.mass_log is not None:
                    stats.mass_log.append_value(None if masses is None else float(masses[i]))
                begun.decode_share.add(part)
                finish = emit(row, toks[i], events, now)
                if finish is not None:
                    ending.append((row, finish))
            if ending:
                t_leave = time.perf_counter()
                self._leave_all(group, ending, events)
                fig.leave_s += time.perf_counter() - t_leave
        fig.deliver_s += time.perf_counter() - now

    def _emit(
        self, row: _Row, tok: int, events: list[RowEvent], now: float | None = None
    ) -> str | None:
        """Record a generated token, yield its event; the finish reason if it was the last.
        `now`: the step's clock (one read for all its rows), else read here."""
        row.tokens.append(tok)
        stats = row.begun.stats
        if tok in self._eos:
            piece, finish = "", "stop"
        else:
            detok = row.detok
            detok.add_token(tok)
            piece, finish = detok.last_segment, None
        stats.generated_tokens = len(row.tokens)
        stats.decode_s = (time.perf_counter() if now is None else now) - row.dstart
        _share_into(stats, row)
        events.append((row.uid, TokenEvent(tok, piece, stats)))
        if finish is None and len(row.tokens) >= row.spec.max_tokens:
            finish = "length"
        return finish

    def _leave_all(
        self, group: _Group, ending: list[tuple[_Row, str]], events: list[RowEvent]
    ) -> None:
        """Rows of one group that end at once leave it together (`_detach_rows`), each
        with its Done event, in their order."""
        caches = self._detach_rows(group, [r for r, _ in ending])
        for (row, finish), cache in zip(ending, caches, strict=True):
            row.begun.cache = cache
            events.append((row.uid, Done(self._result(row, finish))))

    def _result(self, row: _Row, finish: str):
        if row.cache is not None:  # never attached (ended on its first token)
            row.begun.cache = row.cache
            row.cache = None
        row.begun.stats.decode_s = time.perf_counter() - row.dstart
        _share_into(row.begun.stats, row)
        return self.runner.finish(row.begun, row.tokens, row.detok, finish, row.fed)


def _share_into(stats, row: _Row) -> None:
    """The row's decode figures (its share of the steps) and turn totals (its own prefill
    plus that share)."""
    s: DecodeShare = row.begun.decode_share
    stats.decode_hits, stats.decode_misses = round(s.hits), round(s.misses)
    stats.decode_requested_bytes = round(s.bytes_read)
    stats.decode_device_bytes = None if s.device_bytes is None else round(s.device_bytes)
    _totals(stats, row.prefill)
    stats.hits += stats.decode_hits
    stats.misses += stats.decode_misses
    stats.requested_bytes += stats.decode_requested_bytes
    stats.read_s += s.read_s
    stats.router_sync_s += s.router_sync_s
    if stats.device_bytes is not None:
        stats.device_bytes = (
            None
            if stats.decode_device_bytes is None
            else stats.device_bytes + stats.decode_device_bytes
        )

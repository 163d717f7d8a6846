"""Streamed replacement for mlx-lm's `SwitchGLU` / `SwitchMLP` (the stacked experts).

It keeps mlx-lm's call signature `(x, indices)` and arithmetic: the same
`gather_qmm` calls with the same shapes and the same sort decision, but over the
cache's slot arrays with slot ids instead of the full expert stacks. The router
runs unchanged in the parent block, so routing, scores and the shared expert are
mlx-lm's own code. The only extra step is a host sync of the router indices, which
tells us which experts to read.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from ssdmoe_tui.engine.experts.cache import ExpertCache
from ssdmoe_tui.engine.model import qmm_guard
from ssdmoe_tui.engine.model.page_ahead import PageAhead
from ssdmoe_tui.engine.model.prestage import Prestage, Prestaged, combine, gather_rows
from ssdmoe_tui.engine.model.timeline import Timeline
from ssdmoe_tui.options import env_choice


@dataclass(frozen=True)
class ProjQuant:
    group_size: int
    bits: int
    mode: str


@dataclass
class StepTimes:
    """Accumulated seconds, split the way `ssdmoe bench` reports them."""

    router_sync_s: float = 0.0  # waiting for router indices (includes earlier layers' compute)
    calls: int = 0
    grouped_calls: int = 0  # calls whose expert union exceeded the cache (processed in groups)
    last_k: int = 0
    # decode passes (one token per sequence) that synced: experts looked up per layer
    # (the union over the batch's rows), summed, and how many such layer calls
    union_experts: int = 0
    union_calls: int = 0
    # layer calls whose hits were queued before their misses were read (the pipeline)
    pipelined_calls: int = 0
    staged_calls: int = 0  # many-row calls computed from a device copy of their slots
    # staged calls that used a copy queued ahead of their sync (prestage.py), and the
    # union's experts they took from it and gathered after it
    prestaged_calls: int = 0
    prestaged_experts: int = 0
    prestage_missed_experts: int = 0
    readahead_calls: int = 0  # prefill chunks whose next layer's union was read ahead
    timeline: Timeline | None = None  # per-layer decode rows while on (model/timeline.py)


class PrefillStopped(Exception):
    """A prefill chunk stopped between two MoE layers because its request was stopped
    (`PrefillGate`). The layers before have written the chunk into their caches: the
    runner undoes that (engine/run/prefill_stop.py)."""


@dataclass
class PrefillGate:
    """The stop test every MoE layer asks during a prefill chunk, so a client that leaves
    during a long chunk frees the engine after one layer instead of the whole chunk.

    `check` is set by the runner around one chunk's forward pass only (None otherwise:
    decode and a batch's other rows never see it). A layer that syncs anyway asks after
    its host sync; a frozen layer (no sync of its own) first evaluates its router, which
    adds one sync per MoE layer per chunk and no kernel. One gate per model, shared by
    its switches; a distributed switch never asks (the ranks must stop in step)."""

    check: Callable[[], bool] | None = None
    # Frozen layers sync only to ask: worth it when the chunk is long. False when the
    # runner expects the chunk within `prefill_stop.FROZEN_ASK_ABOVE_S` (a GPU's chunks):
    # the stop is then asked at the chunk's end, with no sync added per layer.
    frozen_too: bool = True
    # The chunk's place in its prompt's prefill (0: the first) and its tokens, set by the
    # runner around every chunk's forward pass (None and 0 outside one): `auto` moves a
    # long chunk's pages ahead in a large first chunk only (page_ahead.py says why).
    chunk: int | None = None
    chunk_tokens: int = 0


_NO_SLOTS = np.zeros(0, dtype=np.int64)
PIPELINE_ENV = "SSDMOE_PIPELINE"
PIPELINE_MODES = ("auto", "on", "off", "full", "compact")
# Rows (tokens x K) below mlx-lm's sort threshold: matrix-vector work, where a second call
# costs little. At and above it (prefill chunks, wide batches) a call's work grows with
# its rows and the masked calls would double it, so those layers read, then compute.
PIPELINE_MAX_ROWS = 63


def pipeline_mode() -> str:
    """$SSDMOE_PIPELINE: `auto` (default: on a GPU, with full-shape calls; off on the
    CPU: `_pipelines`), `on` (pipelined: full-shape calls on a GPU, compact on the CPU),
    `off` (read the misses, then compute: the serial layer), `full` or `compact` (on,
    with the partial calls' shape forced: tests run both on the CPU)."""
    return env_choice(PIPELINE_ENV, PIPELINE_MODES)


STAGE_ENV = "SSDMOE_PREFILL_STAGE"
STAGE_MODES = ("auto", "on", "off", "ahead", "migrate")


def prefill_stage_mode() -> str:
    """$SSDMOE_PREFILL_STAGE: `auto` (default), `on`, `off` (see `stages`), `ahead`
    (staged, and each layer's copy queued on a second stream while the layer before
    computes: prestage.py), `migrate` (staged in place, each layer's rows moved to the
    GPU by page migration while the layer before computes, in every long chunk:
    page_ahead.py). `auto` under MLX-CUDA `host` placement moves them in a prompt's first
    chunk only, if it has `AUTO_MIN_TOKENS` or more (measured: page_ahead.py)."""
    return env_choice(STAGE_ENV, STAGE_MODES)


def stages(mode: str, placement: str) -> bool:
    """Whether a long chunk (`LONG_CHUNK_ROWS`, a long prompt's prefill) copies the
    slots it uses into an array of its own before computing. `auto`: where the slots sit
    in host memory (MLX-CUDA `host` placement): a chunk's matmuls would otherwise read
    every expert over the bus once per tile (20 tok/s against 1,298 resident for a
    4096-token prompt on the H200, issue 29); the copy reads each over the bus once and
    the matmuls then read device memory. Elsewhere the slots are already where the
    compute reads (CPU, managed, Metal): nothing to gain. `on` forces it (tests on the
    CPU: the same arithmetic, only the arrays differ); `ahead` as `on`, the copies queued
    a layer early (prestage.py); `migrate` as `on`, the rows' pages moved a layer early
    (page_ahead.py)."""
    if mode == "auto":
        return placement == "host"
    return mode in ("on", "ahead", "migrate")


def computed_from(cache) -> str:  # noqa: ANN001 - an ExpertCache, or a test's stand-in
    """Where the layers' matmuls read the slots: "device" with a mirror (whatever the
    placement: engine/experts/mirror.py), "host" for `device` placement whose mirror is
    off ($SSDMOE_SLOT_MIRROR=off), else the placement applied."""
    if getattr(cache, "mirror", None) is not None:
        return "device"
    placement = getattr(getattr(cache, "placement", None), "placement", "none")
    return "host" if placement == "device" else placement


READAHEAD_ENV = "SSDMOE_PREFILL_READAHEAD"
# A long chunk: at least this many rows (tokens x K). It reads the next layer's predicted
# union ahead (its union is most of the layer, so the prediction wastes few reads; a
# chat turn's few tokens would read guesses into the cache), and under `host` placement
# it computes from a device copy of its slots (many rows per expert: a kernel would read
# each expert over the bus many times; a batch's decode step reads each about once).
LONG_CHUNK_ROWS = 1024


READAHEAD_MODES = ("auto", "on", "off")


def readahead_on() -> bool:
    """$SSDMOE_PREFILL_READAHEAD: `auto` (default: on under MLX-CUDA, where a cold
    prefill waits on the disk between layers, and wherever staging runs `ahead`, which
    copies what it read, or `migrate`, which moves it; off on the CPU otherwise, where
    it measured no gain: docs/benchmarks.md), `on`, `off`."""
    from ssdmoe_tui.engine.experts.device_memory import is_cuda

    text = env_choice(READAHEAD_ENV, READAHEAD_MODES)
    if text == "auto":
        return is_cuda() or prefill_stage_mode() in ("ahead", "migrate")
    return text == "on"


def _compact(mode: str) -> bool:
    """Partial calls of their own rows only: exact on the CPU (a row's arithmetic there
    does not depend on the call's shape); on MLX-CUDA the shape picks the kernel."""
    if mode in ("auto", "on"):
        return _on_cpu()
    return mode == "compact"


def _on_cpu() -> bool:
    return mx.default_device().type == mx.cpu


def _pipelines(mode: str) -> bool:
    """`auto`: on a GPU only. On the 2-core development VM (loaded by other jobs) the
    pipelined layer decoded slower than the serial one in three of four bench-quick runs
    (trace rows: 0.89, 0.83, 1.24, 0.76x of serial by the wall clock): the overlap finds
    no idle core there, and the split calls cost. The H200 decides the GPU
    (scripts/gpu_pipeline.sh)."""
    if mode == "auto":
        return not _on_cpu()
    return mode != "off"


def unused_row(size: int, used: np.ndarray, avoid: np.ndarray) -> int:
    """The lowest row of a bank of `size` rows that no row of a call uses and that is not
    in `avoid` (being read meanwhile); a used row when none is left (a bank this small
    only exists in tests: its call is then exact for the other rows, but the used row's
    group grows)."""
    taken = np.union1d(used, avoid)
    free = np.setdiff1d(np.arange(min(size, len(taken) + 1)), taken)
    return int(free[0]) if len(free) else int(np.min(used))


def dense_unique(ids: np.ndarray) -> np.ndarray:
    """`np.unique(ids)` for small non-negative integers (expert or slot ids), in ids'
    dtype, by counting instead of sorting: a 4,096-token chunk's 32,768 router indices
    took 0.48-0.57 ms to sort on the 2-core VM and 0.07 ms to count, on the host while the
    device waits for the layer."""
    flat = ids.reshape(-1)
    return np.flatnonzero(np.bincount(flat.astype(np.intp, copy=False))).astype(flat.dtype)


def dense_rank(ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(`used`, `rank`): `used` = dense_unique(ids), and each id's position in `used`,
    shaped as `ids`: `np.searchsorted(np.unique(ids), ids)` without the two sorts (a
    long chunk's 32,768 slot ids: 0.18 against 2.4 ms on the 2-core VM)."""
    flat = ids.reshape(-1)
    present = np.bincount(flat.astype(np.intp, copy=False)) > 0
    order = np.cumsum(present) - 1  # an id's rank among the ids present
    used = np.flatnonzero(present).astype(flat.dtype)
    return used, order[flat].reshape(ids.shape)


def _combine(parts: list[tuple[mx.array, np.ndarray]], y: mx.array | None = None) -> mx.array:
    """Each row from its own call: `parts` are (y, rows taken from it) in order."""
    for yb, mine in parts:
        y = yb if y is None else mx.where(mx.array(mine)[..., None], yb, y)
    assert y is not None
    return y


def _gather_sort(x, indices):
    *_, m = indices.shape
    indices = indices.flatten()
    order = mx.argsort(indices)
    inv_order = mx.argsort(order)
    return x.flatten(0, -3)[order // m], indices[order], inv_order


def _scatter_unsort(x, inv_order, shape=None):
    x = x[inv_order]
    if shape is not None:
        x = mx.unflatten(x, 0, shape)
    return x


class StreamedSwitch(nn.Module):
    """Experts of one MoE layer, computed from cache slots. Holds no parameters."""

    def __init__(
        self,
        layer: int,
        cache: ExpertCache,
        kind: str,
        activation: nn.Module,
        quant: dict[str, ProjQuant],
        times: StepTimes,
    ) -> None:
        super().__init__()
        self.activation = activation  # parameter-free module (SwiGLU, ReLU2, GELU)
        # Plain attributes (not arrays/modules): invisible to parameters()/load_weights.
        object.__setattr__(self, "_layer", layer)
        object.__setattr__(self, "_cache", cache)
        object.__setattr__(self, "_kind", kind)
        object.__setattr__(self, "_quant", quant)
        object.__setattr__(self, "_times", times)
        object.__setattr__(self, "_num_experts", cache.index.num_experts)
        object.__setattr__(self, "_lut", np.zeros(cache.index.num_experts, dtype=np.int64))
        object.__setattr__(self, "_predict", None)  # next MoE block's router, for prefetch
        object.__setattr__(self, "_lookahead", None)  # the same, for prefill chunks
        object.__setattr__(self, "_mass", None)  # routing_mass.RoutingMass, fed by the gate probe
        object.__setattr__(self, "_routing", None)  # TraceRouting of a trace-driven run
        object.__setattr__(self, "_gate", PrefillGate())  # the model's shared one: set_gate
        object.__setattr__(self, "_capture", False)  # routing_predictor asks for indices only
        object.__setattr__(self, "_prestage", None)  # Prestage (`ahead`) or PageAhead
        mode = pipeline_mode()  # read once: a bad value fails the load, in one line
        object.__setattr__(self, "_pipe", _pipelines(mode))
        object.__setattr__(self, "_compact", _compact(mode))
        object.__setattr__(self, "_stage", stages(prefill_stage_mode(), computed_from(cache)))
        pad = qmm_guard.pads(qmm_guard.pad_mode())
        object.__setattr__(self, "_qmm_guards", qmm_guard.Guards() if pad else None)

    def set_gate(self, gate: PrefillGate) -> None:
        """Ask `gate` at this layer during prefill chunks (the loader shares one per model)."""
        object.__setattr__(self, "_gate", gate)

    def set_prestage(self, prestage: Prestage | PageAhead | None) -> None:
        """Stage long chunks a layer ahead through `prestage` (the loader shares one per
        model under SSDMOE_PREFILL_STAGE=ahead, prestage.py, or its pages moved ahead
        under `migrate` and `auto` on MLX-CUDA host slots, page_ahead.py); None: staged in
        place."""
        object.__setattr__(self, "_prestage", prestage)

    @property
    def prestage(self) -> Prestage | PageAhead | None:
        """What `set_prestage` installed (the bench reads the page mover's counts)."""
        return self._prestage

    def set_routing(self, routing) -> None:
        """Look up the trace's ids for this layer (engine/policy/trace_routing.py)."""
        object.__setattr__(self, "_routing", routing)

    def set_predictor(self, predict) -> None:
        """`predict(x) -> indices`: the next MoE layer's routing applied to this layer's input."""
        object.__setattr__(self, "_predict", predict)

    def set_lookahead(self, predict) -> None:
        """The next MoE layer's routing, for prefill chunks (read ahead), whether or not
        decode prefetches; unused where `readahead_on` says off."""
        object.__setattr__(self, "_lookahead", predict if readahead_on() else None)

    def set_mass_meter(self, meter) -> None:
        """`meter.kept(layer, indices)` notes the experts run (routing_mass.py); None: off."""
        object.__setattr__(self, "_mass", meter)

    def _proj(
        self, name: str, x: mx.array, idx: mx.array, sorted_indices: bool, arrays: dict
    ) -> mx.array:
        weight, scales, biases, bias = arrays[name]
        q = self._quant[name]
        y = mx.gather_qmm(
            x,
            weight,
            scales,
            biases,
            rhs_indices=idx,
            transpose=True,
            group_size=q.group_size,
            bits=q.bits,
            mode=q.mode,
            sorted_indices=sorted_indices,
        )
        if bias is not None:  # the projection's own bias (gpt-oss), as mlx-lm adds it
            y = y + mx.expand_dims(bias[idx], -2)
        return y

    def _slack(self, name: str, x: mx.array, idx: mx.array, arrays: dict) -> mx.array:
        """`x` with room behind it where MLX-CUDA's tiled kernel reads a row past its end
        (qmm_guard.py); `x` itself elsewhere (the CPU, gather_qmv's calls)."""
        guards = self._qmm_guards
        if guards is None:
            return x
        rows = idx.size * x.shape[-2]

        def tiled() -> bool:
            q = self._quant[name]
            return qmm_guard.tiled(x, rows, arrays[name][0].shape[-2], q.bits, q.group_size, q.mode)

        return guards.apply((name, x.shape, x.dtype, rows), x, tiled)

    def _experts(self, x: mx.array, idx: mx.array, do_sort: bool, arrays: dict) -> mx.array:
        if self._kind == "glu":
            x = self._slack("up_proj", x, idx, arrays)  # one copy serves up and gate
            x_up = self._proj("up_proj", x, idx, do_sort, arrays)
            x_gate = self._proj("gate_proj", x, idx, do_sort, arrays)
            h = self._slack("down_proj", self.activation(x_up, x_gate), idx, arrays)
            return self._proj("down_proj", h, idx, do_sort, arrays)
        x = self._proj("fc1", self._slack("fc1", x, idx, arrays), idx, do_sort, arrays)
        x = self._slack("fc2", self.activation(x), idx, arrays)
        return self._proj("fc2", x, idx, do_sort, arrays)

    def _run(
        self, x: mx.array, slot_idx: mx.array, shape, arrays: dict, do_sort: bool | None = None
    ) -> mx.array:
        """mlx-lm's SwitchGLU arithmetic over `arrays` (projection -> weight, scales,
        biases: a slot bank, or a frozen layer's own rows of one) at rows `slot_idx`."""
        if do_sort is None:
            do_sort = slot_idx.size >= 64  # mlx-lm's rule, so kernels match
        inv_order = None
        idx = slot_idx
        if do_sort:
            x, idx, inv_order = _gather_sort(x, slot_idx)
        y = self._experts(x, idx, do_sort, arrays)
        if do_sort:
            y = _scatter_unsort(y, inv_order, shape)
        return y.squeeze(-2)

    def _run_slots(
        self, x: mx.array, slots: np.ndarray, do_sort: bool | None = None, stage: bool = False
    ) -> mx.array:
        """`slots`: global slot ids, shaped like the router's indices (..., K).

        One bank: mlx-lm's call as is. Several: one call per bank with mlx-lm's shapes and
        sort rule unchanged, the rows of other banks pointed at an unused row of this bank,
        and each row's result taken from its own bank's call. Splitting the rows into
        smaller calls instead changes which MLX-CUDA kernel runs (measured: tokens differ
        from mlx-lm's on the H200); keeping the shapes keeps every row's arithmetic."""
        cache = self._cache
        if stage:
            return self._run_staged(x, slots, do_sort)
        if cache.num_banks == 1:  # the common case: slot ids are the rows
            return self._run(
                x, mx.array(slots.astype(np.uint32)), slots.shape, cache.bank_arrays(0), do_sort
            )
        return _combine(self._masked_calls(x, slots, None, _NO_SLOTS, do_sort))

    def _run_staged(self, x: mx.array, slots: np.ndarray, do_sort: bool | None) -> mx.array:
        """mlx-lm's one call over a copy of the slots the rows use (`stages`): the copy,
        rows in slot order, is made by the device, so it lands in device memory, and
        every row's arithmetic is the call's as on the slots (one call of mlx-lm's shape,
        whatever the banks)."""
        self._times.staged_calls += 1
        used, rank = dense_rank(slots)
        idx = mx.array(rank.astype(np.uint32))
        return self._run(x, idx, slots.shape, self._gather_slots(used), do_sort)

    def _gather_slots(self, used: np.ndarray) -> dict[str, tuple]:
        """Projection -> the rows of slots `used` (ascending), copied by the device
        (`prestage.gather_rows`): from the host banks when staging ahead (whose long
        chunks leave a mirror unsynced), else from what compute reads."""
        cache = self._cache
        of = cache.bank_arrays if self._prestage is None else cache.host_bank_arrays
        return gather_rows(of, cache.bank_slots, used)

    def _run_prestaged(
        self, x: mx.array, host: np.ndarray, uniq: np.ndarray, pre: Prestaged
    ) -> mx.array:
        """`_run_staged` over the copy of this layer's predicted rows queued at the start
        of its call (prestage.py): the union's experts it holds come from it, the others
        are gathered now and appended; one call of mlx-lm's shape over both."""
        times = self._times
        times.staged_calls += 1
        times.prestaged_calls += 1
        lacking = uniq[~np.isin(uniq, pre.experts)]
        times.prestaged_experts += len(uniq) - len(lacking)
        times.prestage_missed_experts += len(lacking)
        extra = None
        if len(lacking):
            # slots in ascending order, as `_gather_slots` lays its rows out
            slots = self._lut[lacking]
            order = np.argsort(slots, kind="stable")
            lacking = lacking[order]
            extra = self._gather_slots(slots[order])
        arrays, pos = combine(pre, lacking, extra, self._num_experts)
        idx = mx.array(pos[host].astype(np.uint32))
        return self._run(x, idx, host.shape, arrays)

    def _masked_calls(
        self,
        x: mx.array,
        slots: np.ndarray,
        member: np.ndarray | None,
        avoid: np.ndarray,
        do_sort: bool | None = None,
    ) -> list[tuple[mx.array, np.ndarray]]:
        """The rows of `slots` in `member` (bool, slots' shape; None: all), one call per
        bank in mlx-lm's own shape and sort rule: every other row points at a row of that
        bank that no member row uses and that is not in `avoid` (global slots being read
        meanwhile), so each member row's group, and with it its kernel and arithmetic,
        is the one of mlx-lm's call. Returns (y, rows taken from it) per call."""
        cache = self._cache
        bank, row = np.divmod(slots, cache.bank_slots)
        if member is None:
            member = np.ones(slots.shape, dtype=bool)
        out = []
        for b in np.unique(bank[member]):
            mine = member & (bank == b)
            if mine.all():
                idx = row
            else:
                ab, ar = np.divmod(avoid, cache.bank_slots)
                size = next(iter(cache.banks[int(b)].values())).shape[0]
                idx = np.where(mine, row, unused_row(size, row[mine], ar[ab == b]))
            y = self._run(x, mx.array(idx.astype(np.uint32)), slots.shape,
                          cache.bank_arrays(int(b)), do_sort)  # fmt: skip
            out.append((y, mine))
        return out

    def _compact_calls(
        self, x: mx.array, slots: np.ndarray, member: np.ndarray
    ) -> list[tuple[mx.array, np.ndarray]]:
        """One token's rows in `member` as a call of their own (K' < K rows), one per bank:
        on the CPU a row's arithmetic does not depend on the call's other rows (checked
        by tests/engine/test_pipeline.py against mlx-lm), so no work is spent on rows
        pointed elsewhere. Returns (y, positions along K) per call."""
        cache = self._cache
        flat = slots.reshape(-1)
        pos = np.nonzero(member.reshape(-1))[0]
        bank, row = np.divmod(flat[pos], cache.bank_slots)
        lead = slots.shape[:-1]
        out = []
        for b in np.unique(bank):
            mine = bank == b
            idx = mx.array(row[mine].astype(np.uint32).reshape(*lead, int(mine.sum())))
            y = self._run(x, idx, idx.shape, cache.bank_arrays(int(b)), False)
            out.append((y, pos[mine]))
        return out

    def _pipelined(self, x: mx.array, sl: np.ndarray, pending, missed: np.ndarray) -> mx.array:
        """The layer's hits queued (and started) first, its misses read while they
        compute, then the misses queued: the reads overlap the compute instead of
        preceding it. Every row still comes from a call whose arithmetic for that row is
        mlx-lm's (`_masked_calls`, or `_compact_calls` on the CPU for one token)."""
        cache = self._cache
        self._times.pipelined_calls += 1
        reading = pending.waiting  # the misses' slots and a guess's still landing
        if self._compact and sl.size == sl.shape[-1]:
            parts = self._compact_calls(x, sl, ~missed)
            mx.async_eval([y for y, _ in parts])
            cache.complete(pending)
            parts += self._compact_calls(x, sl, missed)
            y = mx.concatenate([y for y, _ in parts], axis=-2)
            inv = np.argsort(np.concatenate([p for _, p in parts]))
            return y[..., mx.array(inv.astype(np.uint32)), :]
        y = _combine(self._masked_calls(x, sl, ~missed, reading))
        mx.async_eval(y)
        cache.complete(pending)
        return _combine(self._masked_calls(x, sl, missed, _NO_SLOTS), y)

    def __call__(self, x: mx.array, indices: mx.array) -> mx.array:
        if self._capture:
            raise Routed(indices)
        times = self._times
        predict = self._predict
        cache = self._cache
        frozen = cache.device_lut(self._layer)
        routing = self._routing
        if self._mass is not None:
            self._mass.kept(self._layer, indices)  # a reference only: no kernel, no sync
        stop = self._gate.check  # None outside a prefill chunk that may be stopped
        if frozen is not None and predict is None and cache.on_route is None:
            # Every expert of this layer is resident for good: no host sync, no reads (a
            # trace-routed run too: the masked router picks the trace's ids on the device).
            if stop is not None and self._gate.frozen_too:
                mx.eval(indices)  # the chunk up to here, so the stop is asked as it computes
                if stop():
                    raise PrefillStopped
            times.calls += 1
            times.last_k = int(indices.shape[-1])
            cell = routing.cell(self._layer) if routing is not None else None
            # lookups, all hits by construction (a trace's cell: what the replay counts)
            cache.counters.hits += len(cell) if cell is not None else int(indices.size)
            x = mx.expand_dims(x, (-2, -3))
            rows = cache.layer_arrays(self._layer)
            if rows is not None:
                # The layer's experts are rows 0..E-1 of their own arrays: mlx-lm's call
                # with the router's indices as they are (no lookup on the device).
                return self._run(x, indices, indices.shape, rows)
            bank, lut = frozen
            return self._run(x, lut[indices], indices.shape, cache.bank_arrays(bank))
        pred = chunk_pred = None
        t0 = time.perf_counter()
        gov = cache.governor
        if (
            predict is not None
            and gov is not None
            and gov.enabled
            and x.ndim >= 2
            and x.shape[-2] == 1
        ):
            pred = predict(x)  # decode only: the next layer's routing, most likely first
            mx.eval(indices, pred)  # still one host sync: both come back together
        elif routing is None and indices.size >= LONG_CHUNK_ROWS:  # a long prefill chunk
            want = [indices]
            if self._lookahead is not None:
                chunk_pred = self._lookahead(x)  # the next layer's union, read ahead below
                want.append(chunk_pred)
            if self._prestage is not None and self._stage:
                # this layer's predicted rows copied on the second stream (prestage.py),
                # its router queued before the host waits for their reads
                mx.async_eval(want)
                self._prestage.fulfil(cache, self._layer, times.calls)
            mx.eval(want)
        host = np.array(indices, copy=False)  # the one host sync of this layer
        t_sync = time.perf_counter()
        times.router_sync_s += t_sync - t0
        tl = times.timeline
        if tl is not None:
            c = cache.counters
            before = (c.hits, c.misses, c.prefetch_used, c.demand_read_s, c.prefetch_wait_s,
                      c.prefetch_issued + c.prefetch_dropped)  # fmt: skip
        if stop is not None and stop():
            if self._prestage is not None:
                self._prestage.drop()  # a stopped chunk's copy: nothing will take it
            raise PrefillStopped
        times.calls += 1
        times.last_k = int(host.shape[-1])
        x = mx.expand_dims(x, (-2, -3))
        if host.size == host.shape[-1]:
            # One token: its K experts are distinct (top-K), so sorting is np.unique.
            uniq = np.sort(host.reshape(-1))
            if len(uniq) > 1 and (uniq[1:] == uniq[:-1]).any():
                uniq = np.unique(uniq)
        else:
            uniq = dense_unique(host)
        if host.ndim >= 2 and host.shape[-2] == 1:
            times.union_experts += len(uniq)
            times.union_calls += 1
        extra = None
        if routing is not None:
            cell = routing.cell(self._layer)
            if cell is not None:
                # The trace's ids, in trace order. Ids the block picked outside them (only
                # when K exceeds the cell) carry weight exactly 0: any resident slot serves.
                extra = np.setdiff1d(uniq, cell)
                uniq = cell
        if len(uniq) <= cache.capacity:
            long_chunk = self._stage and host.size >= LONG_CHUNK_ROWS
            # Staged ahead, a long chunk computes from the host banks only: the rows it
            # reads reach a mirror at the mirror's next sync (decode's first lookup)
            # instead of crossing the bus twice now.
            from_host = long_chunk and self._prestage is not None
            pending = cache.lookup(self._layer, uniq, mirror=not from_host)
            slots = pending.slots
            lut = self._lut  # only the entries set here are read
            lut[uniq] = slots
            if extra is not None and len(extra):
                lut[extra] = slots[0]
            sl = lut[host]
            # Which rows wait on a read: asked only where the layer may pipeline (the
            # serial CPU path skips the np.isin, ~10 us a layer on the 2-core VM).
            waiting = pending.waiting  # read now, or a guess still landing
            missed = (
                np.isin(sl, waiting)
                if self._pipe and len(waiting) and host.size <= PIPELINE_MAX_ROWS
                else None
            )
            pre = None
            if self._prestage is not None:  # the copy made for this call, if any
                pre = self._prestage.take(self._layer, times.calls)
            if missed is not None and not missed.all():
                y = self._pipelined(x, sl, pending, missed)  # compute the hits while reading
            else:
                cache.complete(pending, mirror=not from_host)
                if pre is not None and long_chunk:
                    y = self._run_prestaged(x, host, uniq, pre)
                else:
                    y = self._run_slots(x, sl, stage=long_chunk)
            # Read the next layer's likely experts while this layer computes: predicted by
            # its router (lookahead) or, in decode (one token) of trace-driven runs, by
            # co-occurrence with this layer's ids. The router's guesses in decode: a few,
            # into cold slots only (`ExpertCache.prefetch_cold`, experts/prefetch.py).
            nxt = None
            if pred is not None:
                flat = np.array(pred, copy=False).reshape(-1)
                _, first = np.unique(flat, return_index=True)
                ranked = flat[np.sort(first)]  # each row's most likely first
                if tl is not None:
                    tl.expect(self._layer + 1, ranked)
                pinned = {(self._layer, int(e)) for e in uniq}
                cache.prefetch_cold(self._layer + 1, ranked, pinned)
            elif chunk_pred is not None:
                # Read the next layer's predicted union while this chunk's layer computes
                # (started first), into free or evictable slots only: `prefetch` pins
                # this layer's experts. The next layer then reads only what it missed.
                mx.async_eval(y)
                self._times.readahead_calls += 1
                nxt = dense_unique(np.array(chunk_pred, copy=False))
            elif (
                cache.predictor is not None
                and host.size == host.shape[-1]
                and (gov is None or gov.enabled)
            ):
                # A trace-driven run keeps read-ahead v1 (every guess, any evictable
                # slot): what `ssdmoe trace replay --prefetch` simulates, checked equal.
                ids = cache.predictor.predict(self._layer, uniq.tolist(), len(uniq))
                nxt = np.array(ids, dtype=np.int64) if ids else None
                if nxt is not None and tl is not None:
                    tl.expect(self._layer + 1, nxt)
            if nxt is not None:
                pinned = {(self._layer, int(e)) for e in uniq}
                cache.prefetch(self._layer + 1, nxt, pinned)
                if chunk_pred is not None and self._prestage is not None and self._stage:
                    # the next layer copies these rows on the second stream once they
                    # land, while this layer computes (prestage.py: why they stay right)
                    self._prestage.ask(self._layer + 1, nxt, times.calls)
            if tl is not None and host.size == host.shape[-1]:
                self._record(tl, t0, t_sync, before, len(pending.read_experts), uniq)
            return y
        if extra is not None and len(extra):
            uniq = np.concatenate([uniq, extra])
        return self._grouped(x, host, uniq)

    def _record(self, tl: Timeline, t0: float, t_sync: float, before: tuple, nread: int,
                uniq: np.ndarray) -> None:  # fmt: skip
        """One timeline row for this one-token layer call (`StepTimes.timeline`)."""
        cache = self._cache
        c = cache.counters
        hits, misses, used, read_s, wait_s, issued = before
        pred_hit, pred_n = tl.scored(self._layer, uniq)
        tl.record(
            cache.token, self._layer,
            (t_sync - t0) * 1e3, (c.demand_read_s - read_s) * 1e3,
            (c.prefetch_wait_s - wait_s) * 1e3, (time.perf_counter() - t0) * 1e3,
            nread * cache.index.expert_bytes, c.hits - hits, c.misses - misses,
            # (guesses this layer issued: a later lookup's drops are not taken off)
            c.prefetch_issued + c.prefetch_dropped - issued, c.prefetch_used - used, pred_hit,
            pred_n,
        )  # fmt: skip

    def _grouped(self, x: mx.array, host: np.ndarray, uniq: np.ndarray) -> mx.array:
        """Union of experts larger than the cache (big prefill chunks, tiny budgets).

        Rows (token, k) are processed in groups of experts that fit; each group is
        evaluated before the next one may reuse its slots.
        """
        cache = self._cache
        self._times.grouped_calls += 1
        lead_shape = host.shape  # (..., K)
        flat = host.reshape(-1)
        k = host.shape[-1]
        xf = x.reshape(-1, 1, 1, x.shape[-1])  # one row per token
        outs = []
        order = []
        for start in range(0, len(uniq), cache.capacity):
            group = uniq[start : start + cache.capacity]
            rows = np.nonzero(np.isin(flat, group))[0]
            slots = cache.ensure(self._layer, group)
            if not len(rows):  # a trace-routed union may name experts no row chose
                continue
            lut = np.zeros(self._num_experts, dtype=np.int64)
            lut[group] = slots
            xr = xf[mx.array(rows // k)]
            y = self._run_slots(xr, lut[flat[rows]][:, None], False, self._stage)  # (P, 1, D)
            mx.eval(y)
            outs.append(y)
            order.append(rows)
        perm = np.concatenate(order)
        inv = np.empty_like(perm)
        inv[perm] = np.arange(len(perm))
        y = mx.concatenate(outs, axis=0)[mx.array(inv)]
        return y.reshape(*lead_shape, y.shape[-1])


class Routed(Exception):  # noqa: N818 - a control-flow signal, not an error
    """Raised by a capturing switch with the indices its block routed (`routing_predictor`)."""

    def __init__(self, indices: mx.array) -> None:
        super().__init__("routed")
        self.indices = indices


def routing_predictor(block: nn.Module, switch: StreamedSwitch):
    """The block's own routing, as a function of a hidden state (prefetch, read-ahead):
    the block is called on `x` with its streamed switch set to hand back the indices it
    is given instead of computing, so every family's router (softmax, sigmoid with
    correction bias and groups, sparsemixer...) is mlx-lm's own code, K included. What
    the block builds past its router (a shared expert) is never evaluated: MLX is lazy
    and only the indices are. The router is looked up at each call, so a quantized
    checkpoint's QuantizedLinear gate is the one used."""

    def predict(x: mx.array) -> mx.array | None:
        object.__setattr__(switch, "_capture", True)
        try:
            block(x)
        except Routed as routed:
            return routed.indices
        finally:
            object.__setattr__(switch, "_capture", False)
        return None  # the block did not route this call (never for a MoE block)

    return predict


RESCALE_ENV = "SSDMOE_PREFETCH_RESCALE"


def prefetch_rescale() -> bool:
    """$SSDMOE_PREFETCH_RESCALE: `on` (default) or `off` (see `ranked_predictor`)."""
    from ssdmoe_tui.errors import BadValueError

    text = os.environ.get(RESCALE_ENV, "").strip().lower() or "on"
    if text not in ("on", "off"):
        raise BadValueError(f"{RESCALE_ENV}={text!r}: use on or off")
    return text == "on"


def ranked_predictor(block: nn.Module, switch: StreamedSwitch, router: str,
                     norm: nn.Module | None = None, next_norm: nn.Module | None = None):  # fmt: skip
    """Decode read-ahead's guess: the next MoE block's routing applied to this layer's
    block input, each row's experts most likely first.

    Where the next router is a linear layer of logits, its top-K logits in descending
    order (the block's own selection for softmax/top-K routers; for others only the
    guess may differ, never the tokens): one matmul and one sort, K read off the block's
    routing graph, which is built but never evaluated. Elsewhere the block's routing
    itself (`routing_predictor`), in its own order.

    The block input is this layer's `post_attention_layernorm(h)`, and the routing block
    applies no norm of its own: the next layer's router sees `h'/rms(h') * w_next`, not
    `h/rms(h) * w_this`. With both norms given, the input is rescaled by `w_next / w_this`
    first (streamlx's rescale), so only the residual's change between the layers is
    left to guess. The ratio is taken once, at the first call (the weights are loaded by
    then)."""
    base = routing_predictor(block, switch)
    ratio: list[mx.array] = []

    def predict(x: mx.array) -> mx.array | None:
        if norm is not None and next_norm is not None:
            if not ratio:
                w, wn = norm.weight, next_norm.weight
                safe = mx.where(mx.abs(w) > 1e-6, w, 1)
                ratio.append(mx.where(mx.abs(w) > 1e-6, wn / safe, 1).astype(x.dtype))
                mx.eval(ratio[0])
            x = x * ratio[0]
        inds = base(x)  # a graph only: evaluated where the router is not linear
        gate = getattr(block, router, None)
        if inds is None or not isinstance(gate, nn.Linear | nn.QuantizedLinear):
            return inds
        return mx.argsort(-gate(x), axis=-1)[..., : inds.shape[-1]]

    return predict

"""A long prefill chunk's next layer staged ahead, on a second stream
(`SSDMOE_PREFILL_STAGE=ahead`, opt-in: on an H100 it measured the same as staging in
place, 0.786-0.800x resident against 0.792-0.793x, its copies on time; docs/benchmarks.md
2026-12-06 sixth session, and `scripts/cuda_overlap_probe.py` for the question it left:
does MLX-CUDA run the second stream's copy beside the compute at all?).

Under MLX-CUDA `host` placement a long chunk's layer computes from a device copy of the
slots its union uses (`StreamedSwitch._run_staged`): at 4k tokens the union is the whole
layer, so every chunk moves the experts of every layer over PCIe (17 GB for the
Qwen3-30B-A3B shape), in the compute's own stream, one layer's copy after the layer
before has computed. On an H100 that copy was read, from the time budget, as what keeps
the warm 4k prefill at 0.75-0.79x resident mlx-lm (docs/benchmarks.md, 2026-12-06 fifth
session).

Staged ahead, layer l's switch, once it has queued its compute and started reading
layer l+1's predicted union ahead (prefill read-ahead), leaves the prediction here
(`ask`). Layer l+1's switch queues its attention and router first (`mx.async_eval`),
then waits for those reads and queues a copy of the rows now holding its predicted
experts on a stream of its own (`fulfil`): the copy crosses the bus while the device
finishes layer l and computes l+1's attention, and the host's wait for the reads no
longer holds that work back (a cold prefill's reads take longer than a layer's
compute). Layer l+1 then looks up its union, takes the copy (`take`), gathers the few
experts of its union that were not predicted from the banks as before, and runs
mlx-lm's one call over both (one concatenation in device memory). MLX orders the two
streams: the compute waits for the copy.

Why the rows it copies hold the right bytes when the copy runs (which may be after the
host has moved on): the copy is queued only once the read-ahead's reads have landed,
and only for experts resident then. An expert of l+1's union keeps its slot until
l+1's compute is queued (`ExpertCache.lookup` never evicts the union it is looking up;
nothing else evicts between the copy and that lookup), and the reads that could reuse
its slot come after a later router sync, which waits for l+1's compute, which waits for
the copy. A predicted expert outside the union may lose its slot while the copy is still
queued: its row in the copy is then wrong, and unused.

A prediction and its copy serve the same layer in the same forward pass only (`fulfil`
and `take` check the layer and `StepTimes.calls`; a stopped chunk drops them, `drop`).
Where a chunk pauses for a batch's rows (engine/run/batch.py: their decode step runs at
the chunk's layer boundary, after `fulfil`), that step's layers count calls too, so the
copy is not taken and the layer stages in place: the step may have evicted the copy's
experts, which "nothing else evicts" above does not hold for.
Device memory: the copy in use, its concatenation with the rows it lacked, and the next
layer's copy may coexist while queued work still holds them: up to about three of a
layer's unions.

Under a mirror (`device` placement) the long chunks stage ahead from the host banks the
reader writes, and their lookups leave the rows read marked for the mirror instead of
copying them now: a chunk moves each row it uses over the bus once (as host staging
does, per chunk), not once for the mirror and again for the compute, and the mirror
catches up at its next sync (the next one-token step's lookup, before anything computes
from it: up to the whole cache after a long prompt, copied in steps of at most
`mirror.SYNC_STEP_BYTES`). Where the budget holds every expert a layer still syncs the
mirror as it freezes."""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx
import numpy as np

from ssdmoe_tui.engine.experts.banks import rows_by_bank


@dataclass(frozen=True)
class Prestaged:
    """Copies of `layer`'s predicted experts' rows: row i holds expert `experts[i]`."""

    layer: int
    call: int  # `StepTimes.calls` before the layer's own call counted itself
    experts: np.ndarray
    arrays: dict[str, tuple]  # projection -> (weight, scales, biases, bias) rows


class Prestage:
    """One per model, shared by its switches: the copy stream, the prediction asked for
    and the copy in flight."""

    def __init__(self) -> None:
        self.stream = mx.new_stream(mx.default_device())
        self._asked: tuple[int, int, np.ndarray] | None = None  # (layer, call, experts)
        self._held: Prestaged | None = None

    def ask(self, layer: int, experts: np.ndarray, call: int) -> None:
        """`layer`'s predicted union, read ahead by the call numbered `call` (the layer
        before): copied by `fulfil` at the start of `layer`'s call."""
        self._asked = (layer, call, experts)

    def fulfil(self, cache, layer: int, call: int) -> None:  # noqa: ANN001 - ExpertCache
        """At the start of `layer`'s call (`StepTimes.calls` still `call`, its router
        queued): the copy of its asked-for rows, if the call before asked for it."""
        asked, self._asked = self._asked, None
        self._held = None
        if asked is not None and asked[0] == layer and asked[1] == call:
            self._make(cache, layer, asked[2], call)

    def drop(self) -> None:
        """Forget the prediction and the copy (a stopped chunk)."""
        self._asked = self._held = None

    def _make(self, cache, layer: int, experts: np.ndarray, call: int) -> None:  # noqa: ANN001
        """Queue on the copy stream a copy of the rows holding `layer`'s resident
        `experts` (read-ahead's reads waited for first)."""
        cache.wait_prefetch()  # the bytes are in the banks before the copy reads them
        slots = cache.slots_of(layer, experts)
        keep = slots >= 0
        if not keep.any():
            return
        experts, slots = np.asarray(experts)[keep], slots[keep]
        order = np.argsort(slots)  # ascending: one gather per bank (`gather_rows`)
        experts, slots = experts[order], slots[order]
        # the reader's banks: a mirror's rows may lag them
        arrays = gather_rows(cache.host_bank_arrays, cache.bank_slots, slots, self.stream)
        mx.async_eval([a for parts in arrays.values() for a in parts if a is not None])
        self._held = Prestaged(layer, call, experts, arrays)

    def take(self, layer: int, call: int) -> Prestaged | None:
        """The copy `fulfil` made for `layer`'s call numbered `call` (counted by then),
        or None; a copy held for anything else is dropped."""
        held, self._held = self._held, None
        if held is None or held.layer != layer or held.call + 1 != call:
            return None
        return held


def gather_rows(of, bank_slots: int, slots: np.ndarray, stream=None) -> dict[str, tuple]:  # noqa: ANN001
    """Projection -> (weight, scales, biases, bias) rows of `slots` (ascending: the rows
    come in that order, bank by bank), copied by the device from `of(bank)` (a cache's
    `bank_arrays` or `host_bank_arrays`), on `stream` (None: the default one)."""
    picks = [(b, mx.array(rows.astype(np.uint32))) for b, rows in rows_by_bank(slots, bank_slots)]
    arrays = {}
    for proj, proj_parts in of(picks[0][0]).items():
        parts = []
        for i, part in enumerate(proj_parts):
            if part is None:
                parts.append(None)
                continue
            got = [mx.take(of(b)[proj][i], r, axis=0, stream=stream) for b, r in picks]
            parts.append(got[0] if len(got) == 1 else mx.concatenate(got, axis=0, stream=stream))
        arrays[proj] = tuple(parts)
    return arrays


def combine(pre: Prestaged, extra_experts: np.ndarray, extra: dict[str, tuple] | None,
            num_experts: int) -> tuple[dict[str, tuple], np.ndarray]:  # fmt: skip
    """The copy's rows followed by `extra`'s (the union's experts it lacks, rows in
    `extra_experts` order), and expert id -> row in them (-1: in neither)."""
    pos = np.full(num_experts, -1, dtype=np.int64)
    pos[pre.experts] = np.arange(len(pre.experts))
    if extra is None or not len(extra_experts):
        return pre.arrays, pos
    pos[extra_experts] = len(pre.experts) + np.arange(len(extra_experts))
    arrays = {
        proj: tuple(
            None if a is None else mx.concatenate([a, b], axis=0)
            for a, b in zip(parts, extra[proj], strict=True)
        )
        for proj, parts in pre.arrays.items()
    }
    return arrays, pos

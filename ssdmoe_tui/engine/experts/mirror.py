"""A device-resident mirror of the slot banks (`device` slot placement on MLX-CUDA).

Under `host` placement the reader writes missed experts into pinned host slots with no
page fault, but every kernel then reads every expert it uses over the bus, hits
included: one layer's experts took 1.13 ms on the H200 against 0.21 ms from device
memory (docs/benchmarks.md, 2026-12-05 afternoon). Under `managed` the slots sit in
device memory, but the reader's writes fault their pages back to the host.

The mirror keeps both halves: the host banks stay the reader's target, and each bank
has a twin made of ordinary MLX arrays (created by a device kernel, so they live in
device memory), which is what the layers' `gather_qmm` calls read. The rows a read has
just filled (misses, read-ahead guesses, a warm resume) are marked, and before any
compute may use them `sync` copies exactly those rows host -> mirror: one gather from
the host bank and one scatter into the mirror per component and bank. A miss crosses
the bus once; a hit is read from device memory.

In place, not a bank copy: MLX's scatter reuses its input's buffer only when nothing
else holds it (a queued kernel that read the mirror keeps it until it finishes), and
otherwise copies the whole bank first (up to 2 GiB per component). So `sync` first
waits for the stream (`mx.synchronize`, which also runs the completion handlers that
release those kernels' hold), and the cache never keeps views of mirror rows (a frozen
layer uses its device lookup table instead). tests/engine/test_slot_mirror.py checks
that the mirror's buffers never move.

Not the driver's copy engines: copying the rows with `cuMemcpyAsync` (one copy per run of
rows and component, outside MLX's graph, waited for) was tried on the H200 (2026-12-06,
seventh session; docs/benchmarks.md): the rows arrived right, but from the managed,
host-preferred banks at 2.4-7.7 GB/s, and a decode token's syncs took 87-97 ms against
26-27 ms for these queued MLX copies (4.95-5.42 tok/s against 7.98-8.52).

`SSDMOE_SLOT_MIRROR`: `auto` (default: a mirror exactly under `device` placement),
`on` (everywhere: the CPU tests run the mirror's bookkeeping for real), `off` (never:
`device` then behaves as `host`, for A/B runs)."""

from __future__ import annotations

import threading
import time

import mlx.core as mx
import numpy as np

from ssdmoe_tui.engine.experts.banks import rows_by_bank
from ssdmoe_tui.engine.experts.slack import slot_array

MIRROR_ENV = "SSDMOE_SLOT_MIRROR"
MIRROR_MODES = ("auto", "on", "off")
# A sync copies at most this many bytes of rows at once: each copy gathers its rows from
# the host banks into a temporary before the scatter, so a sync of many rows (the
# catch-up after a long prompt staged ahead, a warm resume) held them all at once (H100:
# 2,644 rows, 6.7 GB above the mirror). Past it the copies go in steps, each waited for.
SYNC_STEP_BYTES = 256 << 20


def mirror_mode() -> str:
    """`$SSDMOE_SLOT_MIRROR`, checked: one clear line for a bad value."""
    from ssdmoe_tui.options import env_choice

    return env_choice(MIRROR_ENV, MIRROR_MODES)


def mirrors(mode: str, placement: str) -> bool:
    """Whether the cache computes from a mirror: `auto` under `device` placement only."""
    if mode == "auto":
        return placement == "device"
    return mode == "on"


class SlotMirror:
    """Per bank, an array per component shaped as the host bank's, and the slots read
    into the host banks since the last `sync` (marked from any reading thread)."""

    def __init__(self, banks: list[dict[str, mx.array]], bank_slots: int) -> None:
        self.host = banks
        self.bank_slots = bank_slots
        self.banks: list[dict[str, mx.array]] = []
        for bank in banks:
            # made by a fill kernel: on MLX-CUDA its pages are first touched on the device;
            # a spare slot behind, as the host bank's (slack.py)
            twin = {
                name: slot_array(a.shape[0], tuple(a.shape[1:]), a.dtype)
                for name, a in bank.items()
            }
            self.banks.append(twin)
        self._row_bytes = sum(int(a.nbytes) // a.shape[0] for a in banks[0].values())
        self._dirty: list[np.ndarray] = []
        self._lock = threading.Lock()
        self.rows = 0  # rows copied host -> mirror since the load
        self.seconds = 0.0  # host time in `sync` (its stream wait included)

    @property
    def row_bytes(self) -> int:
        """Bytes one slot's row takes over all components (what a copied row moves)."""
        return self._row_bytes

    def mark(self, slots: np.ndarray) -> None:
        """`slots` now hold new bytes in the host banks (a read finished). Any thread."""
        if len(slots):
            arr = np.array(slots, dtype=np.int64, copy=True)
            with self._lock:
                self._dirty.append(arr)

    @property
    def pending(self) -> int:
        """Slot entries marked and not yet copied (duplicates counted)."""
        with self._lock:
            return sum(len(d) for d in self._dirty)

    def sync(self) -> int:
        """Copy every marked row host -> mirror, before compute may read it (engine
        thread). The copies are queued, not waited for: the layer's compute, queued after
        them on the same stream, reads the new rows; only past `SYNC_STEP_BYTES` of rows
        does each step wait for the one before. Returns the rows copied."""
        with self._lock:
            dirty, self._dirty = self._dirty, []
        if not dirty:
            return 0
        t0 = time.perf_counter()
        slots = np.unique(np.concatenate(dirty))
        # Kernels queued earlier may still read the mirror: once they are done (and
        # their hold on its buffers released) the scatters below update it in place.
        mx.synchronize()
        step = max(1, SYNC_STEP_BYTES // self._row_bytes)
        parts = []  # (bank, its rows), at most `step` rows each
        for b, mine in rows_by_bank(slots, self.bank_slots):
            parts += [(b, part) for part in np.array_split(mine, -(-len(mine) // step))]
        out: list[mx.array] = []
        queued = 0  # rows in `out`: a decode step's few rows never wait
        for b, part in parts:
            if queued and queued + len(part) > step:
                # this step's temporaries freed before the next is gathered, and (as
                # above) its kernels' hold on the mirror released, so the next step's
                # scatters stay in place
                mx.eval(out)
                mx.synchronize()
                out, queued = [], 0
            rows = mx.array(part.astype(np.uint32))
            host, twin = self.host[b], self.banks[b]
            for name, m in twin.items():
                # `m` is the object the cache's projection tables hold: updated in place
                m[rows] = host[name][rows]
                out.append(m)
            queued += len(part)
        mx.async_eval(out)
        self.rows += len(slots)
        self.seconds += time.perf_counter() - t0
        return len(slots)

    def close(self) -> None:
        self.banks.clear()
        with self._lock:
            self._dirty = []

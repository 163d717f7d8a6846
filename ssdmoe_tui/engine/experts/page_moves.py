"""Slot rows' memory pages moved between host and GPU by the copy engines (MLX-CUDA).

Under `host` placement the slot banks are managed memory that prefers the host: the
reader's threads write experts there at host-memory speed, and a long prefill chunk's
layer copies the rows its union uses into device memory before computing
(`StreamedSwitch._run_staged`). That copy is a kernel on MLX's stream: it reads host
memory over the bus and does not run beside the compute (the H200 of 2026-12-06: a
second MLX stream's copy added its whole time, overlap share -0.02; the H100 of
2026-12-07: 10.7 ms a layer of a 4,096-token chunk at 31.8 GB/s). A page migration
(`cuMemPrefetchAsync`) is done by the copy engines instead, and ran beside the compute
both ways (the H100 of 2026-12-07: to the GPU 21 ms a layer alone, overlap share 0.94;
back 41 ms, share 0.97): moved ahead, the staging copy reads device memory (the
seventh session: 1.0 ms a layer). Page placement never changes what a read returns
(managed memory is coherent): a move that comes late or not at all costs time only.

`slot_ranges` gives the address ranges of slots' rows (one per run of adjacent rows of a
bank and component); `PageMover` queues their moves on two streams of its own (in and
out), so a layer's pages coming back do not wait behind the next layer's going."""

from __future__ import annotations

import ctypes

import numpy as np

from ssdmoe_tui.engine.experts.device_memory import (
    _LOC_DEVICE,
    _LOC_HOST,
    _get_driver,
    _MemLocation,
)

_STREAM_NON_BLOCKING = 1  # CU_STREAM_NON_BLOCKING: no implicit sync with the null stream


def slot_ranges(
    slots: np.ndarray, bank_slots: int, bases: np.ndarray, strides: np.ndarray
) -> list[tuple[int, int]]:
    """(address, bytes) of the rows of `slots` in every component: `bases[bank, comp]`
    is slot row 0's address, `strides[comp]` one row's bytes; adjacent rows of one bank
    coalesce into one range (a layer's slots are mostly runs: a long chunk's layer reuses
    an older layer's whole set)."""
    s = np.unique(np.asarray(slots, dtype=np.int64))
    if not len(s):
        return []
    bank, row = np.divmod(s, bank_slots)
    # a new run wherever the bank changes or a row is not the previous one's successor
    cut = np.flatnonzero((np.diff(bank) != 0) | (np.diff(row) != 1)) + 1
    starts = np.concatenate([[0], cut])
    ends = np.concatenate([cut, [len(s)]])
    out: list[tuple[int, int]] = []
    for a, z in zip(starts.tolist(), ends.tolist(), strict=True):
        b, r, n = int(bank[a]), int(row[a]), z - a
        for c, stride in enumerate(strides.tolist()):
            out.append((int(bases[b, c]) + r * stride, n * stride))
    return out


class PageMover:
    """`cuMemPrefetchAsync` of address ranges to the GPU or back, on two streams of its
    own; raises OSError / AttributeError where the CUDA driver API is missing."""

    def __init__(self) -> None:
        drv = _get_driver()  # the placement's binding of libcuda, and its device
        lib = drv.lib
        fn = lib.cuMemPrefetchAsync_v2
        fn.argtypes = [ctypes.c_uint64, ctypes.c_size_t, _MemLocation, ctypes.c_uint,
                       ctypes.c_void_p]  # fmt: skip
        fn.restype = ctypes.c_int
        self._prefetch = fn
        lib.cuStreamCreate.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_uint]
        lib.cuStreamCreate.restype = ctypes.c_int
        self._device = drv.device()
        streams = []
        for _ in range(2):
            s = ctypes.c_void_p()
            rc = lib.cuStreamCreate(ctypes.byref(s), _STREAM_NON_BLOCKING)
            if rc != 0:
                raise OSError(f"cuStreamCreate failed (CUresult {rc})")
            streams.append(s)
        self._in, self._out = streams
        self.failed = 0  # moves the driver refused (each costs nothing but its time)

    def to_device(self, ranges: list[tuple[int, int]]) -> None:
        self._move(ranges, _MemLocation(_LOC_DEVICE, self._device), self._in)

    def to_host(self, ranges: list[tuple[int, int]]) -> None:
        self._move(ranges, _MemLocation(_LOC_HOST, 0), self._out)

    def _move(self, ranges: list[tuple[int, int]], loc: _MemLocation, stream) -> None:  # noqa: ANN001
        fn = self._prefetch
        for ptr, size in ranges:
            if fn(ptr, size, loc, 0, stream) != 0:
                self.failed += 1

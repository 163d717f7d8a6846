"""Copies of slot rows between two buffers by address, outside MLX's graph.

The slot mirror (mirror.py) copies the rows a read filled from the host banks into their
device twins before a kernel reads them. Through MLX that is a gather from the host bank
and a scatter into the twin per component and bank: about 18 MLX ops a layer for the
Qwen3-30B-A3B shape's nine components, each a graph node and a kernel launch on a host
that already bounds a decode token on the GPU, and a scatter that copies the whole bank
whenever something still holds it. On an H100 the mirror's syncs cost ~22 ms of host
time a token of the real trace (0.89 s over 40 tokens, 4 GiB cache, docs/benchmarks.md
2026-12-06 sixth session), where its "rest" was 47-57 ms a token against host slots'
23-26, and its process peaked at 13 GiB of MLX memory for a 4 GiB mirror.

Here the rows move as plain memory copies, one per run of consecutive rows and
component: on MLX-CUDA the driver's `cuMemcpyAsync` on a stream of its own (the copy
engines: no kernel, no MLX op, no temporary), waited for before the mirror is used; on
the CPU `memmove` (both sides host memory; what the CPU tests run). The caller makes sure
no queued kernel still reads the rows being overwritten (`mx.synchronize` first), and
the copies are complete when `copy` returns, so compute queued afterwards sees them.

On this development VM's CPU (scripts/cuda_mirror_copy_probe.py, the Qwen3-30B-A3B
expert's nine components, 2.53 MiB a row, medians of 5): 2 rows 1.26 ms direct against
9.0 ms through MLX, 32 rows 10.7 against 166 ms. MLX-CUDA: `auto` keeps MLX's copies
until the probe and a decode A/B have run there.
"""

from __future__ import annotations

import ctypes

import numpy as np

COPY_ENV = "SSDMOE_SLOT_MIRROR_COPY"
# direct: this module; mlx: the gather / scatter through MLX
COPY_MODES = ("auto", "direct", "mlx")


def copy_mode(cuda: bool) -> str:
    """`$SSDMOE_SLOT_MIRROR_COPY`, checked (one clear line for a bad value). `auto`:
    `direct` on the CPU; `mlx` on MLX-CUDA until the direct copies have been checked and
    timed there (scripts/cuda_mirror_copy_probe.py, docs/benchmarks.md)."""
    from ssdmoe_tui.options import env_choice

    mode = env_choice(COPY_ENV, COPY_MODES)
    if mode == "auto":
        return "mlx" if cuda else "direct"
    return mode


def row_runs(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(first row, row count) of each run of consecutive rows in sorted, distinct `rows`."""
    rows = np.asarray(rows, dtype=np.int64)
    if rows.size == 0:
        return rows, rows
    breaks = np.flatnonzero(np.diff(rows) != 1) + 1
    starts = np.concatenate(([0], breaks))
    ends = np.concatenate((breaks, [rows.size]))
    return rows[starts], ends - starts


class RowCopier:
    """Copies (dst, src, bytes) ranges and returns once they are done."""

    name = "memmove"

    def copy(self, dsts: np.ndarray, srcs: np.ndarray, lengths: np.ndarray) -> None:
        for d, s, n in zip(dsts.tolist(), srcs.tolist(), lengths.tolist(), strict=True):
            ctypes.memmove(d, s, n)

    def close(self) -> None:
        """Nothing held."""


class CudaRowCopier(RowCopier):
    """The CUDA driver's asynchronous copies on a non-blocking stream of their own, then
    one wait for that stream: the copy engines move the bytes (unified addressing: MLX's
    managed buffers on either side)."""

    name = "cuMemcpyAsync"

    def __init__(self) -> None:
        lib = ctypes.CDLL("libcuda.so.1")
        self._lib = lib
        lib.cuMemcpyAsync.argtypes = [
            ctypes.c_uint64,
            ctypes.c_uint64,
            ctypes.c_size_t,
            ctypes.c_void_p,
        ]
        lib.cuMemcpyAsync.restype = ctypes.c_int
        lib.cuStreamSynchronize.argtypes = [ctypes.c_void_p]
        lib.cuStreamCreate.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_uint]
        lib.cuStreamDestroy_v2.argtypes = [ctypes.c_void_p]
        lib.cuCtxGetCurrent.argtypes = [ctypes.POINTER(ctypes.c_void_p)]
        lib.cuCtxSetCurrent.argtypes = [ctypes.c_void_p]
        lib.cuDevicePrimaryCtxRetain.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_int]
        lib.cuInit.argtypes = [ctypes.c_uint]
        self._current()
        self._stream = ctypes.c_void_p()
        _check(lib.cuStreamCreate(ctypes.byref(self._stream), 1), "cuStreamCreate")

    def _current(self) -> None:
        """Make the device's primary context (MLX's, through the runtime API) current on
        this thread if none is: the driver API needs one, the runtime sets it lazily."""
        lib = self._lib
        ctx = ctypes.c_void_p()
        _check(lib.cuCtxGetCurrent(ctypes.byref(ctx)), "cuCtxGetCurrent")
        if ctx.value:
            return
        _check(lib.cuInit(0), "cuInit")
        _check(lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), 0), "cuDevicePrimaryCtxRetain")
        _check(lib.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")

    def copy(self, dsts: np.ndarray, srcs: np.ndarray, lengths: np.ndarray) -> None:
        self._current()  # the engine's thread may not be the one that made the stream
        f, stream = self._lib.cuMemcpyAsync, self._stream
        for d, s, n in zip(dsts.tolist(), srcs.tolist(), lengths.tolist(), strict=True):
            _check(f(d, s, n, stream), "cuMemcpyAsync")
        _check(self._lib.cuStreamSynchronize(stream), "cuStreamSynchronize")

    def close(self) -> None:
        if self._stream.value:
            self._lib.cuStreamDestroy_v2(self._stream)
            self._stream = ctypes.c_void_p()


def _check(rc: int, what: str) -> None:
    if rc != 0:
        raise RuntimeError(f"the CUDA driver's {what} failed (CUresult {rc})")


def row_copier(cuda: bool) -> RowCopier:
    """The copier for where MLX keeps its arrays: the driver's copy engines on MLX-CUDA,
    memmove elsewhere."""
    return CudaRowCopier() if cuda else RowCopier()

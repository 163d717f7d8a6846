"""Slack behind the activations of an expert matmul that MLX-CUDA's tiled kernel reads past.

MLX-CUDA 0.32's `gather_qmm` runs `qmm_sm80_kernel` for calls of 8 rows or more (fewer go
to `gather_qmv`) when the output width is a multiple of 128 and the input width a multiple
of max(64, group size), 4 or 8 bits, affine, float16 or bfloat16. Each batch of such a call
is one row (the streamed layer's shapes, as mlx-lm's SwitchGLU), and the kernel tiles 16
rows: at the last batch it reads the row after x's end. MLX's CUDA allocator rounds a buffer
to a power of two under 16 KiB and to whole 16 KiB pages above, so an x whose size is
already such a size has no slack, and the read leaves the allocation. Measured on the H200
(2026-12-05, `compute-sanitizer`, the demo's speculative verify): "Invalid __global__ read
of size 16 bytes ... 1 bytes after the nearest allocation ... of size 49,152 bytes" (the
down projection's input, 192 rows x 128 bfloat16 of a 48-token prompt), and without the
sanitizer the process aborts with "an illegal memory access was encountered". Whether it
faults depends on what the allocator placed behind x: the H100 run of the same command
did not. mlx-lm's own resident layers call the same kernel (upstream: ml-explore/mlx
#3487, the kernels' M/N boundary reads).

The guard copies x into a buffer `PAD_ROWS` rows longer and hands the call a view of its
first rows: the same shape and strides, so MLX picks the same kernel and every row's
arithmetic is unchanged (greedy tokens stay mlx-lm's). The copy is one gather kernel per
guarded call (x's entries along its first axis with the last one repeated behind it; the
slack's values are never used), on MLX-CUDA only. It was `mx.pad`, two kernels (a
fill of the whole buffer, then the copy), whose cost showed in batches every expert held
(H100, 2026-12-07 thirteenth session, the engine against BatchGenerator in alternating
processes, B = 4 / 8: guard off 0.937 / 1.026x and 0.993 / 1.120x, on 0.949 / 0.889x and
0.790 / 0.750x). The one-kernel copy still costs there (fifteenth session, processes
alternating off / on: off 0.948 / 1.126x and 1.026 / 1.110x at B = 4 / 8, on 0.789 /
0.930x and 0.978 / 1.011x): the engine's step graph is otherwise BatchGenerator's op for
op, and on a host-bound GPU step the guard's nodes are what it adds (scripts/graph_ops.py):
six a MoE layer then (a `take` is a gather and a squeeze, then the slice), four since (a
`take_along_axis` with an index of the copy's shape is one node). With four, the host
still built a B = 2 step 1.5 ms longer (sixteenth session: 7.4-7.5 against 5.8-5.9 ms),
so a layer now decides and indexes once per shape (`Guards`).
It stays on: an aborted process costs more than that.

`SSDMOE_QMM_PAD`: `auto` (default: on under MLX-CUDA), `on` (everywhere: the tests run
the padded path on the CPU), `off` (for A/B runs on the GPU)."""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache

import mlx.core as mx
import numpy as np

from ssdmoe_tui.engine.experts.device_memory import is_cuda

PAD_ENV = "SSDMOE_QMM_PAD"
PAD_MODES = ("auto", "on", "off")
# The kernel's smallest row tile (16) bounds how far past a batch's one row it reads.
PAD_ROWS = 16
# gather_qmm's dispatch (mlx/backend/cuda/quantized/quantized.cpp): fewer rows -> gather_qmv
MIN_TILED_ROWS = 8


def pad_mode() -> str:
    """`$SSDMOE_QMM_PAD`, checked: one clear line for a bad value."""
    from ssdmoe_tui.options import env_choice

    return env_choice(PAD_ENV, PAD_MODES)


def pads(mode: str) -> bool:
    """Whether calls are guarded in `mode`: `auto` on MLX-CUDA's GPU only."""
    if mode == "auto":
        return is_cuda()
    return mode == "on"


def tiled(x: mx.array, rows: int, out_width: int, bits: int, group_size: int, mode: str) -> bool:
    """True when MLX-CUDA would run this `gather_qmm` call on `qmm_sm80_kernel`."""
    k = x.shape[-1]
    return (
        rows >= MIN_TILED_ROWS
        and x.dtype in (mx.float16, mx.bfloat16)
        and bits in (4, 8)
        and mode == "affine"
        and out_width % 128 == 0
        and k % max(64, group_size) == 0
    )


@lru_cache(maxsize=64)
def _with_tail(n: int, extra: int) -> np.ndarray:
    """0..n-1, then n-1 `extra` times: which entry of x each entry of the copy holds, so
    the slack behind x's n entries is filled from inside it (its values are never used)."""
    idx = np.minimum(np.arange(n + extra), n - 1).astype(np.uint32)
    idx.flags.writeable = False  # shared by every caller of this shape
    return idx


@lru_cache(maxsize=64)
def _axis_index(n: int, extra: int) -> mx.array:
    """`_with_tail` as an array for `mx.take` along axis 0 (a long chunk's copies)."""
    return mx.array(_with_tail(n, extra))


@lru_cache(maxsize=32)
def _full_index(shape: tuple[int, ...], extra: int) -> mx.array:
    """`_with_tail` broadcast to the copy's whole shape, for `mx.take_along_axis`: with
    an index of the output's shape it is one `GatherAxis` node, where `mx.take` is a
    gather and a squeeze (scripts/graph_ops.py). Kept per shape: decode's shapes repeat
    step after step, and each is at most `FULL_INDEX_MAX` entries."""
    idx = _with_tail(shape[0], extra).reshape((-1,) + (1,) * (len(shape) - 1))
    return mx.array(np.ascontiguousarray(np.broadcast_to(idx, (shape[0] + extra, *shape[1:]))))


# Entries of a full-shape index at most (1 MiB of uint32): decode's and a verify pass's
# activations; a long prefill chunk's are copied with `mx.take` instead.
FULL_INDEX_MAX = 1 << 18


def _index(shape: tuple[int, ...]) -> tuple[mx.array, bool]:
    """The copy's index for an x of `shape` (ndim >= 2) and whether it has the copy's
    whole shape (`take_along_axis`, one node) or is one entry per row (`take`)."""
    n = shape[0]
    per = 1  # rows of x (its last axis's vectors) under one entry of axis 0
    for d in shape[1:-1]:
        per *= d
    extra = -(-PAD_ROWS // max(per, 1))
    if (n + extra) * per * shape[-1] <= FULL_INDEX_MAX:
        return _full_index(shape, extra), True
    return _axis_index(n, extra), False


def _copy(x: mx.array, index: mx.array, along: bool) -> mx.array:
    return mx.take_along_axis(x, index, axis=0) if along else mx.take(x, index, axis=0)


def padded(x: mx.array) -> mx.array:
    """A copy of `x` (ndim >= 2) with entries along axis 0 behind its own, together at
    least `PAD_ROWS` rows of its last axis, each a copy of x's last entry: one gather
    kernel."""
    return _copy(x, *_index(tuple(x.shape)))


def with_slack(x: mx.array) -> mx.array:
    """`x` as a view of the first entries (axis 0) of `padded(x)`: the same shape and
    strides, so the same kernel; two graph nodes a call (a `GatherAxis` and a slice)
    where the copy is small, three (`Gather`, `Squeeze`, slice) where it is not."""
    if x.ndim < 2 or x.size == 0:
        return x
    return padded(x)[: x.shape[0]]


_UNSET = object()


class Guards:
    """Which of a layer's expert calls need the slack, decided once per shape.

    Deciding (`tiled`) and building the copy's index cost ~5 us of Python a call on the
    development VM, more than the copy's two graph nodes themselves (~3 us); decode
    repeats its shapes step after step (96 guarded calls a step on the Qwen3-30B shape,
    whose MLX-CUDA batch step is host-bound: the guard's graph build showed there,
    docs/benchmarks.md), so the decision and the index are kept per key (projection,
    shape, dtype, rows). Bounded: a prefill's chunk lengths vary, so the table starts
    over past `MAX_SHAPES`."""

    MAX_SHAPES = 64

    def __init__(self) -> None:
        self._plans: dict[tuple, tuple[mx.array, bool, int] | None] = {}

    def apply(self, key: tuple, x: mx.array, needs: Callable[[], bool]) -> mx.array:
        """`with_slack(x)` where `needs()` (asked once per `key`) says the call is
        tiled, else `x` itself."""
        plan = self._plans.get(key, _UNSET)
        if plan is _UNSET:
            plan = None
            if x.ndim >= 2 and x.size and needs():
                plan = (*_index(tuple(x.shape)), x.shape[0])
            if len(self._plans) >= self.MAX_SHAPES:
                self._plans.clear()
            self._plans[key] = plan
        if plan is None:
            return x
        index, along, n = plan  # inline, not `_copy`: this runs 96 times a decode step
        if along:
            return mx.take_along_axis(x, index, axis=0)[:n]
        return mx.take(x, index, axis=0)[:n]

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
guarded call (`take` of x along its first axis with the last entry repeated behind
it; the slack's values are never used), on MLX-CUDA only. It was `mx.pad`, two kernels (a
fill of the whole buffer, then the copy), whose cost showed in batches every expert held
(H100, 2026-12-07 thirteenth session, the engine against BatchGenerator in alternating
processes, B = 4 / 8: guard off 0.937 / 1.026x and 0.993 / 1.120x, on 0.949 / 0.889x and
0.790 / 0.750x); the one-kernel copy is not yet measured there.

`SSDMOE_QMM_PAD`: `auto` (default: on under MLX-CUDA), `on` (everywhere: the tests run
the padded path on the CPU), `off` (for A/B runs on the GPU)."""

from __future__ import annotations

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
def _with_tail(n: int, extra: int) -> mx.array:
    """0..n-1, then n-1 `extra` times: a gather's index that copies n entries and fills
    the slack behind them from inside the array (one per shape, as the calls' shapes
    repeat step after step)."""
    return mx.array(np.minimum(np.arange(n + extra), n - 1).astype(np.uint32))


def with_slack(x: mx.array) -> mx.array:
    """`x` as a view of the first entries (axis 0) of a copy at least `PAD_ROWS` rows
    longer: one gather and one slice (no reshapes), so two graph nodes a call."""
    n = x.shape[0]
    if n == 0 or x.ndim < 2:
        return x
    per = 1  # rows of x (its last axis's vectors) under one entry of axis 0
    for d in x.shape[1:-1]:
        per *= d
    if per == 0:
        return x
    return mx.take(x, _with_tail(n, -(-PAD_ROWS // per)), axis=0)[:n]

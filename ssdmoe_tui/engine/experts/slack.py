"""Slot arrays with one spare slot behind the slots they hand out.

MLX-CUDA 0.32's tiled `gather_qmm` kernel (`qmm_sm80_kernel`, 8 rows or more) reads past
the end of its operands: past x's last row (engine/model/qmm_guard.py guards that) and past
the last expert of its weights array. Measured on the H100 (2026-12-05, compute-sanitizer,
the demo's speculative verify with the x guard on): "Invalid __global__ read of size 4
bytes ... 1 bytes after the nearest allocation ... of size 2,097,152 bytes", a slot bank
of the demo's 128 experts (16 KiB each), whose last slot ends its allocation exactly; the
process then aborts with "an illegal memory access was encountered". mlx-lm's resident
layers stack each layer's experts the same way (upstream: ml-explore/mlx#3487).

Every slot array is therefore allocated `SPARE_SLOTS` slots longer and kept as a view of
its first `n` slots: the same shape, strides and address, so the kernel, its arithmetic
and the reader's destinations are unchanged; no index ever names the spare slot, which
only absorbs the read past the end. It costs one slot per bank and component, on every
platform (one code path, which the CPU tests run).
"""

from __future__ import annotations

import mlx.core as mx

SPARE_SLOTS = 1


def slot_array(n: int, shape: tuple[int, ...], dtype: mx.Dtype) -> mx.array:
    """Zeros of shape (n, *shape), evaluated, with `SPARE_SLOTS` more slots behind them
    in the same allocation (zeros, never handed out)."""
    full = mx.zeros((n + SPARE_SLOTS, *shape), dtype=dtype)
    view = full[:n]
    mx.eval(view)
    return view

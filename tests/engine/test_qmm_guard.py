"""The slack behind an expert matmul's activations (engine/model/qmm_guard.py): the padded
view computes bit for bit what the plain array does, the guard fires exactly where MLX-CUDA
dispatches `gather_qmm` to its tiled kernel, and a bad `SSDMOE_QMM_PAD` is one line. The
over-read itself only happens on MLX-CUDA: scripts/gpu_qmm_guard.sh checks it there under
compute-sanitizer."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from ssdmoe_tui.engine.model import qmm_guard
from ssdmoe_tui.errors import BadValueError

E, N, D = 8, 256, 128


def _weights(bits: int = 4, group_size: int = 32):
    w = mx.random.normal((E, N, D), key=mx.random.key(1)).astype(mx.bfloat16)
    return mx.quantize(w, group_size=group_size, bits=bits)


@pytest.mark.parametrize("rows", [12, 192])
@pytest.mark.parametrize("sort", [True, False])
def test_the_padded_view_computes_the_same_bits(rows: int, sort: bool) -> None:
    wq, scales, biases = _weights()
    if sort:  # the sorted prefill path: one row per batch, indices in order
        x = mx.random.normal((rows, 1, D), key=mx.random.key(2)).astype(mx.bfloat16)
        idx = mx.sort(mx.random.randint(0, E, (rows,), key=mx.random.key(3))).astype(mx.uint32)
    else:  # decode / verify: tokens x top-k against one row of x per token
        x = mx.random.normal((1, rows // 4, 1, 1, D), key=mx.random.key(2)).astype(mx.bfloat16)
        idx = mx.random.randint(0, E, (1, rows // 4, 4), key=mx.random.key(3)).astype(mx.uint32)
    padded = qmm_guard.with_slack(x)
    assert padded.shape == x.shape and padded.dtype == x.dtype
    kw = dict(rhs_indices=idx, transpose=True, group_size=32, bits=4, sorted_indices=sort)
    plain = mx.gather_qmm(x, wq, scales, biases, **kw)
    guarded = mx.gather_qmm(padded, wq, scales, biases, **kw)
    assert np.array_equal(np.array(plain.astype(mx.float32)), np.array(guarded.astype(mx.float32)))
    assert qmm_guard.tiled(x, idx.size * x.shape[-2], N, 4, 32, "affine")


@pytest.mark.parametrize(
    "shape",
    [
        (4, 1, 1, D),  # decode, B = 4: one row an entry, 16 entries behind
        (4, 8, 1, D),  # the down projection's input at K = 8: 2 entries of 8 rows behind
        (64, 1, D),  # a sorted call of 64 rows
        (2100, 1, D),  # a long chunk's sorted call: over FULL_INDEX_MAX, taken by the axis
    ],
)
def test_the_copy_holds_x_then_its_last_entry_for_at_least_the_tile(shape) -> None:
    x = mx.random.normal(shape, key=mx.random.key(4)).astype(mx.bfloat16)
    full = qmm_guard.padded(x)
    n, per = shape[0], int(np.prod(shape[1:-1]))
    behind = full.shape[0] - n
    assert full.shape[1:] == x.shape[1:] and full.dtype == x.dtype
    assert behind * per >= qmm_guard.PAD_ROWS > (behind - 1) * per
    got = np.array(full.astype(mx.float32))
    want = np.array(x.astype(mx.float32))
    assert np.array_equal(got[:n], want)
    assert np.array_equal(got[n:], np.broadcast_to(want[-1:], got[n:].shape))
    small = full.shape[0] * per * D <= qmm_guard.FULL_INDEX_MAX
    assert small == (shape[0] < 2000)  # both ways of copying are taken here
    view = qmm_guard.with_slack(x)
    assert view.shape == x.shape and np.array_equal(np.array(view.astype(mx.float32)), want)


def test_a_layers_guards_decide_once_per_shape_and_copy_as_with_slack() -> None:
    """`Guards` (what a streamed layer calls): the same view as `with_slack` where the
    call is tiled, x itself where not, the decision asked once per key, both ways of
    copying, and a table that starts over past `MAX_SHAPES` (a prefill's chunk lengths
    vary)."""
    guards = qmm_guard.Guards()
    asked = []

    def needs(answer: bool):  # noqa: ANN202
        def ask() -> bool:
            asked.append(answer)
            return answer

        return ask

    for shape in [(2, 1, 1, D), (2, 8, 1, D), (2100, 1, D)]:
        x = mx.random.normal(shape, key=mx.random.key(5)).astype(mx.bfloat16)
        for _ in range(3):
            y = guards.apply(("down", shape), x, needs(True))
            assert y is not x and y.shape == x.shape and mx.array_equal(y, x).item()
            assert mx.array_equal(y, qmm_guard.with_slack(x)).item()
        index, _along, n = guards._plans[("down", shape)]
        per = int(np.prod(shape[1:-1]))
        assert n == shape[0] and (index.shape[0] - n) * per >= qmm_guard.PAD_ROWS
        assert guards.apply(("up", shape), x, needs(False)) is x
        assert guards.apply(("up", shape), x, needs(True)) is x  # decided: not asked again
    assert asked == [True, False] * 3
    for n in range(qmm_guard.Guards.MAX_SHAPES + 1):
        guards.apply(("chunk", n), mx.zeros((n + 1, 1, D), dtype=mx.bfloat16), needs(True))
    assert len(guards._plans) <= qmm_guard.Guards.MAX_SHAPES


def test_the_guard_fires_where_mlx_cuda_tiles_and_nowhere_else() -> None:
    x = mx.zeros((1, 3, 1, 1, D), dtype=mx.bfloat16)
    assert qmm_guard.tiled(x, 12, N, 4, 32, "affine")
    assert qmm_guard.tiled(x, 8, N, 8, 64, "affine")
    assert not qmm_guard.tiled(x, 7, N, 4, 32, "affine")  # gather_qmv's calls
    assert not qmm_guard.tiled(x.astype(mx.float32), 12, N, 4, 32, "affine")  # CPU's float32
    assert not qmm_guard.tiled(x, 12, 200, 4, 32, "affine")  # width not a multiple of 128
    assert not qmm_guard.tiled(x, 12, N, 4, 256, "affine")  # D not a multiple of the group
    assert not qmm_guard.tiled(x, 12, N, 3, 32, "affine")
    assert not qmm_guard.tiled(x, 12, N, 4, 32, "mxfp4")


def test_the_mode_is_read_once_and_a_bad_value_is_one_line(monkeypatch) -> None:
    monkeypatch.setenv(qmm_guard.PAD_ENV, "sometimes")
    with pytest.raises(
        BadValueError, match=r"SSDMOE_QMM_PAD='sometimes': use one of auto, on, off"
    ):
        qmm_guard.pad_mode()
    monkeypatch.setenv(qmm_guard.PAD_ENV, " ON ")
    assert qmm_guard.pad_mode() == "on"
    assert qmm_guard.pads("on") and not qmm_guard.pads("off")
    assert not qmm_guard.pads("auto")  # this process runs MLX on the CPU


def test_a_bfloat16_streamed_run_with_the_guard_forced_on_stays_exact(
    checkpoints, monkeypatch
) -> None:
    """The layer's wiring: forced on, a bfloat16 run (the dtype MLX-CUDA runs) pads the
    down projection's input (this checkpoint's only tiled shape: 128 wide, 64 in) on the
    prompt's sorted call, and decodes plain mlx-lm's tokens, as it does unguarded."""
    from tests.helpers.exact import engine_tokens, reference_tokens

    path = checkpoints("qwen3_moe")
    fired = []
    real = qmm_guard.Guards.apply

    def counted(self, key: tuple, x: mx.array, needs) -> mx.array:  # noqa: ANN001
        y = real(self, key, x, needs)
        if y is not x:
            fired.append(tuple(x.shape))
        return y

    monkeypatch.setattr(qmm_guard.Guards, "apply", counted)
    tokens = {}
    for mode in ("off", "on"):
        monkeypatch.setenv(qmm_guard.PAD_ENV, mode)
        fired.clear()
        _sm, prompt, res = engine_tokens(path, None, "1G", dtype="bfloat16")
        tokens[mode] = res.tokens
        assert bool(fired) == (mode == "on")
    assert tokens["on"] == tokens["off"] == reference_tokens(path, None, mx.bfloat16, prompt)

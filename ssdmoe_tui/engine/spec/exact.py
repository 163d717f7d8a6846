"""Exact verify (opt-in, `--exact-verify`): a verify chunk computed in one-token decode's
shapes, so its logits are the ones decode would give at each position on any device.

Why: a chunk of d + 1 tokens runs other kernels than a one-token step where an op's
kernel depends on its row count. On the CPU none does (the difference is 0.0); on
MLX-CUDA a chunk of 2-5 tokens gave logits up to 0.28 away from decode and flipped
near-tie argmaxes (docs/benchmarks.md), so a verify pass there cannot promise plain
greedy's tokens. Which ops differ is the device's business; what is known to depend on
the row count is the token mixers (SDPA's one-query vector kernel against the chunk's
causal kernel, the GatedDeltaNet / Mamba conv1d over state + 1 row against state + L
rows, the recurrences' one-step path) and the dense matmuls (a 1-row quantized matmul is
a matrix-vector kernel, 2-5 rows another since MLX 0.32 on Metal, a tiled GEMM on CUDA).

How, by construction rather than by precision: while `rows()` is entered, the model's
modules whose result may depend on the row count compute each chunk position as decode
would, with decode's shapes:

- `mixers`: each decoder layer's token mixer (a child module that takes the KV cache:
  attention, linear attention, Mamba) is called once per token, its cache advancing as
  decode advances it, with decode's mask for one token (None);
- `dense`: every Linear / QuantizedLinear outside the mixers (the routers, shared
  experts, dense MLPs, the LM head; a tied head's `as_linear`) runs one row per call;
- `norms`: every RMSNorm outside the mixers, one row per call.

On the CPU the routed experts are left as they are: mlx-lm's `gather_qmm` already
computes each (token, expert) pair as its own one-row product at a chunk's sizes (below
the sort threshold of 64 rows), as decode does; on MLX-CUDA it does not (a tiled kernel
from 8 rows), so `device_parts()` splits them there too. Elementwise ops, softmax and
top-k over a row compute each element or row alone. Two parts are not in the CPU
default, for the probe (scripts/exact_verify_probe.py) to measure on a device: `experts`
splits each MoE block
(router, routed experts, shared expert) row by row too, in case a device's `gather_qmm`
kernel depends on its batch (each row then syncs and looks up its experts alone, as
decode does); `sdpa` splits only the attention kernel, each query row against the keys
up to its position with no mask (decode's one-query call), the projections around it
left batched: the cheap answer should a device's matmuls prove row-invariant and its
attention not; `f32` is qwisp's recipe instead of splitting: the chunk's attention
(SDPA) and conv1d in float32, cast back (a closer value, not decode's kernels).

The swap is per call: each module's class is replaced by a subclass that splits rows,
and put back on leaving (so decode steps run mlx-lm's classes untouched and a class
another part of the engine swapped in, the router-mass probe, is kept underneath).
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from contextlib import contextmanager

import mlx.core as mx
import mlx.nn as nn

MIXERS, DENSE, NORMS, EXPERTS, SDPA, F32 = "mixers", "dense", "norms", "experts", "sdpa", "f32"
PARTS = (MIXERS, DENSE, NORMS, EXPERTS, SDPA, F32)
DEFAULT_PARTS = frozenset({MIXERS, DENSE, NORMS})
# On MLX-CUDA the routed experts depend on the row count too: gather_qmm runs its tiled
# kernel from 8 rows (a 2-token chunk at K = 4) where decode's K rows run gather_qmv. On
# the H100 (2026-12-05, the demo, scripts/exact_verify_probe.py) the default parts left a
# chunk 1.78 logits from decode; with the experts split too, 0.0 at 2-5 tokens.
CUDA_PARTS = DEFAULT_PARTS | {EXPERTS}


def device_parts() -> frozenset[str]:
    """The parts `--exact-verify` splits on this device (CUDA_PARTS under MLX-CUDA)."""
    from ssdmoe_tui.engine.experts.device_memory import is_cuda

    return CUDA_PARTS if is_cuda() else DEFAULT_PARTS


MASKS = ("mask", "attention_mask")


def _params(cls: type) -> list[str] | None:
    """The names of `cls.__call__`'s parameters after self (None: not introspectable)."""
    try:
        return list(inspect.signature(cls.__call__).parameters)[1:]
    except (TypeError, ValueError):  # pragma: no cover - a builtin __call__
        return None


def _takes_cache(module: nn.Module) -> bool:
    return "cache" in (_params(type(module)) or [])


def _mixer_refusal(module: nn.Module) -> str | None:
    """Why this mixer cannot be run token by token as decode runs it, or None. Supported:
    called as (x[, mask], cache). Another argument (a position offset, a shared KV state,
    a per-position scale) is per chunk, not per token: splitting would be wrong."""
    names = _params(type(module)) or []
    extra = [n for n in names[1:] if n not in (*MASKS, "cache")]
    if extra:
        return f"{type(module).__name__} also takes {', '.join(extra)}"
    return None


def _token_mask(mask, i: int, n: int, memo: dict):  # noqa: ANN001, ANN202
    """Decode's mask for chunk token i of n: None where the chunk's is None or "causal"
    (decode passes none for one token), else the chunk mask's row i over the keys up to
    that token (attention: (..., n, S) -> (..., 1, S - n + i + 1); a state-space mask,
    (B, n) -> (B, 1)), and None where that row masks nothing (what decode passes then,
    but for a windowed KVCache before its window bites, which passes the all-true row)."""
    if mask is None or isinstance(mask, str):
        return None
    key = (id(mask), i)
    if key not in memo:
        if mask.ndim >= 2 and mask.shape[-2] == n:
            row = mask[..., i : i + 1, : mask.shape[-1] - n + i + 1]
        else:
            row = mask[..., i : i + 1]
        free = mx.all(row) if row.dtype == mx.bool_ else mx.all(row == 0)
        memo[key] = None if free.item() else row
    return memo[key]


def _rows(x: mx.array) -> list[mx.array] | None:
    """x's rows in decode's shape (one row, the other dims kept), None if x is one row."""
    if x.ndim < 2:
        return None
    lead = x.shape[:-1]
    n = 1
    for s in lead:
        n *= s
    if n == 1:
        return None
    if n == x.shape[-2]:  # (1, ..., L, D): slice along the token axis, decode's (1, 1, D)
        return [x[..., i : i + 1, :] for i in range(n)]
    flat = x.reshape(n, x.shape[-1])
    return [flat[i : i + 1] for i in range(n)]


def _join(parts: list[mx.array], x: mx.array) -> mx.array:
    if parts[0].ndim == x.ndim and parts[0].shape[:-2] == x.shape[:-2]:
        return mx.concatenate(parts, axis=-2)
    return mx.concatenate(parts, axis=0).reshape(*x.shape[:-1], -1)


_CLASSES: dict[tuple[type, str], type] = {}
_MEMO: dict = {}  # per `rows()`: each chunk mask's per-token rows (one host read each)


def _exact_class(cls: type, part: str) -> type:
    """`cls` with its call (or a tied head's `as_linear`) split as `part` says."""
    key = (cls, part)
    if key in _CLASSES:
        return _CLASSES[key]
    if part == MIXERS:
        sig = inspect.signature(cls.__call__)  # once per class: binding is per call
        names = list(sig.parameters)[1:]
        arg = names[0]
        mask_name = next((n for n in names if n in MASKS), None)

        def __call__(self, *args, **kw):  # noqa: ANN002, ANN003, ANN202
            base = super(sub, self).__call__
            bound = sig.bind(self, *args, **kw)
            bound.apply_defaults()
            a = bound.arguments
            x, mask = a[arg], a.get(mask_name) if mask_name else None
            if x.ndim != 3 or x.shape[0] != 1 or x.shape[1] == 1:
                return base(*args, **kw)  # one token already, or a batch: as it is
            n, outs = x.shape[1], []
            for i in range(n):
                a[arg] = x[:, i : i + 1]
                if mask_name:
                    a[mask_name] = _token_mask(mask, i, n, _MEMO)
                outs.append(base(*bound.args[1:], **bound.kwargs))
            return mx.concatenate(outs, axis=1)

        attrs = {"__call__": __call__}
    elif part == "head":

        def as_linear(self, x):  # noqa: ANN001, ANN202
            base = super(sub, self).as_linear
            rows = _rows(x)
            return base(x) if rows is None else _join([base(r) for r in rows], x)

        attrs = {"as_linear": as_linear}
    elif part == EXPERTS:

        def __call__(self, x, *a, **kw):  # noqa: ANN001, ANN202
            base = super(sub, self).__call__
            rows = _rows(x)
            if rows is None:
                return base(x, *a, **kw)
            outs = []
            for r in rows:  # each evaluated before the next row's misses take slots
                outs.append(base(r, *a, **kw))  # (a slot is reused only once the work
                mx.eval(outs[-1])  # reading it is done: docs/engine.md)
            return _join(outs, x)

        attrs = {"__call__": __call__}
    elif part == F32:

        def __call__(self, x):  # noqa: ANN001, ANN202 - nn.Conv1d in float32
            if x.dtype == mx.float32:
                return super(sub, self).__call__(x)
            y = mx.conv1d(
                x.astype(mx.float32), self.weight.astype(mx.float32), self.stride,
                self.padding, self.dilation, self.groups,
            )  # fmt: skip
            if "bias" in self:
                y = y + self.bias.astype(mx.float32)
            return y.astype(x.dtype)

        attrs = {"__call__": __call__}
    else:  # DENSE, NORMS: one row per call

        def __call__(self, x, *a, **kw):  # noqa: ANN001, ANN202
            base = super(sub, self).__call__
            rows = _rows(x)
            return (
                base(x, *a, **kw) if rows is None else _join([base(r, *a, **kw) for r in rows], x)
            )

        attrs = {"__call__": __call__}
    sub = type(f"Exact{cls.__name__}", (cls,), attrs)
    _CLASSES[key] = sub
    return sub


def _children(layer: nn.Module) -> list[nn.Module]:
    """A decoder layer's child modules, those in a list (two attentions) included."""
    out = []
    for c in layer.children().values():
        out += [m for m in c if isinstance(m, nn.Module)] if isinstance(c, list | tuple) else [c]
    return [m for m in out if isinstance(m, nn.Module)]


def _is_norm(m: nn.Module) -> bool:
    """RMSNorm / LayerNorm, or a family's own norm of one input (named ...Norm)."""
    if isinstance(m, nn.RMSNorm | nn.LayerNorm):
        return True
    return type(m).__name__.endswith("Norm") and len(_params(type(m)) or []) == 1


def _f32_sdpa(sdpa):  # noqa: ANN001, ANN202
    def call(q, k, v, *a, **kw):  # noqa: ANN001, ANN202
        if q.dtype == mx.float32:
            return sdpa(q, k, v, *a, **kw)
        f = mx.float32
        return sdpa(q.astype(f), k.astype(f), v.astype(f), *a, **kw).astype(q.dtype)

    return call


def _split_sdpa(sdpa):  # noqa: ANN001, ANN202
    def call(q, k, v, *a, mask=None, **kw):  # noqa: ANN001, ANN202
        n = q.shape[2]
        if n == 1 or q.shape[0] != 1 or not (mask is None or isinstance(mask, str)):
            return sdpa(q, k, v, *a, mask=mask, **kw)
        off = k.shape[2] - n  # the keys before the chunk
        return mx.concatenate(
            [
                sdpa(
                    q[:, :, i : i + 1],
                    k[:, :, : off + i + 1],
                    v[:, :, : off + i + 1],
                    *a,
                    mask=None,
                    **kw,
                )
                for i in range(n)
            ],
            axis=2,
        )

    return call


class ExactVerify:
    """The modules of one model that `rows()` splits (built once per model: a walk of
    its module tree; entering costs one class assignment per module)."""

    def __init__(self, model: nn.Module, parts: frozenset[str] | set[str] | None = None) -> None:
        """`parts`: what to split (None: this device's, `device_parts()`)."""
        parts = device_parts() if parts is None else parts
        unknown = set(parts) - set(PARTS)
        if unknown:
            raise ValueError(f"exact verify: unknown parts {sorted(unknown)}")
        self.parts = frozenset(parts)
        self.model = model
        self._targets: list[tuple[nn.Module, str]] = []
        mixers: set[int] = set()
        layers = list(getattr(model, "layers", None) or [])  # mlx-lm's models all say
        if not layers:
            from ssdmoe_tui.errors import ModelError

            raise ModelError(f"--exact-verify: {type(model).__name__} lists no decoder layers")
        refusals = []
        for layer in layers:
            for child in _children(layer):
                if _takes_cache(child):
                    mixers.add(id(child))
                    if MIXERS in self.parts:
                        why = _mixer_refusal(child)
                        if why:
                            refusals.append(why)
                        self._targets.append((child, MIXERS))
        if refusals:
            from ssdmoe_tui.errors import ModelError

            raise ModelError(
                f"--exact-verify: {refusals[0]}: its verify chunk cannot be computed token by "
                "token as decode computes it (exact verify runs mixers called as (x, mask, cache))"
            )
        skip = set(mixers)
        from ssdmoe_tui.engine.model.streamed import StreamedSwitch

        if EXPERTS in self.parts:  # a layer's child holding routed experts: its block
            for layer in layers:
                for child in _children(layer):
                    if id(child) not in mixers and any(
                        isinstance(m, StreamedSwitch) for _, m in child.named_modules()
                    ):
                        self._targets.append((child, EXPERTS))
                        skip.add(id(child))

        seen: set[int] = set()
        for _, m in model.named_modules():
            if id(m) in seen:
                continue
            seen.add(id(m))
            if isinstance(m, StreamedSwitch) or id(m) in skip:
                skip.update(id(c) for _, c in m.named_modules())
        for _, m in model.named_modules():
            if id(m) in skip:
                continue
            skip.add(id(m))
            if isinstance(m, nn.Linear | nn.QuantizedLinear) and DENSE in self.parts:
                self._targets.append((m, DENSE))
            elif isinstance(m, nn.Embedding | nn.QuantizedEmbedding) and DENSE in self.parts:
                self._targets.append((m, "head"))  # a tied head: as_linear
            elif _is_norm(m) and NORMS in self.parts:
                self._targets.append((m, NORMS))
        if F32 in self.parts:
            self._targets += [
                (m, F32) for _, m in model.named_modules() if isinstance(m, nn.Conv1d)
            ]
        self.counts = {p: sum(1 for _, q in self._targets if q == p) for p in {*PARTS, "head"}}

    @contextmanager
    def rows(self) -> Iterator[None]:
        """Inside: the model's calls compute each position as one-token decode does (the
        graph is built here; MLX evaluates it lazily later, with the same kernels)."""
        put: list[tuple[nn.Module, type]] = []
        sdpa = mx.fast.scaled_dot_product_attention
        _MEMO.clear()
        try:
            for m, part in self._targets:
                cls = type(m)
                m.__class__ = _exact_class(cls, part)
                put.append((m, cls))
            if F32 in self.parts:
                mx.fast.scaled_dot_product_attention = _f32_sdpa(sdpa)
            elif SDPA in self.parts:
                mx.fast.scaled_dot_product_attention = _split_sdpa(sdpa)
            yield
        finally:
            mx.fast.scaled_dot_product_attention = sdpa
            _MEMO.clear()
            for m, cls in reversed(put):
                m.__class__ = cls

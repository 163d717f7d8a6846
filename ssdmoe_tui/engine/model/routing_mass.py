"""Router probability mass kept at the running K, as a share of the mass at the trained K.

Lowering K saves bytes and drops experts the router wanted; this measures how much of
the router's own preference is dropped. Per MoE layer and token:

    mass = sum of the router probabilities of the experts kept
           / sum of the router probabilities of the experts it picks at the trained K

and a token's mass is the mean over the MoE layers. It is 1.0 (100 %) at the trained
K, below 1 when K is lower, above 1 when K is higher.

"Router probabilities" follow the family's routing function (`Architecture.routing` in
checkpoint/arch.py, each as mlx-lm computes its gate):
- softmax (Qwen3, Qwen3.5, Qwen3-Next, Mixtral, gpt-oss...): softmax over all experts'
  logits; the top-K of it is kept. Mixtral and gpt-oss softmax only the top-K logits,
  which is the same selection as the top-K of the full softmax (softmax is monotonic);
  the mass uses that full softmax, as the Hugging Face implementations do.
- sigmoid (DeepSeek-V3 and Kimi K2, GLM-4.5/4.6, Nemotron-H): an independent sigmoid
  per expert; selection ranks sigmoid + a per-expert correction bias (within the top
  groups), and the output weights are the selected experts' plain sigmoids,
  renormalised (and scaled). The mass is the sum of the kept experts' sigmoids over
  the same sum for the experts selected at the trained K (the sigmoids are not a
  distribution, but the ratio is what the output weights lose before renormalisation
  and scaling).
- none: the family's figure is not measured (no mass is shown).

Cost: nothing unless asked. The meter is installed only by a consumer that shows it
(`StreamedModel.measure_routing_mass`: the app's engine thread, `generate`, `bench`,
`eval`); a model loaded without one runs mlx-lm's gates untouched. Installed, it adds
no kernel to a forward pass and never syncs: the gate's probe keeps a reference to the
logits mlx-lm computes anyway, and the streamed block a reference to the indices it
runs. At the trained K the kept experts *are* the trained-K selection, so the mass is
1 by definition and nothing is kept at all. Below or above it, the arithmetic (softmax
or sigmoid, top-K, the ratio) is built only when a figure is read (`resolve`, `take`),
in one batched graph over every layer and token waiting (a handful of kernels and one
sync per read, not per layer or per token). Only decode steps (one token per sequence)
are measured unless `all_tokens` is set (`ssdmoe eval` teacher-forces whole texts), so
long prefills keep no arrays alive.
"""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx
import mlx.nn as nn
import numpy as np

# Kept (layer, token) rows before a forced resolve: ~85 tokens of a 48-layer model, so a long
# turn nobody reads holds a few thousand small arrays at most (one batched sync per flush).
MAX_PENDING_ROWS = 4096


@dataclass(frozen=True)
class _Row:
    """One MoE layer of one pass: the gate's logits and the experts the block ran."""

    kind: str  # "softmax" (qwen, mixtral) | "sigmoid" (nemotron_h)
    logits: mx.array  # (..., E), as the gate computed them
    gate: object  # the gate module (nemotron: correction bias and groups); None for softmax
    indices: mx.array  # (..., K)

    @property
    def rows(self) -> int:
        return int(self.indices.size // self.indices.shape[-1])

    def key(self) -> tuple:
        k, e = int(self.indices.shape[-1]), int(self.logits.shape[-1])
        if self.kind == "sigmoid":
            return (self.kind, k, e, int(self.gate.n_group), int(self.gate.topk_group))
        return (self.kind, k, e)


@dataclass(frozen=True)
class PendingMass:
    """One forward pass's mass, not computed yet: `layers` measured MoE layers, of which
    `exact` ran at the trained K (mass 1) and the rest are `rows` to compute."""

    rows: tuple[_Row, ...]
    exact: int
    positions: int  # rows (tokens) per layer

    @property
    def layers(self) -> int:
        return len(self.rows) + self.exact


def _ratio(rows: list[_Row], trained_k: int) -> mx.array:
    """Kept / trained-K mass of every position of `rows` (one kind, K and E), flat."""
    e = rows[0].logits.shape[-1]
    k = rows[0].indices.shape[-1]
    logits = mx.concatenate([r.logits.reshape(-1, e) for r in rows]).astype(mx.float32)
    inds = mx.concatenate([r.indices.reshape(-1, k) for r in rows]).astype(mx.uint32)
    if rows[0].kind == "softmax":
        probs = mx.softmax(logits, axis=-1, precise=True)
        trained = mx.topk(probs, trained_k, axis=-1).sum(axis=-1)
    else:
        from mlx_lm.models.nemotron_h import group_expert_select

        g = rows[0].gate
        bias = mx.concatenate(
            [mx.broadcast_to(r.gate.e_score_correction_bias, (r.rows, e)) for r in rows]
        )
        probs = mx.sigmoid(logits)
        trained_inds = group_expert_select(
            logits, bias, trained_k, g.n_group, g.topk_group, 1.0, False
        )[0]
        trained = mx.take_along_axis(probs, trained_inds, axis=-1).sum(axis=-1)
    kept = mx.take_along_axis(probs, inds, axis=-1).sum(axis=-1)
    return kept / mx.maximum(trained, 1e-30)


def _grouped(rows: list[_Row], trained_k: int) -> list[tuple[list[int], mx.array]]:
    """Rows grouped by (kind, K, E): (positions in `rows`, their ratios concatenated)."""
    groups: dict[tuple, list[int]] = {}
    for i, r in enumerate(rows):
        groups.setdefault(r.key(), []).append(i)
    return [(m, _ratio([rows[i] for i in m], trained_k)) for m in groups.values()]


def resolve(pending: list[PendingMass | None], trained_k: int) -> list[float | None]:
    """Each pass's mass (mean over its positions of the mean over its layers), in one
    batched graph and one sync for all of them; None for a pass that measured nothing."""
    flat: list[_Row] = []
    owner: list[int] = []
    for i, p in enumerate(pending):
        if p is not None:
            flat.extend(p.rows)
            owner.extend([i] * len(p.rows))
    sums = np.zeros(len(pending))
    if flat:
        groups = _grouped(flat, trained_k)
        mx.eval([g[1] for g in groups])
        for members, ratio in groups:
            values = np.array(ratio, copy=False)
            start = 0
            for i in members:
                n = flat[i].rows
                sums[owner[i]] += float(values[start : start + n].mean())
                start += n
    return [
        None if p is None or p.layers == 0 else (sums[i] + p.exact) / p.layers
        for i, p in enumerate(pending)
    ]


class RoutingMass:
    """Keeps, per forward pass since `take()`, what its mass is computed from."""

    def __init__(self, trained_k: int) -> None:
        self.trained_k = trained_k
        self.all_tokens = False  # True: also measure multi-token (prefill) passes
        self._router: dict[int, tuple[str, mx.array, object]] = {}  # layer -> gate output
        self._rows: list[_Row] = []
        self._exact = 0
        self._positions = 0

    def note_router(self, layer: int, kind: str, logits: mx.array, gate: object = None) -> None:
        """The gate's probe: this layer's router logits for the pass being built."""
        self._router[layer] = (kind, logits, gate)

    def kept(self, layer: int, indices: mx.array) -> None:
        """The experts this layer runs (..., K): noted for the pass (no kernel, no sync)."""
        router = self._router.pop(layer, None)
        if router is None:
            return
        if not self.all_tokens and indices.ndim >= 2 and indices.shape[-2] != 1:
            return  # prefill chunk: not measured
        self._positions = int(indices.size // indices.shape[-1])
        if indices.shape[-1] == self.trained_k:
            self._exact += 1  # the trained-K selection itself: mass 1 by definition
            return
        self._rows.append(_Row(router[0], router[1], router[2], indices))

    def take_pending(self) -> PendingMass | None:
        """This pass's mass, not computed (`resolve` computes many at once); clears."""
        rows, exact, positions = self._rows, self._exact, self._positions
        self.clear()
        if not rows and not exact:
            return None
        return PendingMass(tuple(rows), exact, positions)

    def take(self) -> mx.array | None:
        """Per-position mass (mean over the layers recorded since the last call), lazy; clears."""
        p = self.take_pending()
        if p is None:
            return None
        total = mx.full((p.positions,), float(p.exact))
        for _, ratio in _grouped(list(p.rows), self.trained_k):
            total = total + ratio.reshape(-1, p.positions).sum(axis=0)
        return total / p.layers

    def clear(self) -> None:
        self._rows = []
        self._exact = 0
        self._positions = 0
        self._router.clear()

    def stash(self) -> tuple:
        """What the pass being built noted so far, set aside (and cleared) while another
        pass runs at one of its layer boundaries; `unstash` puts it back."""
        held = (self._rows, self._exact, self._positions, self._router)
        self._rows, self._exact, self._positions, self._router = [], 0, 0, {}
        return held

    def unstash(self, held: tuple) -> None:
        self._rows, self._exact, self._positions, self._router = held


class MassLog:
    """Per generated token, its pass's mass: kept unresolved until a figure is read, so
    decoding never waits on it (the Runner appends, readers call `values`)."""

    def __init__(self, trained_k: int) -> None:
        self.trained_k = trained_k
        self._values: list[float | None] = []
        self._pending: list[PendingMass | None] = []
        self._pending_rows = 0

    def append(self, pending: PendingMass | None) -> None:
        self._pending.append(pending)
        if pending is not None:
            self._pending_rows += len(pending.rows) * pending.positions
        if self._pending_rows > MAX_PENDING_ROWS:
            self._flush()  # a long turn nobody reads: bounded memory

    def append_value(self, value: float | None) -> None:
        """A mass already resolved: one row's of a batched pass (engine/run/batch.py
        syncs each step's tokens anyway, and a pass's pending mass covers all its rows)."""
        self._flush()
        self._values.append(value)

    def _flush(self) -> None:
        if self._pending:
            self._values.extend(resolve(self._pending, self.trained_k))
            self._pending, self._pending_rows = [], 0

    def values(self) -> list[float]:
        """Every token's mass so far (tokens with none measured are left out)."""
        self._flush()
        return [v for v in self._values if v is not None]

    def truncate(self, n: int) -> None:
        """Keep the first `n` tokens' entries."""
        self._flush()
        del self._values[n:]


def _probed_linear(cls: type) -> type:
    """A subclass of the gate's Linear / QuantizedLinear whose call also notes the logits."""
    if cls not in _PROBED:

        def __call__(self, x):
            logits = super(probed, self).__call__(x)
            meter, layer = self._ssdmoe_mass
            meter.note_router(layer, "softmax", logits)
            return logits

        probed = type(f"MassProbed{cls.__name__}", (cls,), {"__call__": __call__})
        _PROBED[cls] = probed
    return _PROBED[cls]


def _probed_sigmoid_gate(cls: type) -> type:
    """A sigmoid router module (a weight, a per-expert correction bias, groups: DeepSeek-V3's
    MoEGate, Nemotron-H's, GLM-4.5's): mlx-lm's own call, unchanged, which also notes the
    logits (`x @ weight.T`, built lazily: computed only when a figure is read)."""
    if cls not in _PROBED:

        def __call__(self, x):
            meter, layer = self._ssdmoe_mass
            meter.note_router(layer, "sigmoid", x @ self.weight.T, self)
            return super(probed, self).__call__(x)

        probed = type(f"MassProbed{cls.__name__}", (cls,), {"__call__": __call__})
        _PROBED[cls] = probed
    return _PROBED[cls]


_PROBED: dict[type, type] = {}


def install(switches: list, routers: list, trained_k: int, routing: str) -> RoutingMass:
    """Probe every MoE layer's router and hand the meter to its StreamedSwitch.

    `routing`: the family's router-mass function (checkpoint.arch.ROUTINGS). Call after
    quantization (which replaces a Linear gate with a QuantizedLinear): the probe is a
    subclass of the router's own class, so parameters, their paths and the arithmetic
    stay mlx-lm's. A router of another kind, or a family whose function is `none`, is
    left alone (its layer reports no mass), never a failed load.
    """
    meter = RoutingMass(trained_k)
    for switch, gate in zip(switches, routers, strict=True):
        if gate is None or routing == "none":
            continue
        cls = _unprobed(type(gate))
        if routing == "softmax" and isinstance(gate, nn.Linear | nn.QuantizedLinear):
            gate.__class__ = _probed_linear(cls)
        elif routing == "sigmoid" and all(
            hasattr(gate, a) for a in ("weight", "e_score_correction_bias", "n_group", "topk_group")
        ):
            gate.__class__ = _probed_sigmoid_gate(cls)
        else:
            continue  # a router this module does not know: no mass (None)
        object.__setattr__(gate, "_ssdmoe_mass", (meter, switch._layer))
        switch.set_mass_meter(meter)
    return meter


def uninstall(switches: list, routers: list) -> None:
    """Give every router back its mlx-lm class: the model runs as if never probed."""
    for switch, gate in zip(switches, routers, strict=True):
        if gate is not None:
            gate.__class__ = _unprobed(type(gate))
            gate.__dict__.pop("_ssdmoe_mass", None)
        switch.set_mass_meter(None)


def _unprobed(cls: type) -> type:
    return cls.__mro__[1] if cls in _PROBED.values() else cls

"""Router probability mass kept at the running K, as a share of the mass at the trained K.

Lowering K saves bytes and drops experts the router wanted; this measures how much of
the router's own preference is dropped. Per MoE layer and token:

    mass = sum of the router probabilities of the experts kept
           / sum of the router probabilities of the experts it picks at the trained K

and a token's mass is the mean over the MoE layers. It is 1.0 (100 %) at the trained
K, below 1 when K is lower, above 1 when K is higher.

"Router probabilities" per architecture (each as mlx-lm computes its gate):
- qwen3_moe, qwen3_5_moe: softmax over all experts' logits; the top-K of it is kept.
- mixtral: mlx-lm takes the top-K logits and softmaxes only those, which is the
  same selection as the top-K of the softmax over all experts (softmax is monotonic);
  the mass uses that full softmax, as the Hugging Face implementation does.
- nemotron_h: an independent sigmoid per expert; selection ranks sigmoid + a
  per-expert correction bias (within the top groups), and the output weights are the
  selected experts' plain sigmoids, renormalised. The mass is the sum of the kept
  experts' sigmoids over the same sum for the experts selected at the trained K (the
  sigmoids are not a distribution, but the ratio is what the output weights lose
  before renormalisation).

Cost: the gate already computes the logits; a probe on the gate keeps them (no second
matmul) and adds a softmax/sigmoid and a top-K over the experts per layer. Only decode
steps (one token per sequence) are measured unless `all_tokens` is set (`ssdmoe eval`
teacher-forces whole texts), so long prefills keep no extra arrays alive.
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn


class RoutingMass:
    """Collects one mass per (MoE layer, token) for the forward passes since `take()`."""

    def __init__(self, trained_k: int) -> None:
        self.trained_k = trained_k
        self.all_tokens = False  # True: also measure multi-token (prefill) passes
        self._router: dict[int, tuple[mx.array, mx.array]] = {}  # layer -> (probs, trained sum)
        self._layers: list[mx.array] = []

    def note_router(self, layer: int, probs: mx.array, trained_sum: mx.array) -> None:
        """The gate's probe: this layer's router probabilities for the pass being built."""
        self._router[layer] = (probs, trained_sum)

    def kept(self, layer: int, indices: mx.array) -> mx.array | None:
        """The experts this layer runs (..., K): records their share; returns it (lazy)."""
        router = self._router.pop(layer, None)
        if router is None:
            return None
        if not self.all_tokens and indices.ndim >= 2 and indices.shape[-2] != 1:
            return None  # prefill chunk: not measured
        probs, trained = router
        kept = mx.take_along_axis(probs, indices.astype(mx.uint32), axis=-1).sum(axis=-1)
        ratio = (kept / mx.maximum(trained, 1e-30)).reshape(-1)
        self._layers.append(ratio)
        return ratio

    def take(self) -> mx.array | None:
        """Per-token mass (mean over the layers recorded since the last call), lazy; clears."""
        layers, self._layers = self._layers, []
        self._router.clear()
        if not layers:
            return None
        return mx.mean(mx.stack(layers), axis=0)

    def clear(self) -> None:
        self._layers = []
        self._router.clear()


def _softmax_router(logits: mx.array, trained_k: int) -> tuple[mx.array, mx.array]:
    probs = mx.softmax(logits.astype(mx.float32), axis=-1, precise=True)
    return probs, mx.topk(probs, trained_k, axis=-1).sum(axis=-1)


_PROBED: dict[type, type] = {}


def _probed_linear(cls: type) -> type:
    """A subclass of the gate's Linear / QuantizedLinear whose call also notes the router."""
    if cls not in _PROBED:

        def __call__(self, x):
            logits = super(probed, self).__call__(x)
            meter, layer = self._ssdmoe_mass
            meter.note_router(layer, *_softmax_router(logits, meter.trained_k))
            return logits

        probed = type(f"MassProbed{cls.__name__}", (cls,), {"__call__": __call__})
        _PROBED[cls] = probed
    return _PROBED[cls]


def _probed_nemotron(cls: type) -> type:
    """nemotron_h's MoEGate: the same call as mlx-lm's, keeping the logits it computes."""
    if cls not in _PROBED:
        from mlx_lm.models.nemotron_h import group_expert_select

        def __call__(self, x):
            logits = x @ self.weight.T
            meter, layer = self._ssdmoe_mass
            out = group_expert_select(
                logits,
                self.e_score_correction_bias,
                self.top_k,
                self.n_group,
                self.topk_group,
                self.routed_scaling_factor,
                self.norm_topk_prob,
            )
            sig = mx.sigmoid(logits.astype(mx.float32))
            trained_inds = group_expert_select(
                logits,
                self.e_score_correction_bias,
                meter.trained_k,
                self.n_group,
                self.topk_group,
                1.0,
                False,
            )[0]
            trained = mx.take_along_axis(sig, trained_inds, axis=-1).sum(axis=-1)
            meter.note_router(layer, sig, trained)
            return out

        _PROBED[cls] = type(f"MassProbed{cls.__name__}", (cls,), {"__call__": __call__})
    return _PROBED[cls]


def install(blocks: list[nn.Module], trained_k: int) -> RoutingMass:
    """Probe every MoE block's gate and hand the meter to its StreamedSwitch.

    Call after quantization (which replaces a Linear gate with a QuantizedLinear):
    the probe is a subclass of the gate's own class, so parameters, their paths and
    the arithmetic stay mlx-lm's. A gate of another kind is left alone (its layer
    reports no mass), so a new architecture loads before it has a probe.
    """
    meter = RoutingMass(trained_k)
    for block in blocks:
        layer = block.switch_mlp._layer
        gate = block.gate
        cls = type(gate)
        if cls in _PROBED.values():
            cls = cls.__mro__[1]
        if isinstance(gate, nn.Linear | nn.QuantizedLinear):
            gate.__class__ = _probed_linear(cls)
        elif hasattr(gate, "e_score_correction_bias"):
            gate.__class__ = _probed_nemotron(cls)
        else:
            continue  # a gate this module does not know: no mass (None), never a failed load
        object.__setattr__(gate, "_ssdmoe_mass", (meter, layer))
        block.switch_mlp.set_mass_meter(meter)
    return meter

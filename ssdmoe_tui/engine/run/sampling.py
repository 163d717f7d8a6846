"""The one factory from sampling settings (`options.SamplingOptions`) to what the runner
and the batch apply: mlx-lm's sampler and its logits processors (penalties).

Every sampler in the package comes from here, so a new setting touches the edge that
parses it, `SamplingOptions` and this module, nothing else. Greedy decoding is mlx-lm's
own greedy sampler, so greedy output stays exactly mlx-lm's. Importing this module
imports MLX.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import mlx.core as mx

from ssdmoe_tui.options import SamplingOptions

Sampler = Callable[[mx.array], mx.array]  # log-probs (rows, vocab) -> token ids (rows,)


@functools.lru_cache(maxsize=64)
def _mlx_lm_sampler(temp: float, top_p: float, min_p: float, top_k: int) -> Sampler:
    """One mlx-lm sampler object per setting: batch rows holding the same object sample
    in one call (greedy is mlx-lm's one `greedy_sampler` whatever the other settings)."""
    from mlx_lm.sample_utils import make_sampler

    return make_sampler(temp, top_p=top_p, min_p=min_p, top_k=top_k)


def greedy() -> Sampler:
    """mlx-lm's greedy sampler (argmax)."""
    return _mlx_lm_sampler(0.0, 0.0, 0.0, 0)


def sampler_for(options: SamplingOptions, *, own_key: bool = False) -> Sampler:
    """mlx-lm's sampler for `options`, drawing from MLX's global key (whoever runs one
    sequence seeds it: `mx.random.seed`). `own_key`: a seeded sampling at temperature
    > 0 draws from a key of its own instead (`SeededSampler`), so its draws do not
    depend on the sequences sampled beside it (a batch row)."""
    if own_key and options.temp != 0 and options.seed is not None:
        return SeededSampler(
            options.temp, options.top_p, options.seed, min_p=options.min_p, top_k=options.top_k
        )
    return _mlx_lm_sampler(
        float(options.temp), float(options.top_p), float(options.min_p), int(options.top_k)
    )


def processors_for(options: SamplingOptions) -> list:
    """mlx-lm's logits processors for the penalties `options` sets (none: [])."""
    penalties = options.penalties()
    if not penalties:
        return []
    from mlx_lm.sample_utils import make_logits_processors

    return make_logits_processors(**penalties)


class SeededSampler:
    """mlx-lm's sampler (temperature, top-p, min-p, top-k: `make_sampler`'s chain, in its
    order) drawing from its own key.

    `mx.random.seed(s)` followed by mlx-lm's sampler splits the global key once per
    draw; this does the same split on a key of its own, so a seeded sequence draws the
    same tokens alone (the service seeds the global key) and in a batch (where other
    sequences draw too). Checked draw for draw against mlx-lm's in the tests."""

    def __init__(
        self, temp: float, top_p: float, seed: int, min_p: float = 0.0, top_k: int = 0
    ) -> None:
        self.temp = float(temp)
        self.top_p = float(top_p)
        self.min_p = float(min_p)
        self.top_k = int(top_k)
        self.key = mx.random.key(seed)

    def __call__(self, logprobs: mx.array) -> mx.array:
        from mlx_lm.sample_utils import apply_min_p, apply_top_k, apply_top_p

        self.key, sub = mx.random.split(self.key)
        if 0 < self.top_p < 1.0:
            logprobs = apply_top_p(logprobs, self.top_p)
        if self.min_p != 0.0:
            logprobs = apply_min_p(logprobs, self.min_p, 1)
        if self.top_k > 0:
            logprobs = apply_top_k(logprobs, self.top_k)
        return mx.random.categorical(logprobs * (1.0 / self.temp), key=sub)

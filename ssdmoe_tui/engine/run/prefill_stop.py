"""Stopping a prefill within a second: chunks sized by measured speed, undone mid-way.

A request that may be stopped (a client that can leave, the app's stop key) is asked at
every MoE layer of each prefill chunk (`streamed.PrefillGate`). Two things make that a
bound on the wait:

- `ChunkSizer`: one layer's share of a chunk must be short. Where every expert is
  resident the chunk is compute, and a 2,048-token chunk of the demo model on two CPU
  cores is ~2 s per layer; the chunk is sized from the previous one's measured speed so
  each layer's compute takes about `LAYER_TARGET_S`. Expert reads are left out of the
  measure: they do not shrink with the chunk (each chunk reads its union of experts
  again), so a disk-bound chunk keeps its size and its wait is one layer's reads. The
  size never exceeds the configured prefill step, so fast hardware keeps mlx-lm's chunks.
- `ChunkUndo`: a chunk stopped between layers has written its tokens into the caches of
  the layers before. Attention caches move their offset back (`trim`); recurrent state
  (Mamba, gated delta: `ArraysCache`) is put back from the references kept before the
  chunk (its layers rebind their state, never write into it). A cache that could not be
  undone exactly (a sliding window that would evict, a nested `CacheList`) is not asked
  mid-chunk: that chunk runs to its end, as before.
"""

from __future__ import annotations

from dataclasses import dataclass

LAYER_TARGET_S = 0.25  # compute per MoE layer between two stop checks
# A chunk expected to compute within this needs no extra sync in frozen layers to be
# stopped in time: its end comes soon enough (GPU chunks: milliseconds).
FROZEN_ASK_ABOVE_S = 0.5
FIRST_CHUNK = 128  # tokens, before anything is measured (the first stoppable prefill)
MIN_CHUNK = 32


@dataclass
class ChunkSizer:
    """Prefill chunk sizes for stoppable requests, from the last chunk's speed.

    `rate`: prefill tokens per second through one MoE layer (compute only), kept across
    requests so a request starts at the right size. Sizes are powers of two."""

    layers: int  # MoE layers the gate is asked at
    rate: float | None = None

    def size(self, step: int) -> int:
        """The next chunk: at most `step` (the configured prefill step)."""
        if self.rate is None:
            return min(step, FIRST_CHUNK)
        n = max(int(self.rate * LAYER_TARGET_S), 1)
        n = 1 << (n.bit_length() - 1)  # the power of two at or below
        return min(step, max(n, MIN_CHUNK))

    def expected_s(self, tokens: int) -> float | None:
        """The compute a chunk of `tokens` is expected to take (None: nothing measured)."""
        if self.rate is None:
            return None
        return tokens * max(self.layers, 1) / self.rate

    def frozen_must_ask(self, tokens: int) -> bool:
        """Whether frozen layers should sync to ask the stop during this chunk."""
        t = self.expected_s(tokens)
        return t is None or t > FROZEN_ASK_ABOVE_S

    def measure(self, tokens: int, compute_s: float) -> None:
        """A whole chunk of `tokens` took `compute_s` seconds beyond its expert reads."""
        if tokens > 0 and compute_s > 0:
            self.rate = tokens * max(self.layers, 1) / compute_s


class ChunkUndo:
    """Puts a layer-by-layer KV cache back to where it was before one prefill chunk."""

    def __init__(self, cache: list) -> None:
        from mlx_lm.models.cache import ArraysCache

        self._cache = cache
        self._offsets = [getattr(c, "offset", None) for c in cache]
        self._states = [list(c.cache) if isinstance(c, ArraysCache) else None for c in cache]

    @staticmethod
    def possible(cache: list, tokens: int) -> bool:
        """Whether a chunk of `tokens` stopped part-way can be undone exactly."""
        from mlx_lm.models.cache import ArraysCache, KVCache, QuantizedKVCache, RotatingKVCache

        for c in cache:
            if isinstance(c, RotatingKVCache):
                if c.offset + tokens >= c.max_size:  # the window would evict: no way back
                    return False
            elif not isinstance(c, ArraysCache | KVCache | QuantizedKVCache):
                # e.g. ConcatenateKVCache: its trim lowers the offset, but the next update
                # concatenates onto the arrays, undone tokens included
                return False
        return True

    def restore(self) -> None:
        for c, offset, state in zip(self._cache, self._offsets, self._states, strict=True):
            if state is not None:
                c.cache = state
            elif offset is not None and c.offset > offset:
                c.trim(c.offset - offset)

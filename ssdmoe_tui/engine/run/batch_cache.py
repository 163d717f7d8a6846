"""The batch's KV caches with their rows' left paddings known on the host.

mlx-lm's `BatchKVCache` keeps each row's left padding in a device array only, and reads
it back whenever a row leaves: `extract` evaluates it and reads it (`tolist`) for the
leaving row, `filter` gathers the kept rows' paddings and reads them to find the shift.
That is a host wait per layer, each behind whatever the device has queued: on an H100
(docs/benchmarks.md, 2026-12-07 twelfth session; Qwen3-30B-A3B shape, 48 layers, every
expert held) one row leaving a B = 8 batch took ~0.1 s (2.3 ms of each of the 47 steps
of the window it ended), and py-spy put the engine's samples there in `filter`'s read
and `extract`'s. Yet every value of those arrays follows from host integers: `merge`
makes them from the rows' lengths, `extend` adds each side's right-justifying shift,
`filter` keeps some and subtracts their minimum. `HostPaddedKVCache` keeps that list
beside the device array (`pads`), so a leaving row's cache and the others' filter queue
the same lazy slices and gathers as mlx-lm's and read nothing. Anything that sets the
paddings from device values (`finalize` after right padding, a `state` restored) drops
the list, and the cache then does what mlx-lm's does."""

from __future__ import annotations

from collections.abc import Sequence

import mlx.core as mx
from mlx_lm.models.cache import BatchKVCache, KVCache


class HostPaddedKVCache(BatchKVCache):
    """`BatchKVCache` with `pads`: `left_padding`'s values on the host (None: unknown,
    mlx-lm's reads used)."""

    def __init__(self, left_padding: list[int]) -> None:
        super().__init__(left_padding)
        self.pads: list[int] | None = [int(p) for p in left_padding]

    @classmethod
    def merge(cls, caches: list) -> HostPaddedKVCache:
        merged = BatchKVCache.merge.__func__(cls, caches)
        if not isinstance(merged, cls):  # mlx-lm's empty case builds its own class
            merged = cls([0] * len(caches))
        return merged

    def _host_pads(self) -> list[int] | None:
        return getattr(self, "pads", None)  # None too for one built by `from_state`

    def prepare(
        self,
        *,
        left_padding: Sequence[int] | None = None,
        lengths: Sequence[int] | None = None,
        right_padding: Sequence[int] | None = None,
    ) -> None:
        super().prepare(left_padding=left_padding, lengths=lengths, right_padding=right_padding)
        pads = self._host_pads()
        if left_padding is not None and pads is not None:
            added = [int(q) for q in left_padding]
            if len(added) == 1:  # one value for every row: mlx-lm broadcasts it
                added *= len(pads)
            self.pads = (
                [p + q for p, q in zip(pads, added, strict=True)]
                if len(added) == len(pads)
                else None  # whatever mlx-lm made of it: its reads decide
            )

    def finalize(self) -> None:
        if self._right_padding is not None:  # paddings shifted by device values
            self.pads = None
        super().finalize()

    @property
    def state(self) -> tuple:
        return BatchKVCache.state.fget(self)

    @state.setter
    def state(self, v: tuple) -> None:
        BatchKVCache.state.fset(self, v)
        self.pads = None

    def extend(self, other: BatchKVCache) -> None:
        pads = self._host_pads()
        if pads is not None:
            theirs = getattr(other, "pads", None)
            if theirs is None:  # a plain batch cache joining: read once
                theirs = [int(p) for p in other.left_padding.tolist()]
            if self.keys is None and other.keys is None:
                pads = pads + theirs  # mlx-lm concatenates them unshifted
            else:
                top = max(self._idx, other._idx)
                pads = [p + top - self._idx for p in pads] + [p + top - other._idx for p in theirs]
        super().extend(other)
        self.pads = pads

    def filter(self, batch_indices: Sequence[int]) -> None:
        pads = self._host_pads()
        if pads is None:
            super().filter(batch_indices)
            return
        keep = [int(i) for i in batch_indices]
        if self.keys is not None:
            self.keys = self.keys[keep]
            self.values = self.values[keep]
        self.offset = self.offset[keep]
        self.left_padding = self.left_padding[keep]
        kept = [pads[i] for i in keep]
        shift = min(kept)  # as mlx-lm's: the padding every kept row has, dropped
        if shift > 0:
            if self.keys is not None:
                self.keys = self.keys[..., shift:, :]
                self.values = self.values[..., shift:, :]
            self._idx -= shift
            self.left_padding -= shift
        self.pads = [p - shift for p in kept]

    def extract(self, idx: int) -> KVCache:
        pads = self._host_pads()
        if pads is None:
            return super().extract(idx)
        cache = KVCache()
        padding = pads[idx]
        cache.keys = mx.contiguous(self.keys[idx : idx + 1, :, padding : self._idx])
        cache.values = mx.contiguous(self.values[idx : idx + 1, :, padding : self._idx])
        cache.offset = cache.keys.shape[2]
        return cache

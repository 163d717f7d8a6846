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
the list, and the cache then does what mlx-lm's does.

`HostPaddedRotatingKVCache` does the same for sliding-window layers (gpt-oss, Gemma,
...): mlx-lm's `BatchRotatingKVCache.extract` evaluates and reads both `left_padding` and
`offset` for the leaving row. Their changes are host integers too (the window's trim and
rotation subtract the same count from every row's padding; every update adds its token
count to every offset), so the class keeps both lists (`pads`, `offs`). Right padding
(`prepare` with `right_padding`, rolled by device values) or a restored `state` drops
them."""

from __future__ import annotations

from collections.abc import Sequence

import mlx.core as mx
from mlx_lm.models.cache import BatchKVCache, BatchRotatingKVCache, KVCache, RotatingKVCache


def _added(pads: list[int], left_padding: Sequence[int] | int) -> list[int] | None:
    """Paddings `prepare` adds, one per row (a single value broadcast, as mlx-lm's array
    add does); None where the count fits neither (mlx-lm's arrays decide then)."""
    try:
        added = [int(q) for q in left_padding]
    except TypeError:  # one number (mlx-lm's array add takes it too)
        added = [int(left_padding)]
    if len(added) == 1:
        added *= len(pads)
    return added if len(added) == len(pads) else None


class _HostLists:
    """What both classes share: `pads` read back as None where unknown (a cache built by
    mlx-lm's `from_state` never ran `__init__`), dropped when `state` is set from arrays,
    and followed through mlx-lm's `prepare` (the paddings it adds worked out once here,
    each class's lists in `_prepared`)."""

    pads: list[int] | None

    def _host(self) -> list[int] | None:
        return getattr(self, "pads", None)

    def prepare(
        self,
        *,
        left_padding: Sequence[int] | int | None = None,
        lengths: Sequence[int] | None = None,
        right_padding: Sequence[int] | None = None,
    ) -> None:
        super().prepare(  # type: ignore[misc]
            left_padding=left_padding, lengths=lengths, right_padding=right_padding
        )
        pads = self._host()
        if pads is None:
            return
        added = None if left_padding is None else _added(pads, left_padding)
        if left_padding is not None and added is None:
            self.pads = None  # whatever mlx-lm made of it: its reads decide
            return
        self._prepared(pads, added, bool(right_padding) and max(right_padding) > 0)

    def _prepared(self, pads: list[int], added: list[int] | None, right_padded: bool) -> None:
        """The host lists after mlx-lm's `prepare` added `added` to every row's padding
        (each class's own arithmetic)."""
        raise NotImplementedError

    @property
    def state(self) -> tuple:
        return super().state  # type: ignore[misc]

    @state.setter
    def state(self, v: tuple) -> None:
        super(_HostLists, type(self)).state.fset(self, v)  # type: ignore[attr-defined]
        self.pads = None


class HostPaddedKVCache(_HostLists, BatchKVCache):
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

    def _prepared(self, pads: list[int], added: list[int] | None, right_padded: bool) -> None:
        if added is not None:  # right padding: finalize drops the list
            self.pads = [p + q for p, q in zip(pads, added, strict=True)]

    def finalize(self) -> None:
        if self._right_padding is not None:  # paddings shifted by device values
            self.pads = None
        super().finalize()

    def extend(self, other: BatchKVCache) -> None:
        pads = self._host()
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
        pads = self._host()
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
        pads = self._host()
        if pads is None:
            return super().extract(idx)
        cache = KVCache()
        padding = pads[idx]
        cache.keys = mx.contiguous(self.keys[idx : idx + 1, :, padding : self._idx])
        cache.values = mx.contiguous(self.values[idx : idx + 1, :, padding : self._idx])
        cache.offset = cache.keys.shape[2]
        return cache


class HostPaddedRotatingKVCache(_HostLists, BatchRotatingKVCache):
    """`BatchRotatingKVCache` with `pads` and `offs`: `left_padding`'s and `offset`'s
    values on the host (None: unknown, mlx-lm's reads used). Each update method works
    out, from the same host integers mlx-lm's branches test, the count it subtracts
    from every padding, then calls mlx-lm's method; tests compare both lists with the
    device's after every operation."""

    def __init__(self, max_size: int, left_padding: list[int]) -> None:
        super().__init__(max_size, left_padding)
        self.pads: list[int] | None = [int(p) for p in left_padding]
        self.offs: list[int] = [-p for p in self.pads]

    @classmethod
    def merge(cls, caches: list) -> HostPaddedRotatingKVCache:
        merged = BatchRotatingKVCache.merge.__func__(cls, caches)
        offs = [c.offset for c in caches]
        if all(isinstance(o, int) for o in offs):  # RotatingKVCache keeps an int
            merged.offs = offs
        else:
            merged.pads = None
        return merged

    def _shift(self, drop: int, tokens: int) -> None:
        """Every row's padding less `drop`, every offset plus `tokens`."""
        pads = self._host()
        if pads is not None:
            self.pads = [p - drop for p in pads] if drop else pads
            self.offs = [o + tokens for o in self.offs]

    def _update_concat(self, keys: mx.array, values: mx.array) -> tuple[mx.array, mx.array]:
        drop = 0
        if self.keys is not None:
            # mlx-lm's: temporal order (a rotated buffer's index becomes its width),
            # then the trim that keeps `max_size - 1` tokens before the new ones
            idx = self.keys.shape[2] if self.rotated else self._idx
            drop = max(0, idx - self.max_size + 1)
            if self._lengths is not None:  # rolled by device values
                self.pads = None
        out = super()._update_concat(keys, values)
        self._shift(drop, keys.shape[2])
        return out

    def _update_in_place(self, keys: mx.array, values: mx.array) -> tuple[mx.array, mx.array]:
        n, drop = keys.shape[2], 0
        if self._lengths is None:  # else mlx-lm's raises
            prev = self._offset
            width = 0 if self.keys is None else self.keys.shape[2]
            idx = self._idx
            if self.keys is None or (prev >= width and width < self.max_size):
                width += min(self.step, self.max_size - prev)  # the buffer grows
                idx = prev
            drop = max(0, width - self.max_size)
            if drop:
                idx = self.max_size
            if self.rotated or idx == self.max_size:  # writing over the oldest
                drop += n
        out = super()._update_in_place(keys, values)
        self._shift(drop, n)
        return out

    def _prepared(self, pads: list[int], added: list[int] | None, right_padded: bool) -> None:
        if added is not None:
            self.pads = [p + q for p, q in zip(pads, added, strict=True)]
            self.offs = [o - q for o, q in zip(self.offs, added, strict=True)]
        if right_padded:
            self.pads = None  # finalize rolls rows by device values

    def trim(self, n: int) -> int:
        n = super().trim(n)
        self._shift(0, -n)
        return n

    def filter(self, batch_indices: Sequence[int]) -> None:
        super().filter(batch_indices)
        pads = self._host()
        if pads is not None:
            keep = [int(i) for i in batch_indices]
            self.pads = [pads[i] for i in keep]
            self.offs = [self.offs[i] for i in keep]

    def extend(self, other: BatchRotatingKVCache) -> None:
        pads = self._host()
        if pads is not None:
            if getattr(other, "pads", None) is not None:
                theirs, their_offs = other.pads, other.offs
            else:  # a plain batch cache joining: read once
                theirs = [int(p) for p in other.left_padding.tolist()]
                their_offs = [int(o) for o in other.offset.tolist()]
            if self.keys is not None or other.keys is not None:
                # mlx-lm's: both in temporal order where they differ, then each side
                # right-justified to the later index
                def idx(c: BatchRotatingKVCache) -> int:
                    if (self.rotated != other.rotated or self._idx != other._idx) and c.rotated:
                        return c.keys.shape[2]
                    return c._idx

                top = max(idx(self), idx(other))
                theirs = [p + top - idx(other) for p in theirs]
                pads = [p + top - idx(self) for p in pads]
            pads, offs = pads + theirs, self.offs + their_offs
        super().extend(other)
        if pads is not None:
            self.pads, self.offs = pads, offs

    def extract(self, idx: int) -> RotatingKVCache:
        pads = self._host()
        if pads is None:
            return super().extract(idx)
        cache = RotatingKVCache(self.max_size)
        padding = max(0, pads[idx])
        cache.keys = self.keys[idx : idx + 1]
        cache.values = self.values[idx : idx + 1]
        cache._idx = self._idx
        if self.rotated:
            cache.keys = mx.roll(cache.keys, -self._idx, axis=2)
            cache.values = mx.roll(cache.values, -self._idx, axis=2)
            cache._idx = self.max_size
        cache.keys = mx.contiguous(cache.keys[:, :, padding : cache._idx])
        cache.values = mx.contiguous(cache.values[:, :, padding : cache._idx])
        cache.offset = self.offs[idx]
        cache._idx = cache.keys.shape[2]
        return cache

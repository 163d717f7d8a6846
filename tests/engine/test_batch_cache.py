"""HostPaddedKVCache: mlx-lm's BatchKVCache with the row paddings also on the host.
Every operation the batch runs (merge, extend as rows join, filter and extract as
they leave) leaves the same arrays as mlx-lm's class, and the host's paddings equal
the device's throughout."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
from mlx_lm.models.cache import BatchKVCache, BatchRotatingKVCache, KVCache, RotatingKVCache

from ssdmoe_tui.engine.run.batch_cache import HostPaddedKVCache, HostPaddedRotatingKVCache

H, D = 2, 4


def _row(n: int, seed: int) -> KVCache:
    """One sequence's cache holding n tokens of random keys and values."""
    c = KVCache()
    if n:
        rng = np.random.default_rng(seed)
        k = mx.array(rng.standard_normal((1, H, n, D)).astype(np.float32))
        c.update_and_fetch(k, k * 2)
    return c


def _same(ours: HostPaddedKVCache, theirs: BatchKVCache) -> None:
    assert ours._idx == theirs._idx
    for a, b in ((ours.keys, theirs.keys), (ours.values, theirs.values)):
        assert (a is None) == (b is None)
        if a is not None:
            assert a.shape == b.shape and mx.array_equal(a, b).item()
    assert ours.offset.tolist() == theirs.offset.tolist()
    assert ours.left_padding.tolist() == theirs.left_padding.tolist() == ours.pads


def _decode(c: BatchKVCache, seed: int) -> None:
    """One decode step's update: a token for every row."""
    rng = np.random.default_rng(seed)
    b = c.left_padding.shape[0]
    k = mx.array(rng.standard_normal((b, H, 1, D)).astype(np.float32))
    c.update_and_fetch(k, k - 1)


def _update_both(ours, theirs, b: int, n: int, seed: int) -> None:  # noqa: ANN001 - batch caches
    """The same update of n tokens for b rows into both caches: the same arrays back."""
    k = mx.array(np.random.default_rng(seed).standard_normal((b, H, n, D)).astype(np.float32))
    ka, va = ours.update_and_fetch(k, k - 1)
    kb, vb = theirs.update_and_fetch(k, k - 1)
    assert mx.array_equal(ka, kb).item() and mx.array_equal(va, vb).item()


def test_the_batch_operations_match_mlx_lms_cache():
    lengths = [5, 2, 7]
    ours = HostPaddedKVCache.merge([_row(n, i) for i, n in enumerate(lengths)])
    theirs = BatchKVCache.merge([_row(n, i) for i, n in enumerate(lengths)])
    assert type(ours) is HostPaddedKVCache
    _same(ours, theirs)
    for step in range(3):
        _decode(ours, step)
        _decode(theirs, step)
    _same(ours, theirs)
    # a longer and a shorter row join (each side right-justified to the other's width)
    for n, seed in ((14, 7), (1, 8)):
        ours.extend(HostPaddedKVCache.merge([_row(n, seed)]))
        theirs.extend(BatchKVCache.merge([_row(n, seed)]))
        _same(ours, theirs)
        _decode(ours, 10 + seed)
        _decode(theirs, 10 + seed)
    _same(ours, theirs)
    # rows leave: their caches, then the others filtered (the padding shift dropped)
    for gone in ([3], [0, 2]):
        for i in gone:
            a, b = ours.extract(i), theirs.extract(i)
            assert a.offset == b.offset and mx.array_equal(a.keys, b.keys).item()
            assert mx.array_equal(a.values, b.values).item()
        keep = [j for j in range(len(ours.pads)) if j not in gone]
        width = ours._idx
        ours.filter(keep)
        theirs.filter(keep)
        _same(ours, theirs)
        if gone == [3]:  # the longest row left: the others' common padding dropped
            assert ours._idx < width
        _decode(ours, 20 + len(keep))
        _decode(theirs, 20 + len(keep))
        _same(ours, theirs)
    assert len(ours.pads) == 2


def test_a_plain_batch_cache_joins_and_unknown_paddings_fall_back():
    """A plain BatchKVCache joining is read once; a state set from arrays (or a cache
    with right padding finalized) drops the host's paddings and mlx-lm's reads serve."""
    ours = HostPaddedKVCache.merge([_row(3, 1), _row(6, 2)])
    theirs = BatchKVCache.merge([_row(3, 1), _row(6, 2)])
    ours.extend(BatchKVCache.merge([_row(9, 3)]))
    theirs.extend(BatchKVCache.merge([_row(9, 3)]))
    _same(ours, theirs)
    empty = HostPaddedKVCache.merge([_row(0, 0), _row(0, 0)])  # mlx-lm's own empty case
    assert type(empty) is HostPaddedKVCache and empty.pads == [0, 0]
    plain = BatchKVCache.merge([_row(0, 0), _row(0, 0)])
    for lp in ([2, 1], [3]):  # added padding: one per row, or one for all (broadcast)
        empty.prepare(left_padding=lp)
        plain.prepare(left_padding=lp)
        assert empty.pads == empty.left_padding.tolist() == plain.left_padding.tolist()
    ours.state = theirs.state
    assert ours.pads is None
    ours.filter([0, 2])
    theirs.filter([0, 2])
    assert ours.left_padding.tolist() == theirs.left_padding.tolist()
    assert ours.extract(1).offset == theirs.extract(1).offset


def test_random_sequences_of_the_batch_operations_match():
    """Random rows joining (as host-padded or plain batch caches), decode updates of 1-10
    tokens, rows leaving (extract, then filter with kept rows in any order): the same
    arrays as mlx-lm's class after every operation, 30 sequences of 30 operations
    (a review's differential test, trimmed to what the batch runs)."""
    import random

    def fresh(r: random.Random, cls: type) -> tuple[list[KVCache], type]:
        lengths = [r.choice([0, 1, 2, 5, 9, 13]) for _ in range(r.randint(1, 3))]
        return [_row(n, r.randrange(1 << 30)) for n in lengths], cls

    host_ops = 0
    for seed in range(30):
        r = random.Random(seed)
        rows = [r.choice([1, 4, 11]) for _ in range(r.randint(1, 3))]
        ours = HostPaddedKVCache.merge([_row(n, i) for i, n in enumerate(rows)])
        theirs = BatchKVCache.merge([_row(n, i) for i, n in enumerate(rows)])
        for _ in range(30):
            b = len(ours.pads)
            op = r.choice(("update", "update", "join", "join_plain", "leave"))
            if op == "update":
                _update_both(ours, theirs, b, r.choice((1, 1, 3, 10)), r.randrange(1 << 30))
            elif op.startswith("join"):
                state = r.getstate()
                made, cls = fresh(r, BatchKVCache if op == "join_plain" else HostPaddedKVCache)
                ours.extend(cls.merge(made))
                r.setstate(state)
                theirs.extend(BatchKVCache.merge(fresh(r, BatchKVCache)[0]))
            elif b > 1 and theirs.keys is not None:
                gone = r.sample(range(b), r.randint(1, b - 1))
                for i in gone:
                    a, c = ours.extract(i), theirs.extract(i)
                    assert a.offset == c.offset and mx.array_equal(a.keys, c.keys).item()
                keep = [j for j in range(b) if j not in gone]
                r.shuffle(keep)
                ours.filter(keep)
                theirs.filter(keep)
                host_ops += 1
            _same(ours, theirs)
    assert host_ops >= 100  # rows left often enough to mean something


def _rot_row(n: int, seed: int, window: int) -> RotatingKVCache:
    """One sequence's sliding-window cache after n tokens (a prompt, then decode steps,
    so longer rows have wrapped around their window)."""
    c = RotatingKVCache(window)
    rng = np.random.default_rng(seed)
    first = min(n, 3)
    if first:
        k = mx.array(rng.standard_normal((1, H, first, D)).astype(np.float32))
        c.update_and_fetch(k, k * 2)
    for _ in range(n - first):
        k = mx.array(rng.standard_normal((1, H, 1, D)).astype(np.float32))
        c.update_and_fetch(k, k * 2)
    return c


def _same_rot(ours: HostPaddedRotatingKVCache, theirs: BatchRotatingKVCache) -> None:
    assert (ours._idx, ours._offset, ours.rotated) == (theirs._idx, theirs._offset, theirs.rotated)
    for a, b in ((ours.keys, theirs.keys), (ours.values, theirs.values)):
        assert (a is None) == (b is None)
        if a is not None:
            assert a.shape == b.shape and mx.array_equal(a, b).item()
    assert ours.offset.tolist() == theirs.offset.tolist() == ours.offs
    assert ours.left_padding.tolist() == theirs.left_padding.tolist() == ours.pads


def test_random_sequences_on_sliding_window_caches_match():
    """HostPaddedRotatingKVCache against mlx-lm's BatchRotatingKVCache: rows of random
    lengths (some past their window) merged, joining (host-padded or plain), chunks and
    one-token decode steps (the window filling, trimming and rotating), trims, rows
    leaving (extract, filter in any order); after every operation the same arrays and
    the host's paddings and offsets equal the device's."""
    import random

    host_extracts = 0
    for seed in range(40):
        r = random.Random(seed)
        window = r.choice((4, 6, 9))

        def rows(r: random.Random, window: int = window) -> list[RotatingKVCache]:
            lengths = [r.choice((0, 1, 2, 5, 8, 13)) for _ in range(r.randint(1, 3))]
            return [_rot_row(n, r.randrange(1 << 30), window) for n in lengths]

        state = r.getstate()
        ours = HostPaddedRotatingKVCache.merge(rows(r))
        r.setstate(state)
        theirs = BatchRotatingKVCache.merge(rows(r))
        assert type(ours) is HostPaddedRotatingKVCache
        _same_rot(ours, theirs)
        for _ in range(30):
            b = len(ours.pads)
            op = r.choice(("step", "step", "step", "chunk", "join", "join_plain", "leave", "trim"))
            if op in ("step", "chunk"):
                n = 1 if op == "step" else r.choice((2, 3, 7))
                _update_both(ours, theirs, b, n, r.randrange(1 << 30))
            elif op.startswith("join"):
                state = r.getstate()
                cls = BatchRotatingKVCache if op == "join_plain" else HostPaddedRotatingKVCache
                ours.extend(cls.merge(rows(r)))
                r.setstate(state)
                theirs.extend(BatchRotatingKVCache.merge(rows(r)))
            elif op == "trim":
                if ours.is_trimmable():
                    n = r.randint(0, 2)
                    assert ours.trim(n) == theirs.trim(n)
            elif b > 1 and theirs.keys is not None:
                gone = r.sample(range(b), r.randint(1, b - 1))
                for i in gone:
                    a, c = ours.extract(i), theirs.extract(i)
                    assert (a.offset, a._idx) == (c.offset, c._idx)
                    assert mx.array_equal(a.keys, c.keys).item()
                    assert mx.array_equal(a.values, c.values).item()
                    host_extracts += 1
                keep = [j for j in range(b) if j not in gone]
                r.shuffle(keep)
                ours.filter(keep)
                theirs.filter(keep)
            _same_rot(ours, theirs)
    assert host_extracts >= 100


def test_sliding_window_fallbacks():
    """A restored state, or right padding (rolled by device values), drops the host's
    lists and mlx-lm's reads serve; left padding added to an empty cache is followed."""
    ours = HostPaddedRotatingKVCache.merge([_rot_row(0, 0, 4), _rot_row(0, 1, 4)])
    plain = BatchRotatingKVCache.merge([_rot_row(0, 0, 4), _rot_row(0, 1, 4)])
    for lp in ([2, 1], [3], 1):  # one per row, one for all (broadcast), a bare number
        ours.prepare(left_padding=lp)
        plain.prepare(left_padding=lp)
        assert ours.pads == ours.left_padding.tolist() == plain.left_padding.tolist()
        assert ours.offs == ours.offset.tolist() == plain.offset.tolist()
    ours.prepare(lengths=[1, 2], right_padding=[1, 0])
    assert ours.pads is None
    full = HostPaddedRotatingKVCache.merge([_rot_row(7, 2, 4), _rot_row(2, 3, 4)])
    other = BatchRotatingKVCache.merge([_rot_row(7, 2, 4), _rot_row(2, 3, 4)])
    full.state = other.state
    assert full.pads is None
    a, b = full.extract(1), other.extract(1)
    assert a.offset == b.offset and mx.array_equal(a.keys, b.keys).item()

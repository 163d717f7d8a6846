"""Split reads ($SSDMOE_READ_SPLIT): the same bytes in more, smaller requests."""

from __future__ import annotations

import os

import mlx.core as mx
import numpy as np
import pytest

from ssdmoe_tui.engine.experts.cache import SPLIT_ENV
from ssdmoe_tui.engine.experts.reader import open_reader, split_requests
from tests.helpers.exact import engine_tokens, reference_tokens


def test_split_reads_land_the_same_bytes(tmp_path) -> None:
    data = os.urandom(3 << 20)
    f = tmp_path / "shard.bin"
    f.write_bytes(data)
    lengths = np.array([768 << 10, 48 << 10, 1000, 300 << 10], dtype=np.int64)
    offsets = np.array([4096, 1 << 20, 2 << 20, (2 << 20) + 8192], dtype=np.int64)
    out = {}
    for split in (False, True):
        buf = np.zeros(int(lengths.sum()), dtype=np.uint8)
        dests = buf.ctypes.data + np.concatenate([[0], np.cumsum(lengths)[:-1]])
        with open_reader(queue_depth=4) as rd:
            fds = np.full(4, rd.open(f), dtype=np.int64)
            req = (fds, offsets, lengths, dests.astype(np.int64))
            if split:
                req = split_requests(*req, want=16, min_piece=64 << 10)
                assert len(req[0]) > 4 and (req[2] % 4096 == 0).sum() >= len(req[0]) - 2
            assert rd.read_batch(*req) == int(lengths.sum())
        out[split] = buf.tobytes()
    want = b"".join(data[o : o + n] for o, n in zip(offsets, lengths, strict=True))
    assert out[False] == out[True] == want


def test_many_requests_are_left_whole() -> None:
    a = np.arange(40, dtype=np.int64)
    got = split_requests(a, a, np.full(40, 1 << 20), a, want=32)
    assert len(got[0]) == 40


def test_engine_with_split_reads_matches_mlx_lm(checkpoints, monkeypatch) -> None:
    monkeypatch.setenv(SPLIT_ENV, "4K")  # tiny experts: every piece split
    path = checkpoints("qwen3_moe")
    sm, prompt, res = engine_tokens(path, None, "1")  # the minimum: evictions
    try:
        assert sm.cache._split_min == 4096 and res.stats.misses > 0
        assert res.tokens == reference_tokens(path, None, mx.float32, prompt)
    finally:
        sm.close()


def test_bad_split_size_is_one_line(checkpoints, monkeypatch) -> None:
    from ssdmoe_tui.engine.model.loader import load_streamed
    from ssdmoe_tui.errors import ModelError

    monkeypatch.setenv(SPLIT_ENV, "tiny")
    with pytest.raises(ModelError, match=f"{SPLIT_ENV}='tiny'"):
        load_streamed(checkpoints("qwen3_moe"), expert_cache="1G")

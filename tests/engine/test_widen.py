"""Widening in the reader (issue 43): bf16/f16 scales and biases read from real files by
the real readers land in float32 slots bit for bit as numpy's widening writes them, with
the native reader (its threads widen) and the pure-Python fallback (numpy widens)."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest

from ssdmoe_tui.engine.experts.reader import (
    COPY,
    WIDEN_BF16,
    WIDEN_F16,
    ReadError,
    buffer_address,
    open_reader,
)
from tests.helpers.exact import engine_tokens, reference_tokens

READERS = ["native", "python"]


@pytest.fixture(autouse=True)
def _home(tmp_path, monkeypatch):
    monkeypatch.setenv("SSDMOE_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("SSDMOE_READER", raising=False)


@pytest.fixture(scope="module")
def halves(tmp_path_factory) -> tuple[Path, np.ndarray]:
    """A file of every 16-bit pattern (NaN payloads, infinities, subnormals, signed
    zeros), then random ones: 2 x 65536 + 40000 values, 342 KiB (over the native
    reader's 64 KiB widening chunk many times)."""
    rng = np.random.default_rng(43)
    every = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    vals = np.concatenate([every, every[::-1], rng.integers(0, 1 << 16, 40000).astype(np.uint16)])
    path = tmp_path_factory.mktemp("widen") / "halves.bin"
    path.write_bytes(vals.astype("<u2").tobytes())
    return path, vals


def numpy_widened(vals: np.ndarray, kind: int) -> np.ndarray:
    """numpy's widening, as float32 bits: bf16 is a float32's top half; f16 is astype."""
    if kind == WIDEN_BF16:
        return vals.astype(np.uint32) << 16
    return vals.view(np.float16).astype(np.float32).view(np.uint32)


@pytest.mark.parametrize("kind", READERS)
@pytest.mark.parametrize("direct", [False, True])
@pytest.mark.parametrize("widen", [WIDEN_BF16, WIDEN_F16])
def test_reader_widens_bit_for_bit_as_numpy(halves, kind, direct, widen) -> None:
    path, vals = halves
    # Whole file, even unaligned offsets, a read crossing 64 KiB chunk edges, one value,
    # and copies mixed in (each kind lands where it should and nothing else moves).
    reqs = [(0, 2 * len(vals)), (2 * 4097, 2 * 70001), (2 * 65535, 2), (6, 4096), (4094, 131074)]
    kinds = [widen, widen, widen, COPY, widen]
    out_bytes = [n * (1 if k == COPY else 2) for (_, n), k in zip(reqs, kinds, strict=True)]
    arr = mx.zeros((sum(out_bytes) // 4 + 1,), dtype=mx.float32)
    mx.eval(arr)
    base = buffer_address(memoryview(arr))
    dests = base + np.concatenate([[0], np.cumsum(out_bytes)[:-1]]).astype(np.int64)
    with open_reader(8, direct=direct, prefer=kind) as rd:
        assert rd.name == kind
        fd = rd.open(path)
        got = rd.read_batch(
            np.full(len(reqs), fd),
            np.array([o for o, _ in reqs], dtype=np.int64),
            np.array([n for _, n in reqs], dtype=np.int64),
            dests,
            np.array(kinds, dtype=np.intc),
        )
    assert got == sum(n for _, n in reqs)
    out = np.array(arr).view(np.uint8)
    raw = vals.astype("<u2").tobytes()
    at = 0
    for (off, n), k, size in zip(reqs, kinds, out_bytes, strict=True):
        piece = out[at : at + size]
        if k == COPY:
            assert piece.tobytes() == raw[off : off + n]
        else:
            want = numpy_widened(vals[off // 2 : (off + n) // 2], k)
            assert np.array_equal(piece.view(np.uint32), want)
        at += size
    assert out[at:].tobytes() == bytes(len(out) - at)  # nothing written past the end


@pytest.mark.parametrize("kind", READERS)
def test_bad_widening_request_is_one_line(halves, kind) -> None:
    path, _ = halves
    arr = mx.zeros((64,), dtype=mx.float32)
    mx.eval(arr)
    base = buffer_address(memoryview(arr))
    with open_reader(2, prefer=kind) as rd:
        fd = rd.open(path)
        for length, dest, bad in [(3, base, WIDEN_BF16), (4, base + 2, WIDEN_F16), (4, base, 9)]:
            with pytest.raises(ReadError, match=f"cannot read {length} bytes at offset 0 of "):
                rd.read_batch(
                    np.array([fd]), np.array([0]), np.array([length]), np.array([dest]),
                    np.array([bad], dtype=np.intc),
                )  # fmt: skip


@pytest.mark.parametrize("kind", READERS)
def test_widening_past_the_end_is_a_short_read(halves, kind) -> None:
    path, vals = halves
    size = 2 * len(vals)
    arr = mx.zeros((200_000,), dtype=mx.float32)
    mx.eval(arr)
    with open_reader(2, prefer=kind) as rd:
        fd = rd.open(path)
        with pytest.raises(ReadError, match="short read: file ended after 100000 bytes") as err:
            rd.read_batch(
                np.array([fd]), np.array([size - 100_000]), np.array([200_000]),
                np.array([buffer_address(memoryview(arr))]), np.array([WIDEN_BF16], dtype=np.intc),
            )  # fmt: skip
        assert err.value.got == 100_000


def _tensor_rows(path: Path, prefix: str, part: str) -> tuple[str, np.ndarray]:
    """(dtype, raw bytes per expert as 16-bit words) of the stacked expert tensor
    `<prefix>.<switch>.<part>`, parsed straight from the safetensors header: none of the
    engine's index, no MLX, no widening of our own."""
    index = json.loads((path / "model.safetensors.index.json").read_text())
    (name,) = [n for n in index["weight_map"] if n.startswith(prefix + ".") and n.endswith(part)]
    shard = path / index["weight_map"][name]
    with open(shard, "rb") as f:
        (hlen,) = struct.unpack("<Q", f.read(8))
        meta = json.loads(f.read(hlen))[name]
        start, end = meta["data_offsets"]
        f.seek(8 + hlen + start)
        data = np.frombuffer(f.read(end - start), dtype="<u2")
    return meta["dtype"], data.reshape(meta["shape"][0], -1)


@pytest.mark.parametrize("kind", READERS)
def test_cache_slots_hold_numpy_widened_scales(checkpoints, monkeypatch, kind) -> None:
    """The engine's own reads (ExpertCache.read_into, through the reader chosen) put every
    widened component in its float32 slot exactly as numpy widens the file's values."""
    from ssdmoe_tui.engine.model.loader import load_streamed

    monkeypatch.setenv("SSDMOE_READER", kind)
    path = checkpoints("qwen3_moe")
    sm = load_streamed(path, expert_cache="1G", dtype="float32")
    try:
        cache = sm.cache
        assert cache.reader.name == kind
        layer = 1
        experts = np.array([3, 0, 5], dtype=np.int64)
        slots = cache.ensure(layer, experts)
        lay = cache.index.layers[layer]
        widened = [c for c in lay.components if c.dtype in ("BF16", "F16")]
        assert widened and all(not c.name.endswith(".weight") for c in widened)
        for c in lay.components:
            dtype, rows = _tensor_rows(path, lay.prefix, "." + c.name)
            bank, row = np.divmod(slots, cache.bank_slots)
            for e, b, r in zip(experts, bank, row, strict=True):
                slot = np.array(cache.banks[b][c.name][int(r)])
                if c in widened:
                    kind_ = WIDEN_BF16 if dtype == "BF16" else WIDEN_F16
                    want = numpy_widened(rows[e], kind_)
                    assert slot.dtype == np.float32
                    assert np.array_equal(slot.view(np.uint32).reshape(-1), want), c.name
                else:
                    assert slot.tobytes() == rows[e].tobytes(), c.name
    finally:
        sm.close()


def test_python_reader_engine_matches_mlx_lm(checkpoints, monkeypatch) -> None:
    """The pure-Python fallback's widening through a whole generation with evictions:
    the same greedy tokens as resident mlx-lm (float32, the CPU default)."""
    monkeypatch.setenv("SSDMOE_READER", "python")
    path = checkpoints("qwen3_moe")
    sm, prompt, res = engine_tokens(path, None, "1")  # the minimum budget: evictions
    try:
        assert sm.cache.reader.name == "python" and res.stats.misses > 0
        assert res.tokens == reference_tokens(path, None, mx.float32, prompt)
    finally:
        sm.close()

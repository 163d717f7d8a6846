"""Bad safetensors headers: every one is refused with one line naming the file and the
tensor or value (never a bare TypeError/OverflowError/RecursionError/ZeroDivisionError),
by the one reader (checkpoint.header) that model shards and KV checkpoints share.

`BAD_HEADERS` is the table of inputs; `pytest --collect-only -q tests/models/test_checkpoint_header.py`
lists them by id."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from ssdmoe_tui.checkpoint.header import HeaderError, read_header
from ssdmoe_tui.checkpoint.layout import scan_experts
from ssdmoe_tui.engine.experts.index import build_index
from ssdmoe_tui.errors import ModelError
from ssdmoe_tui.sessions.checkpoints import CheckpointInvalid, read_metadata

W = "model.layers.0.mlp.switch_mlp.gate_proj.weight"


def t(dtype="U32", shape=(2, 2), offsets=(0, 16)) -> dict:
    return {"dtype": dtype, "shape": list(shape), "data_offsets": list(offsets)}


def js(obj) -> bytes:
    return json.dumps(obj).encode()


# (id, header JSON bytes, data bytes after the header, fragment of the one-line message)
BAD_HEADERS: list[tuple[str, bytes, int, str]] = [
    ("dtype-list", b'{"w": {"dtype": ["U32"], "shape": [4], "data_offsets": [0, 16]}}', 16,
     'tensor w: unknown dtype ["U32"]'),
    ("dtype-unknown", js({"w": t(dtype="U31")}), 16, 'unknown dtype "U31"'),
    ("dtype-null", js({"w": t(dtype=None)}), 16, "unknown dtype null"),
    ("offset-1e400", b'{"w": {"dtype": "U8", "shape": [4], "data_offsets": [0, 1e400]}}', 16,
     "data_offsets value 1e400 is not an integer"),
    ("shape-1e400", b'{"w": {"dtype": "U8", "shape": [1e400], "data_offsets": [0, 4]}}', 16,
     "shape value 1e400 is not an integer"),
    ("shape-float", b'{"w": {"dtype": "U8", "shape": [4.0], "data_offsets": [0, 4]}}', 16,
     "shape value 4.0 is not an integer"),
    ("shape-nan", b'{"w": {"dtype": "U8", "shape": [NaN], "data_offsets": [0, 4]}}', 16,
     "shape value NaN is not an integer"),
    ("shape-infinity", b'{"w": {"dtype": "U8", "shape": [Infinity], "data_offsets": [0, 4]}}',
     16, "shape value Infinity is not an integer"),
    ("shape-bool", b'{"w": {"dtype": "U8", "shape": [true], "data_offsets": [0, 1]}}', 16,
     "shape value true is not an integer"),
    ("shape-string", js({"w": t(shape=("2", 2))}), 16, 'shape value "2" is not an integer'),
    ("shape-5000-digits", b'{"w": {"dtype": "U8", "shape": [' + b"9" * 5000
     + b'], "data_offsets": [0, 4]}}', 16, "(5000 digits) is outside 0..2**63-1"),
    ("shape-negative", js({"w": t(shape=(-1, 2**63))}), 16,
     "shape value -1 is outside 0..2**63-1"),
    ("shape-2**63", js({"w": t(shape=(1, 2**63))}), 16,
     "shape value 9223372036854775808 is outside 0..2**63-1"),
    ("offset-past-int64", js({"w": t(offsets=(0, 2**63 + 8))}), 16,
     "data_offsets value 9223372036854775816 is outside"),
    ("offset-negative", js({"w": t(offsets=(-16, 0))}), 16, "data_offsets value -16 is outside"),
    ("shape-not-list", js({"w": {"dtype": "U8", "shape": "4", "data_offsets": [0, 4]}}), 16,
     'shape "4" is not a list'),
    ("offsets-three", js({"w": t(offsets=(0, 8, 16))}), 16, "data_offsets [0, 8, 16] is not"),
    ("offsets-object", js({"w": {"dtype": "U8", "shape": [4], "data_offsets": {"a": 1}}}), 16,
     "data_offsets {\"a\": 1} is not [begin, end]"),
    ("offsets-reversed", js({"w": t(shape=(0,), offsets=(16, 0))}), 16,
     "data_offsets end 0 is before begin 16"),
    ("size-mismatch", js({"w": t(dtype="F32", shape=(2, 4))}), 32,
     "tensor w holds 16 bytes but shape [2, 4] x F32 needs 32"),
    ("shape-product-huge", js({"w": t(shape=(2**62, 2**62))}), 16,
     "shape [4611686018427387904, 4611686018427387904] x U32 needs more than 2**63 bytes"),
    ("past-eof", js({"w": t(shape=(8, 2), offsets=(0, 64))}), 16,
     "truncated: tensor w ends at data byte 64 but the file holds 16"),
    ("overlap", js({"a": t(), "b": t(offsets=(8, 24))}), 32,
     "tensors a and b overlap (data bytes 8..16)"),
    ("overlap-same-range", js({"a": t(), "b": t()}), 16, "tensors a and b overlap"),
    ("entry-number", js({"w": 5}), 16, "tensor w: entry is 5, not an object"),
    ("entry-list", js({"w": [1, 2]}), 16, "tensor w: entry is [1, 2], not an object"),
    ("missing-dtype", js({"w": {"shape": [4], "data_offsets": [0, 4]}}), 16,
     "tensor w: header entry has no dtype"),
    ("missing-offsets", js({"w": {"dtype": "U8", "shape": [4]}}), 16, "has no data_offsets"),
    ("metadata-nested", js({"__metadata__": {"a": {"b": "c"}}}), 0,
     "__metadata__ must map strings to strings"),
    ("metadata-number", js({"__metadata__": {"n_tokens": 5}}), 0, "__metadata__ must map"),
    ("metadata-list", js({"__metadata__": ["x"]}), 0, "__metadata__ must map"),
    ("duplicate-key", b'{"w": {"dtype": "U8", "shape": [4], "data_offsets": [0, 4]}, '
     b'"w": {"dtype": "U8", "shape": [4], "data_offsets": [4, 8]}}', 16,
     "key 'w' appears twice"),
    ("nested-100000", b'{"a":' * 100_000 + b"1" + b"}" * 100_000, 0,
     "safetensors header nests 100000 levels deep (at most 8)"),
    ("nested-list-10", b'{"w": [[[[[[[[[1]]]]]]]]]}', 0, "nests 10 levels deep"),
    ("not-json", b"{{{{", 0, "safetensors header is not valid JSON"),
    ("not-utf8", b'{"\xff\xfe": 1}', 0, "not valid JSON (not UTF-8)"),
    ("json-array", b"[1, 2]", 0, "safetensors header is not a JSON object"),
    ("json-string", b'"x"', 0, "not a JSON object"),
    ("trailing-garbage", b'{"w": 1} x', 0, "not valid JSON (Extra data)"),
]  # fmt: skip


def write_raw(path: Path, blob: bytes, data: int, length: int | None = None) -> Path:
    path.write_bytes(
        struct.pack("<Q", len(blob) if length is None else length) + blob + bytes(data)
    )
    return path


def one_line(exc: BaseException, path: Path, fragment: str) -> str:
    text = str(exc)
    assert "\n" not in text and len(text) < 400, text
    assert path.name in text, text
    assert fragment in text, (fragment, text)
    return text


@pytest.mark.parametrize(
    ("blob", "data", "fragment"), [c[1:] for c in BAD_HEADERS], ids=[c[0] for c in BAD_HEADERS]
)
def test_bad_header_is_one_line_naming_file_and_value(tmp_path, blob, data, fragment):
    path = write_raw(tmp_path / "model-00001-of-00002.safetensors", blob, data)
    with pytest.raises(HeaderError) as e:
        read_header(path)
    one_line(e.value, path, fragment)


FRAMING = [
    ("empty-file", b"", "truncated (shorter than the 8-byte safetensors header length)"),
    ("seven-bytes", b"\x01" * 7, "truncated"),
    ("length-past-eof", struct.pack("<Q", 1000) + b"{}", "header length 1000 is past the end"),
    ("length-over-limit", struct.pack("<Q", 2**63 + 5) + b"{}", "over the 100000000-byte limit"),
    ("length-zero", struct.pack("<Q", 0), "header length 0 is too short"),
]  # fmt: skip


@pytest.mark.parametrize(("raw", "fragment"), [c[1:] for c in FRAMING], ids=[c[0] for c in FRAMING])
def test_bad_framing(tmp_path, raw, fragment):
    path = tmp_path / "x.safetensors"
    path.write_bytes(raw)
    with pytest.raises(HeaderError) as e:
        read_header(path)
    one_line(e.value, path, fragment)


def test_missing_file_and_folder(tmp_path):
    with pytest.raises(HeaderError) as e:
        read_header(tmp_path / "gone.safetensors")
    one_line(e.value, tmp_path / "gone.safetensors", "missing")
    (tmp_path / "d.safetensors").mkdir()
    with pytest.raises(HeaderError) as e:
        read_header(tmp_path / "d.safetensors")
    one_line(e.value, tmp_path / "d.safetensors", "a folder, not a file")


# ----------------------------------------------------------- expert-level (index builder)

BAD_EXPERTS = [
    ("experts-zero", {W: t(shape=(0, 4), offsets=(0, 0))}, 0, f"expert tensor {W} has 0 experts"),
    ("experts-1d", {W: t(shape=(4,))}, 16, f"expert tensor {W} has shape [4], expected"),
    ("experts-count-differs", {W: t(shape=(2, 2)), W.replace("gate", "up"): t(shape=(4, 1), offsets=(16, 32))},
     32, "has 4 experts, other layers have 2"),
    ("experts-overlap", {W: t(), W.replace("gate", "up"): t(offsets=(8, 24))}, 32, "overlap"),
    ("experts-global-scale", {W: t(), W.replace("weight", "global_scale"): t(dtype="F32", shape=(2,), offsets=(16, 24))},
     24, "global_scale: nvfp4 experts with per-expert global scales are not streamed"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("header", "data", "fragment"), [c[1:] for c in BAD_EXPERTS], ids=[c[0] for c in BAD_EXPERTS]
)
def test_bad_expert_tensors(tmp_path, header, data, fragment):
    folder = tmp_path / "m"
    folder.mkdir()
    path = write_raw(folder / "model.safetensors", js(header), data)
    with pytest.raises(ModelError) as e:
        scan_experts(folder)
    one_line(e.value, path, fragment)
    with pytest.raises(ModelError) as e:  # the engine's index builder says the same
        build_index(folder)
    one_line(e.value, path, fragment)


# ----------------------------------------------------------- KV checkpoint metadata

BAD_KV = [
    ("kv-nested", b'{"__metadata__":' + b"[" * 50_000 + b"]" * 50_000 + b"}", "corrupt header"),
    ("kv-1e400", b'{"k": {"dtype": "F32", "shape": [1e400], "data_offsets": [0, 4]}}',
     "corrupt header (tensor k: shape value 1e400 is not an integer)"),
    ("kv-overflow-offsets", js({"k": t(offsets=(0, 2**70))}),
     "data_offsets value 1180591620717411303424 is outside 0..2**63-1"),
    ("kv-metadata-not-strings", js({"__metadata__": {"0.n_tokens": 5}}), "__metadata__ must map"),
    ("kv-not-ours", js({"__metadata__": {"format": "mlx"}}), "not an ssdmoe checkpoint"),
    ("kv-past-eof", js({"k": t(shape=(100,), dtype="U8", offsets=(0, 100))}), "truncated"),
]  # fmt: skip


@pytest.mark.parametrize(("blob", "fragment"), [c[1:] for c in BAD_KV], ids=[c[0] for c in BAD_KV])
def test_kv_checkpoint_metadata(tmp_path, blob, fragment):
    path = write_raw(tmp_path / "kv-00000040.safetensors", blob, 16)
    with pytest.raises(CheckpointInvalid) as e:
        read_metadata(path)
    text = one_line(e.value, path, fragment)
    assert str(tmp_path) not in text  # KV messages name the file only


def test_good_header_reads(tmp_path):
    header = {"__metadata__": {"format": "mlx"}, "a": t(), "b": t(shape=(0,), offsets=(16, 16)),
              "c": t(dtype="BF16", shape=(4,), offsets=(16, 24))}  # fmt: skip
    path = write_raw(tmp_path / "ok.safetensors", js(header), 24)
    h = read_header(path)
    assert list(h.tensors) == ["a", "b", "c"] and h.metadata == {"format": "mlx"}
    assert h.absolute(h.tensors["c"]) == 8 + len(js(header)) + 16


@pytest.mark.parametrize(
    ("weight_map", "fragment"),
    [
        ({"w": "../outside.safetensors"}, "shard name '../outside.safetensors' points outside"),
        ({"w": "/etc/passwd"}, "shard name '/etc/passwd' points outside"),
        ({"w": "model-2.safetensors"}, "missing shard"),
        ([1, 2], "not a valid safetensors index"),
    ],
    ids=["index-dotdot", "index-absolute", "index-missing-shard", "index-not-object"],
)
def test_bad_shard_index(tmp_path, weight_map, fragment):
    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    with pytest.raises(ModelError) as e:
        scan_experts(folder)
    text = str(e.value)
    assert "\n" not in text and fragment in text and "model" in text


def test_bracket_depth_is_the_same_across_chunk_boundaries(monkeypatch):
    """The depth pre-check walks a header in bounded chunks (a 100 MB header is allowed);
    the running depth carries over, so any chunk size gives the plain count's answer."""
    import random

    from ssdmoe_tui.checkpoint import header as h

    rng = random.Random(5)
    for _ in range(200):
        blob = bytes(rng.choice(b'[]{}"a,1') for _ in range(rng.randrange(0, 60)))
        level = deepest = 0
        for c in blob:
            level += (c in b"[{") - (c in b"]}")
            deepest = max(deepest, level)
        for chunk in (1, 3, 7, 1 << 20):
            monkeypatch.setattr(h, "_CHUNK", chunk)
            assert h._bracket_depth(blob) == deepest, (blob, chunk)

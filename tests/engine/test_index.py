"""The expert index maps (layer, expert, component) to the exact bytes of the stacked tensors."""

from __future__ import annotations

import os

import mlx.core as mx
import numpy as np

from ssdmoe_tui.engine.experts.index import build_index, load_index


def test_offsets_point_at_each_experts_bytes(checkpoints):
    path = checkpoints("qwen3_5_moe")
    index = build_index(path)
    assert index.num_experts == 16 and index.num_layers == 4
    assert [c.name for c in index.layers[0].components] == [
        f"{p}.{part}"
        for p in ("gate_proj", "up_proj", "down_proj")
        for part in ("weight", "scales", "biases")
    ]
    loaded = {}
    for layer in (index.layers[0], index.layers[-1]):
        for comp in layer.components:
            name = f"{layer.prefix}.switch_mlp.{comp.name}"
            if comp.shard not in loaded:
                loaded[comp.shard] = mx.load(str(path / comp.shard))
            tensor = loaded[comp.shard][name]
            assert tensor.shape[0] == index.num_experts and tuple(tensor.shape[1:]) == comp.shape
            with open(path / comp.shard, "rb") as f:
                for e in (0, 7, 15):
                    f.seek(comp.offset + e * comp.stride)
                    raw = f.read(comp.stride)
                    expect = np.array(
                        tensor[e].view(mx.uint8) if tensor.dtype != mx.uint8 else tensor[e]
                    )
                    assert raw == expect.tobytes(), (name, e)
    assert index.expert_bytes == sum(c.stride for c in index.layers[0].components)
    assert index.mib_per_token(4) == index.expert_bytes * 4 * 4 / 2**20


def test_index_cache_is_keyed_by_shard_size_and_mtime(checkpoints, tmp_path):
    import shutil

    path = tmp_path / "m"
    shutil.copytree(checkpoints("qwen3_moe"), path)
    first, cached = load_index(path)
    assert not cached
    again, cached = load_index(path)
    assert cached and again == first
    shard = path / first.shards[0]
    st = shard.stat()
    os.utime(shard, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    third, cached = load_index(path)
    assert not cached and third.layers == first.layers and third.key != first.key
    # the cached file holds relative shard names only
    from ssdmoe_tui.paths import cache_dir

    text = (cache_dir() / "index" / f"{third.key}.json").read_text()
    assert str(tmp_path) not in text


def _poke(path, pos: int) -> None:
    """Flip one byte at `pos`, keeping the file's size and mtime (an in-place edit that a
    size+mtime key cannot see)."""
    st = path.stat()
    with open(path, "r+b") as f:
        f.seek(pos)
        b = f.read(1)
        f.seek(pos)
        f.write(bytes([b[0] ^ 0xFF]))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert path.stat().st_size == st.st_size and path.stat().st_mtime_ns == st.st_mtime_ns


def test_in_place_edit_with_same_size_and_mtime_changes_the_key(checkpoints, tmp_path):
    import shutil
    from dataclasses import replace

    from ssdmoe_tui.checkpoint.header import read_header

    path = tmp_path / "m"
    shutil.copytree(checkpoints("qwen3_moe"), path)
    first, _ = load_index(path)
    assert load_index(path)[1]  # cached
    shard = path / first.shards[0]
    _poke(shard, read_header(shard).data_start)  # first sampled block
    again, cached = load_index(path)
    assert not cached and again.key != first.key and again.layers == first.layers
    assert shard.name in again.note and "changed in place" in again.note
    assert load_index(path) == (replace(again, note=""), True)  # said once


def test_damaged_folder_record_only_costs_the_comparison(checkpoints, tmp_path):
    """The per-folder record of shard states is ours, but a damaged one (not an object)
    must not stop the model from opening."""
    import hashlib
    import os
    import shutil

    from ssdmoe_tui.paths import cache_dir

    path = tmp_path / "m"
    shutil.copytree(checkpoints("qwen3_moe"), path)
    key = hashlib.sha256(os.path.realpath(path).encode()).hexdigest()[:32]
    record = cache_dir() / "index" / "folders" / f"{key}.json"
    for damaged in ("[1, 2]", "[" * 100_000, '{"x": 3}'):
        record.parent.mkdir(parents=True, exist_ok=True)
        record.write_text(damaged)
        index, _ = load_index(path)
        assert index.num_experts > 0 and not index.note


def test_verify_names_the_changed_tensor(checkpoints, tmp_path, capsys):
    import json
    import shutil

    from ssdmoe_tui.cli import main

    path = tmp_path / "m"
    shutil.copytree(checkpoints("qwen3_moe"), path)
    assert main(["index", "--model", str(path), "--verify"]) == 0
    assert "first verify" in capsys.readouterr().out
    assert main(["index", "--model", str(path), "--verify", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["ok"] and r["tensors"] > 20 and r["changed"] == []
    index = build_index(path)
    comp = index.layers[1].components[0]
    _poke(path / comp.shard, comp.offset + 5 * comp.stride + 3)  # expert 5 of layer 1
    assert main(["index", "--model", str(path), "--verify"]) == 1
    out = capsys.readouterr().out
    name = f"{index.layers[1].prefix}.switch_mlp.{comp.name}"
    assert f"changed: {comp.shard}: {name}" in out and "1 changed" in out


def test_verify_checks_hub_blobs_against_their_sha256(checkpoints, tmp_path):
    """In the Hub cache a shard is a link to blobs/<sha256>: verify compares the two."""
    import hashlib
    import shutil

    from ssdmoe_tui.checkpoint.verify import verify

    src = checkpoints("qwen3_moe")
    snap, blobs = tmp_path / "snapshots" / "abc", tmp_path / "blobs"
    snap.mkdir(parents=True)
    blobs.mkdir()
    for f in src.iterdir():
        if f.suffix == ".safetensors":
            data = f.read_bytes()
            blob = blobs / hashlib.sha256(data).hexdigest()
            blob.write_bytes(data)
            (snap / f.name).symlink_to(blob)
        else:
            shutil.copy(f, snap / f.name)
    assert verify(snap, tmp_path / "cache").ok
    victim = sorted(snap.glob("*.safetensors"))[0]
    _poke(victim.resolve(), victim.stat().st_size - 1)
    r = verify(snap, tmp_path / "cache")
    assert r.hub_mismatch == [victim.name] and not r.ok

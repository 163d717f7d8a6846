"""Issue 23: an expert-index cache entry that cannot be read (a FIFO, a link to /dev/zero,
a folder, JSON nested 100,000 deep, garbage) is stale: the index is rebuilt, without a
hang, an exception or a note, and the rebuilt entry replaces it."""

from __future__ import annotations

import shutil

import pytest

from ssdmoe_tui.engine.experts.index import load_index
from ssdmoe_tui.paths import cache_dir
from tests.helpers.bad_inputs import SPECIAL, bounded, special


def _entries() -> list:
    return [p for p in (cache_dir() / "index").glob("*.json")]


@pytest.mark.parametrize(
    "damage",
    [kind for kind, _, _ in SPECIAL] + ["nested", "garbage"],
)
def test_an_unreadable_index_cache_entry_is_rebuilt(damage, checkpoints, tmp_path, monkeypatch):
    monkeypatch.setenv("SSDMOE_HOME", str(tmp_path / "home"))
    model = tmp_path / "model"
    shutil.copytree(checkpoints("qwen3_moe"), model)
    index, cached = load_index(model)
    assert not cached
    (entry,) = _entries()
    if damage == "nested":
        entry.write_text("[" * 100_000 + "]" * 100_000)
    elif damage == "garbage":
        entry.write_bytes(b"\xff\x00{not json")
    else:
        make = next(m for kind, m, _ in SPECIAL if kind == damage)
        special(make, entry)
    with bounded():
        again, cached = load_index(model)
    assert not cached and again.note == ""
    assert again.shards == index.shards and len(again.layers) == len(index.layers)
    assert entry.is_file() and not entry.is_symlink()  # the rebuilt entry took its place
    assert load_index(model)[1]  # and is read from the cache next time

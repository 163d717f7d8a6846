"""`ssdmoe repack`: the aligned copy holds every expert byte for byte, the engine reads it
with identical output, and a stale or partial copy is never used."""

from __future__ import annotations

import json
import os
import shutil

import mlx.core as mx
import numpy as np
import pytest

from ssdmoe_tui.engine.experts import repack
from ssdmoe_tui.engine.experts.index import load_index
from ssdmoe_tui.engine.model.loader import load_streamed
from ssdmoe_tui.engine.run.runner import Runner
from ssdmoe_tui.errors import ModelError, user_message
from tests.helpers.cli_runner import run_cli

from .test_engine_exact import PROMPT, reference_tokens


@pytest.fixture
def model_copy(checkpoints, tmp_path):
    """A private copy: repack writes next to the model."""
    dst = tmp_path / "model"
    shutil.copytree(checkpoints("qwen3_5_moe"), dst)
    return dst


def _expert_bytes(path, component, expert: int) -> bytes:
    with open(
        path / component.shard if not os.path.isabs(component.shard) else component.shard, "rb"
    ) as f:
        f.seek(component.offset + expert * component.file_step)
        return f.read(component.stride)


def test_copy_is_aligned_and_byte_identical(model_copy) -> None:
    index, _ = load_index(model_copy)
    man, summary = repack.write_repacked(model_copy, index)
    assert man == model_copy / repack.MANIFEST
    layout, note = repack.find_repacked(model_copy, index)
    assert layout is not None, note
    assert layout.expert_stride % repack.ALIGN == 0
    assert all(o % repack.ALIGN == 0 for o in layout.component_offsets)
    assert (
        summary["bytes"]
        == layout.data.stat().st_size
        == (index.num_layers * index.num_experts * layout.expert_stride)
    )
    packed = repack.packed_index(index, layout)
    for li in (0, index.num_layers - 1):
        for e in (0, index.num_experts // 2, index.num_experts - 1):
            for orig, new in zip(
                index.layers[li].components, packed.layers[li].components, strict=True
            ):
                assert _expert_bytes(model_copy, new, e) == _expert_bytes(model_copy, orig, e)


def test_engine_reads_the_copy_with_mlx_lm_tokens(model_copy) -> None:
    index, _ = load_index(model_copy)
    repack.write_repacked(model_copy, index)
    runs = {}
    for source in ("auto", "shards"):
        sm = load_streamed(
            model_copy, expert_cache="1", dtype="float32", experts=source
        )  # minimum cache
        prompt = sm.tokenizer.apply_chat_template(PROMPT, add_generation_prompt=True)
        res = Runner(sm).generate(prompt, max_tokens=16)
        runs[sm.expert_source] = (
            res.tokens,
            sm.cache.counters.bytes_read,
            sm.cache.counters.misses,
        )
        sm.close()
    assert set(runs) == {"repacked", "shards"}
    assert runs["repacked"] == runs["shards"]  # same tokens, same bytes, same misses
    assert runs["repacked"][0] == reference_tokens(model_copy, None, mx.float32, prompt)[:16]


def test_stale_or_partial_copy_is_not_used(model_copy) -> None:
    index, _ = load_index(model_copy)
    repack.write_repacked(model_copy, index)
    shard = model_copy / index.layers[0].components[0].shard
    st = shard.stat()
    os.utime(shard, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # "re-downloaded"
    index, _ = load_index(model_copy)
    layout, note = repack.find_repacked(model_copy, index)
    assert layout is None and "stale" in note
    sm = load_streamed(model_copy, expert_cache="1")
    assert sm.expert_source == "shards" and "stale" in sm.expert_source_note
    sm.close()
    with pytest.raises(ModelError) as e:
        load_streamed(model_copy, expert_cache="1", experts="repacked")
    assert "stale" in user_message(e.value) and "\n" not in user_message(e.value)
    # A data file without its manifest (a crash before the manifest) is ignored.
    (model_copy / repack.MANIFEST).unlink()
    assert repack.find_repacked(model_copy, index) == (None, "")


def test_hub_snapshot_copy_goes_to_the_data_folder(checkpoints, tmp_path) -> None:
    snap = tmp_path / "hub" / "models--org--m" / "snapshots" / "abc123"
    shutil.copytree(checkpoints("qwen3_moe"), snap)
    index, _ = load_index(snap)
    man, _ = repack.write_repacked(snap, index)
    assert not (snap / repack.MANIFEST).exists()
    assert man.parent == repack.default_out_dir(snap, index) != snap
    layout, _ = repack.find_repacked(snap, index)
    assert layout is not None and layout.data.parent == man.parent
    assert repack.remove_repacked(snap, index) == [man, man.parent / repack.DATA]
    assert repack.find_repacked(snap, index)[0] is None


def test_cli_status_repack_remove(model_copy) -> None:
    def cli(*a: str) -> dict:
        out = run_cli(["repack", "--model", str(model_copy), *a, "--json"], check=True)
        return json.loads(out.stdout.strip().splitlines()[-1])

    assert cli("--status")["current"] is False
    made = cli()
    assert made["bytes"] >= made["expert_bytes"] > 0
    assert cli("--status")["current"] is True
    assert len(cli("--remove")["removed"]) == 2
    assert cli("--status")["current"] is False
    assert np.isfinite(made["seconds"])


def test_manifest_with_foreign_offsets_is_refused(model_copy) -> None:
    """A hand-edited or foreign manifest never sends reads to the wrong bytes."""
    index, _ = load_index(model_copy)
    man, _ = repack.write_repacked(model_copy, index)
    m = json.loads(man.read_text())
    m["layer_offsets"][1] += repack.ALIGN
    man.write_text(json.dumps(m))
    layout, note = repack.find_repacked(model_copy, index)
    assert layout is None and "offsets do not match" in note


async def test_chat_app_says_where_experts_come_from(demo_model, tmp_path) -> None:
    """The TUI reads the repacked copy and says so; a stale copy is reported, not used."""
    from ssdmoe_tui.ui.app import ChatSettings, SsdmoeApp
    from ssdmoe_tui.ui.widgets.transcript import Notice
    from tests.helpers.pilot import SIZE, loaded, send, wait_until

    model = tmp_path / "demo"
    shutil.copytree(demo_model, model)
    index, _ = load_index(model)
    repack.write_repacked(model, index)
    app = SsdmoeApp(ChatSettings(model=str(model), max_tokens=12))
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot, app)
        assert app.chat.model.expert_source == "repacked"
        texts = [str(n.render()) for n in app.chat_pane.transcript.query(Notice)]
        assert any("from the repacked copy" in t for t in texts)
        await send(pilot, "hi", what="a reply")
        assert app.chat.last_done.stats["expert_source"] == "repacked"
    shard = model / index.layers[0].components[0].shard
    st = shard.stat()
    os.utime(shard, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    app = SsdmoeApp(ChatSettings(model=str(model), max_tokens=12))
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot, app)
        assert app.chat.model.expert_source == "shards"

        def stale_notice() -> bool:  # posted after the load notice: wait for it
            notes = [n.message for n in app._notifications]
            return any(m.startswith("Repacked copy not used:") and "stale" in m for m in notes)

        await wait_until(pilot, stale_notice, 30, "the stale-copy notification")

"""Temp files a killed writer left are removed at the next start, every kind, while a
file another live process is writing is left alone (issue 11, item 7)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from ssdmoe_tui import paths
from ssdmoe_tui.atomic import STALE_TEMP_S, is_orphan_temp
from tests.helpers.cli_runner import run_cli

ROOT = Path(__file__).resolve().parents[2]


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait(timeout=30)
    return proc.pid


def test_every_kind_of_orphan_is_removed_at_start_and_live_ones_stay():
    dead = dead_pid()
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        conv = paths.sessions_dir() / "20260101-000000-abcdef"
        conv.mkdir(parents=True)
        (conv / "conversation.json").write_text("{}")
        old = time.time() - STALE_TEMP_S - 60
        orphans = {
            # written by this version: the writer's pid is in the name
            conv / f".kv-00000040.safetensors.k2j3.p{dead}.tmp.safetensors",
            conv / f".kv-00000040.safetensors.k2j3.p{dead}.tmp.safetensors.safetensors",
            conv / f".conversation.json.ab12.p{dead}.tmp",
            paths.sessions_dir() / f".last_opened.zz.p{dead}.tmp",
            paths.cache_dir() / "index" / f".abc.json.q1.p{dead}.tmp",
            paths.config_dir() / f".config.toml.r2.p{dead}.tmp",
            paths.data_dir() / "exports" / f".conversation-x.md.s3.p{dead}.tmp",
            paths.data_dir() / "repacked" / "key" / f".experts.bin.p{dead}.tmp",
            # older versions' names (no pid): removed once an hour old
            conv / ".kv-00000040.safetensors.x1.safetensors.tmp",
            conv / ".kv-00000040.safetensors.x2.tmp.safetensors",
            conv / ".conversation.json.x3.tmp",
        }
        kept = {
            conv / f".conversation.json.ab12.p{live.pid}.tmp",  # a live writer's file
            conv / f".kv-00000080.safetensors.k.p{live.pid}.tmp.safetensors",
            conv / ".conversation.json.fresh.tmp",  # no pid, but recent
            conv / "kv-00000040.safetensors",  # not a temp file
            conv / "notes.tmp",  # not named like ours
        }
        for p in orphans | kept:
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_bytes(b"x" * 100)
        for p in orphans:
            if ".p" not in p.name:
                os.utime(p, (old, old))
        r = run_cli(["index", "--help"], timeout=60)
        assert r.returncode == 0, r.stderr
        assert sorted(str(p) for p in orphans if p.exists()) == []
        assert all(p.exists() for p in kept)
    finally:
        live.kill()
        live.wait()


def test_a_temp_is_an_orphan_when_its_writer_is_gone_or_it_is_old():
    now = time.time()
    assert not is_orphan_temp(f".conversation.json.a.p{os.getpid()}.tmp", now)
    assert is_orphan_temp(f".conversation.json.a.p{dead_pid()}.tmp", now)
    assert not is_orphan_temp(".conversation.json.a.tmp", now)
    assert is_orphan_temp(".conversation.json.a.tmp", now - STALE_TEMP_S)
    assert not is_orphan_temp("conversation.json", 0)


def test_a_killed_repack_leaves_no_partial_copy_after_the_next(checkpoints, tmp_path):
    """The repacked copy can sit in the user's model folder (outside the folders swept at
    start): the next repack there removes a killed one's partial file."""
    import shutil

    from ssdmoe_tui.engine.experts import repack
    from ssdmoe_tui.engine.experts.index import load_index

    model = tmp_path / "model"
    shutil.copytree(checkpoints("qwen3_moe"), model)
    partial = model / f".{repack.DATA}.p{dead_pid()}.tmp"
    partial.write_bytes(b"\0" * 4096)
    index, _ = load_index(model)
    repack.write_repacked(model, index)
    assert not partial.exists()
    assert (model / repack.DATA).is_file()

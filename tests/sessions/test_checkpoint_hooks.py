"""One contract for both KV-checkpoint hook stores (`sessions/checkpoint_hooks.py`): the
app's `SessionKV` (a folder per conversation) and the server's `ServerKV` (a folder per
chain of requests). Real tiny models, real caches, real files."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import mlx.core as mx
import pytest

from ssdmoe_tui.server.prompt_cache import ServerKV
from ssdmoe_tui.server.prompts import new_chain
from ssdmoe_tui.sessions.checkpoint_hooks import CheckpointHooks
from ssdmoe_tui.sessions.checkpoints import CheckpointInvalid, list_checkpoints
from ssdmoe_tui.sessions.kv_hooks import SessionKV
from ssdmoe_tui.sessions.store import SessionStore, new_id
from tests.helpers.tiny import HYBRID, feed, filled_cache

TOKENS = list(range(1, 25))


@dataclass(frozen=True)
class Info:
    fingerprint: str
    hybrid: bool


class App:
    """SessionKV: checkpoints go to a stored conversation's folder."""

    def __init__(self, root: Path, notices: list[str]) -> None:
        self.store = SessionStore(root)
        self.hooks = SessionKV(self.store, notice=notices.append)

    def attach(self, tokens) -> str:
        return self.store.create("tiny", "fp", "").id

    def unknown(self) -> str:
        return new_id()  # a valid id no conversation was stored under


class Server:
    """ServerKV: checkpoints go to the chain a registered prompt continues."""

    def __init__(self, root: Path, notices: list[str]) -> None:
        self.hooks = ServerKV(root, notice=notices.append)

    def attach(self, tokens) -> str:
        self.hooks.register(tokens, new_chain())
        return "ssdmoe-server"

    def unknown(self) -> str:
        return "ssdmoe-server"  # no prompt registered: nowhere to file it


@pytest.fixture(params=[App, Server], ids=["app", "server"])
def side(request, tmp_path):
    notices: list[str] = []
    made = request.param(tmp_path / "kv", notices)
    made.notices = notices
    return made


@pytest.mark.parametrize("arch", ["qwen3_moe", "nemotron_h"])
def test_a_saved_checkpoint_serves_the_next_prompt_with_the_same_logits(side, arch):
    assert isinstance(side.hooks, CheckpointHooks)
    info = Info(f"fp-{arch}", HYBRID[arch])
    sid = side.attach(TOKENS)
    side.hooks.save(sid, TOKENS, filled_cache(arch, TOKENS), info)
    longer = TOKENS + [30, 31, 32]
    got = side.hooks.load(sid, longer, info)
    assert got is not None
    cache, n = got
    assert n == len(TOKENS)
    direct = filled_cache(arch, TOKENS)
    a, b = feed(arch, cache, longer[n:]), feed(arch, direct, longer[n:])
    assert mx.array_equal(a, b)
    assert side.notices == []


def test_a_save_with_nowhere_to_go_writes_nothing(side, tmp_path):
    info = Info("fp-qwen3_moe", False)
    side.hooks.save(side.unknown(), TOKENS, filled_cache("qwen3_moe", TOKENS), info)
    folders = [p for p in (tmp_path / "kv").rglob("*") if p.is_dir()]
    assert not any(list_checkpoints(f) for f in folders)
    assert side.hooks.load(side.unknown(), TOKENS + [40], info) is None


def test_a_special_file_named_like_a_checkpoint_is_said_and_never_opened(side, tmp_path):
    """A FIFO (which would block a reader) or a link to /dev/zero where a checkpoint
    belongs: skipped with a notice naming it, beside a good checkpoint and alone."""
    import os

    info = Info("fp-qwen3_moe", False)
    sid = side.attach(TOKENS[:12])
    side.hooks.save(sid, TOKENS[:12], filled_cache("qwen3_moe", TOKENS[:12]), info)
    (folder,) = {ck.path.parent for f in (tmp_path / "kv").rglob("*") if f.is_dir()
                 for ck in list_checkpoints(f)}  # fmt: skip
    os.mkfifo(folder / "kv-00000020.safetensors")
    (folder / "kv-00000016.safetensors").symlink_to("/dev/zero")
    got = side.hooks.load(sid, TOKENS + [40], info)
    assert got is not None and got[1] == 12  # the good one served
    said = " | ".join(side.notices)
    assert "kv-00000020.safetensors: a FIFO (named pipe), not a regular file" in said, said
    assert "kv-00000016.safetensors: a character device" in said and "/dev/zero" in said, said
    for ck in list_checkpoints(folder):
        ck.path.unlink()  # the special files alone
    side.notices.clear()
    assert side.hooks.load(sid, TOKENS + [41], info) is None
    if isinstance(side.hooks, SessionKV):  # the server said each once already
        assert any("a FIFO" in n for n in side.notices), side.notices


def test_another_models_checkpoint_is_not_used(side):
    sid = side.attach(TOKENS)
    side.hooks.save(sid, TOKENS, filled_cache("qwen3_moe", TOKENS), Info("fp-a", False))
    try:  # the app's says why (the engine shows it as a notice); the server's passes it
        got = side.hooks.load(sid, TOKENS + [40], Info("fp-b", False))
    except CheckpointInvalid as e:
        assert "another model" in str(e)
        got = None
    assert got is None


def test_a_damaged_checkpoint_is_skipped_with_a_notice(side, tmp_path):
    info = Info("fp-qwen3_moe", False)
    sid = side.attach(TOKENS[:12])  # the first turn's prompt; the second extends it
    side.hooks.save(sid, TOKENS[:12], filled_cache("qwen3_moe", TOKENS[:12]), info)
    side.hooks.save(sid, TOKENS, filled_cache("qwen3_moe", TOKENS), info)
    newest = max(
        (ck for f in (tmp_path / "kv").rglob("*") if f.is_dir() for ck in list_checkpoints(f)),
        key=lambda ck: ck.n_tokens,
    )
    data = bytearray(newest.path.read_bytes())
    data[-9] ^= 0xFF  # a flipped tensor byte: the checksum no longer matches
    newest.path.write_bytes(bytes(data))
    got = side.hooks.load(sid, TOKENS + [40], info)
    assert got is not None and got[1] == 12  # the older checkpoint served
    assert any("checkpoint ignored" in n for n in side.notices), side.notices

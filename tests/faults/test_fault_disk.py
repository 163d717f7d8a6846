"""A full disk (a small tmpfs, mounted when running as root) says "disk full" with the
path and the bytes needed, and leaves the earlier state intact: no half-made
conversation folder, no 0-byte lock file, no temp file, the previous checkpoint and
text as they were (issue 11, item 8)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ssdmoe_tui.atomic import DiskFullError, atomic_write_text, free_bytes
from ssdmoe_tui.errors import user_message
from ssdmoe_tui.sessions.store import SessionStore, Turn
from tests.helpers.disk import small_disk


def fill(disk: Path, leave: int = 0) -> None:
    """Fill the file system, leaving about `leave` bytes."""
    with open(disk / "filler", "ab", buffering=0) as f:
        chunk = b"\0" * 4096
        for _ in range(1 << 20):  # bounded: the mounts here are a few MiB at most
            if leave and (free_bytes(disk) or 0) <= leave:
                break
            try:
                f.write(chunk)
            except OSError:
                break


def no_temps(folder: Path) -> list[str]:
    return [p.name for p in folder.rglob("*") if ".tmp" in p.name]


def test_conversation_writes_on_a_full_disk(tmp_path):
    with small_disk(tmp_path / "disk", 512) as disk:
        store = SessionStore(disk / "sessions")
        conv = store.create("demo", "fp")
        store.add_turn(conv, Turn("user", "kept", [1, 2]))
        before = store.get(conv.id)
        fill(disk)
        # A new conversation: one line, and no half-made folder.
        with pytest.raises(DiskFullError) as e:
            store.create("demo", "fp")
        msg = user_message(e.value)
        assert msg.startswith("disk full:") and "conversation.json" in msg and "bytes" in msg
        assert "\n" not in msg
        assert [p.name for p in (disk / "sessions").iterdir()] == [conv.id]
        # A turn on the existing one: the stored text stays as it was.
        with pytest.raises(DiskFullError):
            store.add_turn(conv, Turn("assistant", "x" * 20_000, [3] * 5000))
        assert store.get(conv.id).turns == before.turns
        with pytest.raises(DiskFullError, match="export.md"):
            atomic_write_text(disk / "export.md", "y" * 50_000)
        assert no_temps(disk) == []
        (disk / "filler").unlink()  # room again: everything works
        store.add_turn(conv, Turn("assistant", "fine", [3]))
        assert [t.text for t in store.get(conv.id).turns] == ["kept", "fine"]


def test_checkpoint_save_on_a_full_disk(tmp_path):
    from ssdmoe_tui.sessions.checkpoints import list_checkpoints, load_checkpoint, save_checkpoint
    from tests.helpers.tiny import filled_cache

    t1 = list(range(20, 60))
    t2 = t1 + list(range(300, 400))
    with small_disk(tmp_path / "disk", 2048) as disk:
        d = disk / "sessions" / "20260101-000000-abcdef"
        d.mkdir(parents=True)
        first = save_checkpoint(d, filled_cache("qwen3_moe", t1), t1, "fp")
        kept = first.path.read_bytes()
        fill(disk, leave=first.nbytes // 2)
        with pytest.raises(DiskFullError) as e:
            save_checkpoint(d, filled_cache("qwen3_moe", t2), t2, "fp")
        msg = user_message(e.value)
        assert msg.startswith("disk full:") and "kv-00000140.safetensors" in msg
        assert "needs" in msg and "bytes" in msg and "\n" not in msg
        assert [c.n_tokens for c in list_checkpoints(d)] == [len(t1)]
        assert first.path.read_bytes() == kept
        assert no_temps(d) == []
        _, n = load_checkpoint(d, t2, "fp")
        assert n == len(t1)


def test_model_lock_on_a_full_disk(tmp_path, monkeypatch):
    from ssdmoe_tui.models.lock import acquire_model_lock

    with small_disk(tmp_path / "disk", 64) as disk:
        monkeypatch.setenv("SSDMOE_LOCK_DIR", str(disk / "locks"))
        (disk / "locks").mkdir()
        fill(disk)
        with pytest.raises(DiskFullError) as e:
            acquire_model_lock("/models/some-model")
        msg = user_message(e.value)
        assert msg.startswith("disk full:") and ".lock" in msg and "bytes" in msg
        left = [p.name for p in (disk / "locks").iterdir()]
        assert left in ([], ["claims.mutex"]), left  # no 0-byte claim file
        (disk / "filler").unlink()
        with acquire_model_lock("/models/some-model") as lock:
            assert lock.held
        assert [p.name for p in (disk / "locks").iterdir()] == ["claims.mutex"]  # released

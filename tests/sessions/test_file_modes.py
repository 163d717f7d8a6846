"""Issue 23: every file derived from a user's prompts is 0600 and its folders 0700, whatever
the umask: conversations, `.last_opened`, exports (the server's KV checkpoints and prompt
history: tests/server/test_server_hardening.py)."""

from __future__ import annotations

import os
import stat

from ssdmoe_tui.sessions.store import SessionStore, Turn


def _mode(p) -> int:
    return stat.S_IMODE(os.stat(p).st_mode)


def test_conversation_files_and_folders_are_private(tmp_path):
    old = os.umask(0o022)
    try:
        store = SessionStore(tmp_path / "data" / "sessions")
        conv = store.create("m", "fp")
        store.add_turn(conv, Turn(role="user", text="my secret", token_ids=[1, 2]))
        store.mark_opened(conv.id)
        out = store.export_to(conv.id, tmp_path / "exports" / "new" / "chat.md")
    finally:
        os.umask(old)
    folder = store.folder(conv.id)
    assert _mode(store.root) == 0o700 and _mode(store.root.parent) == 0o700
    assert _mode(folder) == 0o700
    assert _mode(folder / "conversation.json") == 0o600
    assert _mode(store.root / ".last_opened") == 0o600
    assert _mode(out) == 0o600 and _mode(out.parent) == 0o700
    assert _mode(tmp_path / "exports") == 0o700  # created for the export


def test_routing_traces_are_private_and_read_back(tmp_path):
    """A routing trace follows the prompts it was recorded on: 0600 (gzip too), and the
    reader (regular files only) reads both back."""
    from ssdmoe_tui.engine.policy.traces import TraceWriter, read_trace

    old = os.umask(0o022)
    try:
        paths = [tmp_path / "traces" / "t.jsonl", tmp_path / "traces" / "t.jsonl.gz"]
        for path in paths:
            w = TraceWriter(path, {"model": "m", "k": 2, "num_layers": 2, "num_experts": 8})
            w.add(0, 0, [1, 2])
            w.add(0, 1, [3, 4])
            w.close()
    finally:
        os.umask(old)
    assert _mode(tmp_path / "traces") == 0o700
    for path in paths:
        assert _mode(path) == 0o600
        trace = read_trace(path)
        assert trace.meta.k == 2 and len(trace.steps) == 1

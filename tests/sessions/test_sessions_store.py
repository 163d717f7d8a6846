"""Conversation store: create/list/search/get/rename/delete/clear/export, safe ids,
resume tracking, atomic writes (a save killed before its rename keeps the old text)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ssdmoe_tui import paths
from ssdmoe_tui.errors import BadValueError, user_message
from ssdmoe_tui.sessions.store import (
    CONVERSATION_FILE,
    SessionCorrupt,
    SessionNotFound,
    SessionStore,
    Turn,
    validate_id,
)

REPO = Path(__file__).resolve().parents[2]


def chat(store: SessionStore, *exchanges: tuple[str, str], system: str = "") -> str:
    conv = store.create("demo-moe", "fp-1", system)
    for i, (user, reply) in enumerate(exchanges):
        store.add_turn(conv, Turn("user", user, [10 * i + 1, 10 * i + 2]))
        store.add_turn(conv, Turn("assistant", reply, [10 * i + 3, 99], k=4))
    return conv.id


def test_default_root_is_sessions_dir(ssdmoe_home):
    store = SessionStore()
    assert store.root == paths.sessions_dir()
    assert str(store.root).startswith(str(ssdmoe_home))


def test_roundtrip_and_history(tmp_path):
    store = SessionStore(tmp_path)
    cid = chat(store, ("Hello there, how are you today?", "Fine."), ("And you?", "Great."))
    conv = store.get(cid)
    assert conv.model_id == "demo-moe" and conv.fingerprint == "fp-1"
    assert [t.role for t in conv.turns] == ["user", "assistant"] * 2
    assert conv.history_tokens() == [1, 2, 3, 99, 11, 12, 13, 99]
    assert conv.turns[1].k == 4 and not conv.turns[1].stopped
    assert conv.n_turns == 2
    assert conv.display_title == "Hello there, how are you today?"
    data = json.loads((tmp_path / cid / CONVERSATION_FILE).read_text())
    assert data["turns"][0]["token_ids"] == [1, 2]
    assert data["system_prompt"] == "" and data["created"] <= data["updated"]


def test_list_search_rename(tmp_path):
    store = SessionStore(tmp_path)
    a = chat(store, ("Tell me about SSD streaming", "It reads experts."))
    b = chat(store, ("Knock knock", "Who's there?"), system="You are a comedian.")
    listed = store.list()
    assert [s.id for s in listed] == [b, a]  # most recent first
    assert listed[0].n_turns == 1 and listed[0].model_id == "demo-moe"
    assert [s.id for s in store.search("EXPERTS")] == [a]
    hit = store.search("comedian")[0]
    assert hit.id == b and "comedian" in hit.snippet
    assert store.search("nothing like this") == []
    store.rename(a, "  SSD\nnotes\t\x1b[31m ")
    assert store.get(a).title == "SSD notes [31m"
    assert store.search("ssd notes")[0].id == a


def test_titles_are_never_paths(tmp_path):
    store = SessionStore(tmp_path)
    conv = store.create(title="../../etc/passwd")
    store.add_turn(conv, Turn("user", "/tmp/../x", [1]))
    assert sorted(p.name for p in tmp_path.iterdir()) == [conv.id]
    assert store.get(conv.id).title == "../../etc/passwd"
    out = store.export_to(conv.id, tmp_path.parent, "md")
    assert out.parent == tmp_path.parent and out.name == f"conversation-{conv.id}.md"


@pytest.mark.parametrize(
    "bad",
    ["../x", "..", "/etc", "20261129-191118-a1b2c3/..", "20261129-191118-A1B2C3", "", "a" * 30],
)
def test_ids_cannot_escape(tmp_path, bad):
    store = SessionStore(tmp_path)
    with pytest.raises(BadValueError, match="not a conversation id"):
        store.get(bad)
    with pytest.raises(BadValueError):
        store.delete(bad)
    with pytest.raises(BadValueError):
        store.mark_opened(bad)


def test_delete_and_missing(tmp_path):
    store = SessionStore(tmp_path)
    a = chat(store, ("one", "1"))
    b = chat(store, ("two", "2"))
    store.mark_opened(a)
    (tmp_path / a / "kv-00000004.safetensors").write_bytes(b"x")
    store.delete(a)
    assert not (tmp_path / a).exists()
    assert [p.name for p in tmp_path.iterdir() if not p.name.startswith(".")] == [b]
    assert store.last_opened() == b  # falls back to the most recent
    with pytest.raises(SessionNotFound, match=a):
        store.get(a)
    with pytest.raises(SessionNotFound):
        store.delete(a)


def _evil_id(text: str) -> str:
    return json.dumps({**json.loads(text), "id": "../../evil"})


# How a saved conversation is damaged -> what reading it back must say.
DAMAGE = {
    "cut short": (lambda text: '{"format": "ssdmoe-conv', "is not a valid conversation"),
    "an id inside that is a path": (_evil_id, "not a conversation id"),
}


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_corrupt_conversation_is_reported_not_raised_by_list(tmp_path, damage):
    """A damaged conversation is one line from `get` (the id inside the JSON is checked
    too) and a reported row, never an exception, from `list`."""
    rewrite, needle = DAMAGE[damage]
    store = SessionStore(tmp_path)
    good = chat(store, ("fine", "ok"))
    bad = chat(store, ("broken", "soon"))
    path = tmp_path / bad / CONVERSATION_FILE
    path.write_text(rewrite(path.read_text()))
    errors: list[str] = []
    assert [s.id for s in store.list(on_error=errors.append)] == [good]
    assert len(errors) == 1 and bad in errors[0] and "\n" not in errors[0]
    with pytest.raises(SessionCorrupt) as e:
        store.get(bad)
    assert needle in user_message(e.value)


def test_resume_tracking(tmp_path):
    store = SessionStore(tmp_path)
    assert store.last_opened() is None
    a = chat(store, ("first", "1"))
    b = chat(store, ("second", "2"))
    assert store.last_opened() == b
    store.mark_opened(a)
    assert store.last_opened() == a
    (tmp_path / ".last_opened").write_text("../../nope\n")
    assert store.last_opened() == b
    assert store.last_opened(fallback=False) is None


def test_clear_starts_a_new_context_and_keeps_the_old_text(tmp_path):
    store = SessionStore(tmp_path)
    a = chat(store, ("keep me", "kept"), system="Sys")
    new = store.clear(a)
    assert new.id != a and new.turns == [] and new.system_prompt == "Sys"
    assert new.model_id == "demo-moe" and new.fingerprint == "fp-1"
    assert store.get(a).turns[0].text == "keep me"
    assert store.last_opened() == new.id


def test_exports(tmp_path):
    store = SessionStore(tmp_path)
    cid = chat(store, ("What is 2+2?", "**4**"), system="Be exact.")
    conv = store.get(cid)
    conv.turns[-1].stopped = True
    store.save(conv)
    md = store.export_markdown(cid)
    assert md.startswith("# What is 2+2?\n")
    assert "## System\n\nBe exact.\n" in md
    assert "## User\n\nWhat is 2+2?\n" in md
    assert "## Assistant (K=4, stopped)\n\n**4**\n" in md
    data = json.loads(store.export_json(cid))
    assert data["turns"][1]["token_ids"] == [3, 99]
    assert "token_ids" not in json.loads(store.export_json(cid, include_tokens=False))["turns"][0]
    out = store.export_to(cid, tmp_path.parent / "chat.json", "json")
    assert json.loads(out.read_text())["id"] == cid
    with pytest.raises(BadValueError, match="md or json"):
        store.export_to(cid, tmp_path.parent, "pdf")


def test_validate_id_accepts_generated_ids(tmp_path):
    store = SessionStore(tmp_path)
    ids = {store.create().id for _ in range(5)}
    assert len(ids) == 5 and all(validate_id(i) == i for i in ids)


CHILD = """
import os, signal, sys
from pathlib import Path
from ssdmoe_tui.sessions import store as s
st = s.SessionStore(Path(sys.argv[1]))
conv = st.get(sys.argv[2])
def die(tmp):
    assert tmp.read_text().count("LOST REPLY") == 1  # the new text was fully written...
    os.kill(os.getpid(), signal.SIGKILL)             # ...and the process dies before rename
s._before_rename = die
st.add_turn(conv, s.Turn("assistant", "LOST REPLY", [5]))
"""


def test_killed_during_save_keeps_previous_text(tmp_path):
    store = SessionStore(tmp_path)
    cid = chat(store, ("survive", "this"))
    before = (tmp_path / cid / CONVERSATION_FILE).read_bytes()
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.run([sys.executable, "-c", CHILD, str(tmp_path), cid], env=env, timeout=60)
    assert proc.returncode == -9
    assert (tmp_path / cid / CONVERSATION_FILE).read_bytes() == before
    conv = store.get(cid)
    assert [t.text for t in conv.turns] == ["survive", "this"]
    leftovers = [p.name for p in (tmp_path / cid).iterdir() if p.name != CONVERSATION_FILE]
    assert leftovers and all(n.endswith(".tmp") for n in leftovers)  # the torn temp, ignored
    assert [s.id for s in store.list()] == [cid]

"""build_prompt / record_exchange against a stored conversation (genuine Qwen3 tokenizer)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from mlx_lm.tokenizer_utils import TokenizerWrapper
from transformers import AutoTokenizer

from ssdmoe_tui.engine.run.protocol import GenerationDone
from ssdmoe_tui.prompting.chat_format import encode, render
from ssdmoe_tui.prompting.message import Message
from ssdmoe_tui.sessions.app_sessions import AppSessions
from ssdmoe_tui.sessions.store import SessionNotFound, SessionStore
from ssdmoe_tui.sessions.turns import build_prompt, tokenizer_id
from tests.helpers.chat_templates import CHATML, IM_END, QWEN3
from tests.helpers.turn_records import record_exchange


@pytest.fixture(scope="module")
def tok():
    return TokenizerWrapper(AutoTokenizer.from_pretrained(str(QWEN3)))


def test_turns_build_the_exact_history(tmp_path, tok):
    store = SessionStore(tmp_path)
    conv = store.create("qwen3", "fp", "Be brief.")
    prompt, delta = build_prompt(tok, conv, "Hi")
    assert (
        prompt
        == delta
        == encode(
            tok,
            render(
                tok,
                conv.messages() + [{"role": "user", "content": "Hi"}],
                add_generation_prompt=True,
            ),
        )
    )
    reply = encode(tok, "Hello!") + [IM_END]
    assert record_exchange(store, conv, "Hi", delta, "Hello!", reply, "stop", [8] * len(reply))
    prompt2, delta2 = build_prompt(tok, store.get(conv.id), "Bye")
    assert prompt2 == prompt + reply + delta2
    assert tok.decode(delta2) == "\n<|im_start|>user\nBye<|im_end|>\n<|im_start|>assistant\n"
    saved = store.get(conv.id)
    assert saved.turns[1].k == 8 and not saved.turns[1].stopped
    assert saved.history_tokens() == prompt + reply


def test_stopped_and_failed_replies(tmp_path, tok):
    store = SessionStore(tmp_path)
    conv = store.create()
    _, delta = build_prompt(tok, conv, "Count")
    assert not record_exchange(store, conv, "Count", delta, "", [], "error")
    assert store.get(conv.id).turns == []  # a failed turn leaves the history untouched
    cut = encode(tok, "1, 2, 3")
    assert record_exchange(store, conv, "Count", delta, "1, 2, 3", cut, "cancelled", [4, 4, 2])
    saved = store.get(conv.id)
    assert saved.turns[1].stopped and saved.turns[1].k == 4
    _, delta2 = build_prompt(tok, saved, "Go on")
    assert delta2[0] == IM_END  # the cut reply is closed before the next user turn


def test_switching_tokenizer_rebuilds_the_token_history(tmp_path, tok):
    """Ids from one tokenizer mean nothing to another: the history is re-tokenized (as
    the new template renders it) before the next prompt is built."""
    store = SessionStore(tmp_path)
    conv = store.create("qwen3", "fp", "Sys")
    for user, reply in [("Hi", "Hello!"), ("More", "Sure: more.")]:
        _, delta = build_prompt(tok, conv, user)
        record_exchange(store, conv, user, delta, reply, encode(tok, reply) + [IM_END], "stop")
    other = TokenizerWrapper(AutoTokenizer.from_pretrained(str(QWEN3)))
    other._tokenizer.chat_template = CHATML.replace(
        "'\\n' }}{% endfor %}", "'\\n\\n' }}{% endfor %}"
    )
    assert tokenizer_id(other) != tokenizer_id(tok)
    conv = store.get(conv.id)
    prompt, delta = build_prompt(other, conv, "Last")
    full = conv.messages() + [{"role": "user", "content": "Last"}]
    assert prompt == encode(other, render(other, full, add_generation_prompt=True))
    assert conv.tokenizer_id == tokenizer_id(other)
    assert conv.history_tokens() + delta == prompt


INFO = SimpleNamespace(name="qwen3", fingerprint="fp-q")


def done_for(prompt, reply_ids, finish="stop", text="x"):
    return GenerationDone("r", text, tuple(prompt), tuple(reply_ids), finish, (4,) * len(reply_ids))


def test_app_sessions_and_prompt_hook(tmp_path, tok):
    store = SessionStore(tmp_path)
    app = AppSessions(store, system_prompt="Sys")
    sid, shown = app.open(None)
    assert shown == [] and not store.folder(sid).exists()
    msgs = [Message("system", "Sys"), Message("user", "Hi")]
    p1 = app.prompt(sid, msgs, tok, INFO)
    assert store.get(sid).system_prompt == "Sys" and store.get(sid).fingerprint == "fp-q"
    r1 = encode(tok, "Hello") + [IM_END]
    msgs.append(Message("assistant", "Hello"))
    app.record(sid, msgs[1:], done_for(p1, r1, text="Hello"))
    msgs.append(Message("user", "Again"))
    p2 = app.prompt(sid, msgs, tok, INFO)
    assert p2[: len(p1) + len(r1)] == p1 + r1  # exact history
    # a failed turn records nothing; a reply the app dropped leaves the user turn only
    app.record(sid, msgs[1:], done_for(p2, [], finish="error"))
    assert len(store.get(sid).turns) == 2
    app.record(sid, msgs[1:], done_for(p2, [], finish="cancelled", text=""))
    assert [t.role for t in store.get(sid).turns] == ["user", "assistant", "user"]
    # the stored history no longer ends with a reply: the caller templates the messages
    msgs.append(Message("user", "Hello?"))
    assert app.prompt(sid, msgs, tok, INFO) is None
    p3 = encode(tok, render(tok, [m.__dict__ for m in msgs], add_generation_prompt=True))
    msgs.append(Message("assistant", "Yes"))
    app.record(sid, msgs[1:], done_for(p3, encode(tok, "Yes") + [IM_END], text="Yes"))
    conv = store.get(sid)  # re-based on that prompt: ids still exact
    assert conv.history_tokens() == p3 + encode(tok, "Yes") + [IM_END]
    assert [t.text for t in conv.turns] == [m.content for m in msgs[1:]]
    assert app.open("")[0] == sid and app.open(sid)[1][-1].content == "Yes"


def test_tool_results_are_saved_as_their_calls_end_and_get_their_ids_when_fed(tmp_path, tok):
    """Issue 45: each result is saved when its call ends (`keep_tool_results`), without
    ids; the prompt that feeds the round back is built on the exact history as before,
    and the record gives the run its ids (on its first turn), the pending ones replaced."""
    store = SessionStore(tmp_path)
    app = AppSessions(store)
    sid = app.open(None)[0]
    msgs = [Message("user", "Weather in Paris and Rome?")]
    p1 = app.prompt(sid, msgs, tok, INFO)
    call = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    r1 = encode(tok, call) + [IM_END]
    msgs.append(Message("assistant", call))
    app.record(sid, msgs, done_for(p1, r1, text=call))
    paris = Message("tool", "Paris: 21 C", name="get_weather", tool_call_id="c1")
    rome = Message("tool", "Rome: 25 C", name="get_weather", tool_call_id="c2")
    app.keep_tool_results(sid, [*msgs, paris])
    conv = store.get(sid)
    assert [(t.role, t.text, t.token_ids) for t in conv.turns[2:]] == [("tool", "Paris: 21 C", [])]
    app.keep_tool_results(sid, [*msgs, paris, rome])  # the round so far, replacing the first
    assert [t.text for t in store.get(sid).turns] == [msgs[0].content, call, paris.content,
                                                      rome.content]  # fmt: skip
    app.keep_tool_results(sid, [Message("user", "another chat"), Message("assistant", "x"), rome])
    assert len(store.get(sid).turns) == 4  # not this conversation: nothing changed
    assert app.open(sid)[1][-1].content == "Rome: 25 C"  # a resume shows them
    p2 = app.prompt(sid, [*msgs, paris, rome], tok, INFO)
    assert p2[: len(p1) + len(r1)] == p1 + r1  # built on the exact stored ids
    assert "<tool_response>\nRome: 25 C\n</tool_response>" in tok.decode(p2[len(p1) + len(r1) :])
    assert len(store.get(sid).turns) == 4  # the prompt leaves the pending results saved
    r2 = encode(tok, "Sunny in both.") + [IM_END]
    app.record(sid, [*msgs, paris, rome, Message("assistant", "Sunny in both.")],
               done_for(p2, r2, text="Sunny in both."))  # fmt: skip
    conv = store.get(sid)
    assert [t.role for t in conv.turns] == ["user", "assistant", "tool", "tool", "assistant"]
    assert conv.turns[2].token_ids == p2[len(p1) + len(r1) :] and conv.turns[3].token_ids == []
    assert conv.history_tokens() == p2 + r2


def test_system_prompt_changed_mid_conversation_rebuilds_every_turn(tmp_path, tok):
    """Issue 22, defect 1: the prompt after a new system prompt holds every earlier turn
    with its own ids, so a regenerate after it (a rewind to the earlier turns) still
    starts from the whole history; the turns keep their metadata."""
    store = SessionStore(tmp_path)
    app = AppSessions(store)
    sid, _ = app.open(None)
    msgs = [Message("user", "Hi")]
    p1 = app.prompt(sid, msgs, tok, INFO)
    r1 = encode(tok, "Hello") + [IM_END]
    msgs.append(Message("assistant", "Hello"))
    app.record(sid, msgs, done_for(p1, r1, text="Hello"), "qwen3")
    before = store.get(sid).turns
    msgs.append(Message("user", "Again"))
    p2 = app.prompt(sid, [Message("system", "Be a pirate"), *msgs], tok, INFO)
    full = [{"role": "system", "content": "Be a pirate"}] + [m.__dict__ for m in msgs]
    assert p2 == encode(tok, render(tok, full, add_generation_prompt=True))
    msgs.append(Message("assistant", "Arr"))
    arr = done_for(p2, encode(tok, "Arr") + [IM_END], text="Arr")
    app.record(sid, msgs, arr, "qwen3", {"system_prompt": "Be a pirate"})
    conv = store.get(sid)
    assert all(t.token_ids for t in conv.turns)
    assert [(t.created, t.model, t.k) for t in conv.turns[:2]] == [
        (t.created, t.model, t.k) for t in before
    ]
    app.rewind(sid, 2)  # a regenerate of the last reply
    again, _ = build_prompt(tok, store.get(sid), "Again")
    assert again == p2


def test_a_rebased_conversation_keeps_its_turns_metadata_and_its_whole_context(tmp_path, tok):
    """A prompt the stored ids did not build (the controller templated the messages) re-bases
    the conversation: its turns keep time, K, model and speed, and the next prompt,
    also after a rewind, holds the whole history."""
    store = SessionStore(tmp_path)
    app = AppSessions(store)
    sid, _ = app.open(None)
    msgs = [Message("user", "Hi")]
    p1 = app.prompt(sid, msgs, tok, INFO)
    msgs.append(Message("assistant", "Hello"))
    # The reply's stored ids are not its text's (as after an edit elsewhere), so the
    # template of the messages does not extend them.
    app.record(sid, msgs, done_for(p1, encode(tok, "Hi there") + [IM_END], text="Hello"), "m")
    before = store.get(sid).turns
    msgs.append(Message("user", "Again"))
    p2 = encode(tok, render(tok, [m.__dict__ for m in msgs], add_generation_prompt=True))
    msgs.append(Message("assistant", "Yes"))
    app.record(sid, msgs, done_for(p2, encode(tok, "Yes") + [IM_END], text="Yes"))
    conv = store.get(sid)  # re-based: the last prompt carries every id
    assert conv.turns[2].token_ids == p2 and not conv.turns[0].token_ids
    assert (conv.turns[1].model, conv.turns[1].k, conv.turns[1].created) == (
        "m",
        before[1].k,
        before[1].created,
    )
    app.rewind(sid, 2)
    prompt, _ = build_prompt(tok, store.get(sid), "Again")
    assert prompt == p2


def test_prompt_hook_declines_histories_it_does_not_hold(tmp_path, tok):
    store = SessionStore(tmp_path)
    app = AppSessions(store)
    sid = app.open(None)[0]
    two = [Message("user", "a"), Message("assistant", "b"), Message("user", "c")]
    assert app.prompt(sid, two, tok, INFO) is None  # never stored
    assert not store.folder(sid).exists()
    assert app.prompt(sid, [Message("user", "a")], tok, INFO) is not None
    # Another system prompt over the same turns (F9 mid-conversation): rebuilt under it.
    other = app.prompt(sid, [Message("system", "other"), Message("user", "a")], tok, INFO)
    assert "other" in tok.decode(other) and store.get(sid).system_prompt == "other"
    with pytest.raises(SessionNotFound):
        AppSessions(SessionStore(tmp_path / "empty")).open("")


def test_settings_of_a_conversation_saved_before_settings_keep_its_system_prompt(ssdmoe_home):
    """An older conversation (no `settings`) resumes with its own system prompt, not the
    config's, and a conversation's replaced exchanges survive a save and a load."""
    from ssdmoe_tui.config import GenSettings
    from ssdmoe_tui.sessions.store import Turn

    store = SessionStore()
    conv = store.create("m", "fp", "Old prompt.")
    conv.turns = [Turn("user", "a", [1]), Turn("assistant", "b", [2], k=4)]
    store.save(conv)
    app = AppSessions(store, "Config prompt.")
    saved = app.settings_of(conv.id)
    assert GenSettings.from_saved(saved, GenSettings()).system_prompt == "Old prompt."
    app.rewind(conv.id, 0)
    again = store.get(conv.id)
    assert again.turns == [] and [[t.text for t in g] for g in again.replaced] == [["a", "b"]]
    app.save_settings(conv.id, {"max_tokens": 7, "temperature": "hot"})
    restored = GenSettings.from_saved(app.settings_of(conv.id), GenSettings())
    assert restored.max_tokens == 7 and restored.temperature == 0.0  # a bad one: the default

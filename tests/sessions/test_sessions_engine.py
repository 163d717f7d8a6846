"""Acceptance: conversations persist through the real engine, non-hybrid and hybrid.

Three turns with short user messages reuse >= 97% of each prompt from the KV cache;
a 'restart' (a new EngineService, same data folder) resumes the conversation from its
checkpoint, feeds only the new message (plus the previous reply's last token, which a
turn samples but never feeds), and produces the same greedy tokens as a run that never
stopped. Bad checkpoints cost a notice and a re-prefill, never the conversation.
"""

from __future__ import annotations

import queue
import time

import pytest
from mlx_lm.utils import load_tokenizer

from ssdmoe_tui.engine.run import protocol as P
from ssdmoe_tui.engine.run.service import EngineService, KVHooks
from ssdmoe_tui.options import SamplingOptions
from ssdmoe_tui.prompting.message import Message
from ssdmoe_tui.sessions.app_sessions import AppSessions
from ssdmoe_tui.sessions.checkpoints import list_checkpoints
from ssdmoe_tui.sessions.kv_hooks import SessionKV
from ssdmoe_tui.sessions.store import SessionStore
from ssdmoe_tui.sessions.turns import build_prompt
from tests.helpers.checkpoints import build
from tests.helpers.engine_events import next_of
from tests.helpers.texts import SYSTEM
from tests.helpers.turn_records import record_exchange

USERS = ["How do experts get streamed from disk?", "Go on.", "Why?", "Thanks, more."]
MAX_TOKENS = 12
TIMEOUT = 120


class Client:
    """An engine service with session persistence, driven like the app drives it."""

    def __init__(self, path, store: SessionStore) -> None:
        self.events: queue.Queue = queue.Queue()
        self.notices: list[str] = []
        self.svc = EngineService(self.events.put)
        self.svc.start()
        self.svc.submit(P.LoadModel(path=str(path)))
        self.info = self._wait(P.ModelLoaded).info
        self.kv = SessionKV(store, notice=self.notices.append)
        self.svc.kv_hooks = KVHooks(save=self.kv.save, load=self.kv.load)
        self.tok = load_tokenizer(path)
        self.store = store

    def _wait(self, kind):
        return next_of(self.events, kind, self.notices, TIMEOUT)

    def send(self, conv, text: str, record: bool = True) -> tuple[P.GenerationDone, list[int]]:
        """One turn: exact-history prompt, generate greedily, store both turns."""
        prompt, delta = build_prompt(self.tok, conv, text)
        if conv.turns:
            assert prompt[: len(conv.history_tokens())] == conv.history_tokens()
        rid = f"r{len(conv.turns)}"
        self.svc.submit(
            P.Generate(
                rid,
                prompt_tokens=tuple(prompt),
                sampling=SamplingOptions(max_tokens=MAX_TOKENS),
                session_id=conv.id,
            )
        )
        done = self._wait(P.GenerationDone)
        self.settle()
        assert done.request_id == rid and done.finish_reason in ("stop", "length")
        assert list(done.prompt_token_ids) == prompt
        if record:
            assert record_exchange(
                self.store,
                conv,
                text,
                delta,
                done.text,
                done.token_ids,
                done.finish_reason,
                done.k_per_token,
            )
        return done, delta

    def settle(self) -> None:
        """Wait until the engine has finished the turn (the KV save runs after GenerationDone)."""
        deadline = time.monotonic() + TIMEOUT
        while self.svc.busy and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not self.svc.busy

    def close(self) -> None:
        self.svc.shutdown()


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    from ssdmoe_tui.models.demo import ensure_demo_model

    root = tmp_path_factory.mktemp("session-models")
    return {
        "demo (qwen3_moe)": lambda: ensure_demo_model(root / "demo"),
        "qwen3_5_moe": lambda: build("qwen3_5_moe", root / "qwen3_5_moe"),
        "nemotron_h": lambda: build("nemotron_h", root / "nemotron_h"),
        "qwen3_moe": lambda: build("qwen3_moe", root / "qwen3_moe"),
        "qwen3_moe other weights": lambda: build("qwen3_moe", root / "other", seed=11),
    }


def three_turns(model, store):
    a = Client(model, store)
    conv = store.create(a.info.name, a.info.fingerprint, SYSTEM)
    store.mark_opened(conv.id)
    rates = []
    for text in USERS[:3]:
        done, _ = a.send(conv, text)
        rates.append(done.stats["kv_hit_rate"])
    return a, conv, rates


@pytest.mark.parametrize("name", ["demo (qwen3_moe)", "qwen3_5_moe", "nemotron_h"])
def test_three_turns_restart_resume_matches_uninterrupted(models, name, ssdmoe_home):
    model = models[name]()
    store = SessionStore()
    a, conv, rates = three_turns(model, store)
    assert a.info.hybrid == (name != "demo (qwen3_moe)")
    assert rates[0] == 0.0 and min(rates[1:]) >= 0.97, rates
    assert a.notices == []
    assert list_checkpoints(store.folder(conv.id))  # saved after each turn

    # the uninterrupted fourth turn (same engine, cache from memory; not saved)
    a.svc.kv_hooks = KVHooks()
    expected, _ = a.send(store.get(conv.id), USERS[3], record=False)
    a.close()

    # restart: a new engine, same data folder; resume the last conversation
    b = Client(model, SessionStore())
    resumed = b.store.get(b.store.last_opened())
    assert resumed.id == conv.id and resumed.n_turns == 3
    history = resumed.history_tokens()
    done, delta = b.send(resumed, USERS[3])
    assert done.token_ids == expected.token_ids
    assert done.stats["reused_prompt_tokens"] == len(history) - 1
    prefilled = done.stats["prompt_tokens"] - done.stats["reused_prompt_tokens"]
    assert prefilled == len(delta) + 1  # the new message + turn 3's last sampled token
    assert done.stats["kv_hit_rate"] >= 0.97
    assert b.notices == [] and b.kv.last_load_s > 0
    b.close()


def corrupt(path) -> None:
    data = bytearray(path.read_bytes())
    data[-50] ^= 0xFF
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("damage", ["corrupt", "truncated", "missing", "all corrupt"])
def test_bad_checkpoint_costs_a_notice_not_the_conversation(models, damage, ssdmoe_home):
    model = models["nemotron_h"]()  # hybrid: no trimming to hide behind
    store = SessionStore()
    a, conv, _ = three_turns(model, store)
    a.close()
    ckpts = list_checkpoints(store.folder(conv.id))
    assert len(ckpts) == 2  # turns 3 and 2 (keep=2)
    newest, older = ckpts
    if damage == "corrupt":
        corrupt(newest.path)
    elif damage == "truncated":
        newest.path.write_bytes(newest.path.read_bytes()[: newest.size // 2])
    elif damage == "missing":
        newest.path.unlink()
    else:
        corrupt(newest.path)
        corrupt(older.path)

    b = Client(model, SessionStore())
    resumed = b.store.get(conv.id)
    assert [t.text for t in resumed.turns] == [t.text for t in store.get(conv.id).turns]
    done, _ = b.send(resumed, USERS[3])
    reused = done.stats["reused_prompt_tokens"]
    if damage == "all corrupt":
        assert reused == 0  # rebuilt from the stored token ids
        assert any("checkpoint ignored" in n and "corrupt" in n for n in b.notices)
    else:
        assert reused == older.n_tokens  # the previous checkpoint served
        if damage == "missing":
            assert b.notices == []
        else:
            assert any("checkpoint ignored" in n for n in b.notices), b.notices
    assert done.finish_reason in ("stop", "length") and len(done.token_ids) > 0
    b.close()


def test_checkpoint_of_another_model_is_ignored(models, ssdmoe_home):
    store = SessionStore()
    a, conv, _ = three_turns(models["qwen3_moe"](), store)
    a.close()
    b = Client(models["qwen3_moe other weights"](), SessionStore())
    resumed = b.store.get(conv.id)
    done, _ = b.send(resumed, USERS[3])
    assert done.stats["reused_prompt_tokens"] == 0
    assert any("another model" in n for n in b.notices), b.notices
    b.close()


def test_app_path_prompt_hook_and_record(models, ssdmoe_home):
    """The chat app's path: `AppSessions.prompt` turns its messages into the exact-history
    prompt ids the engine takes; `AppSessions.record` saves each exchange from GenerationDone. Resume with
    `open("")` (`ssdmoe --resume`) after a restart, then continue from the checkpoint."""
    model = models["qwen3_5_moe"]()

    def turn(client, app, sid, messages, text):
        messages.append(Message("user", text))
        prompt = app.prompt(sid, messages, client.tok, client.info)
        assert prompt is not None
        client.svc.submit(
            P.Generate(
                f"r{len(messages)}",
                prompt_tokens=tuple(prompt),
                sampling=SamplingOptions(max_tokens=MAX_TOKENS),
                session_id=sid,
            )
        )
        done = client._wait(P.GenerationDone)
        client.settle()
        messages.append(Message("assistant", done.text))
        app.record(sid, [m for m in messages if m.role != "system"], done)
        return done

    a = Client(model, SessionStore())
    app = AppSessions(SessionStore())
    sid, shown = app.open(None)
    assert shown == [] and not SessionStore().folder(sid).exists()
    messages = [Message("system", SYSTEM)]
    rates = [turn(a, app, sid, messages, t).stats["kv_hit_rate"] for t in USERS[:3]]
    assert min(rates[1:]) >= 0.97, rates
    a.close()

    b = Client(model, SessionStore())
    app2 = AppSessions(SessionStore())
    sid2, shown = app2.open("")
    assert sid2 == sid and [m.content for m in shown] == [m.content for m in messages[1:]]
    conv = SessionStore().get(sid)
    assert conv.system_prompt == SYSTEM and conv.fingerprint == b.info.fingerprint
    done = turn(b, app2, sid, [messages[0], *shown], USERS[3])
    assert done.stats["reused_prompt_tokens"] == len(conv.history_tokens()) - 1
    assert SessionStore().get(sid).history_tokens() == list(done.prompt_token_ids) + list(
        done.token_ids
    )
    b.close()

"""One contract over every `protocol.EngineClient`: the in-process `EngineService` and the
chat's `RemoteEngine` (a real `ssdmoe serve` subprocess on a loopback port), both on the
same random demo model. What the chat controller relies on holds for both: a reply
streams in Tokens and ends with one GenerationDone whose text is theirs; a SetK reaches
the next reply's tokens; a cancel stops the reply in flight and the engine serves the
next; a refused request is an EngineError naming it; shutdown ends the engine's threads.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from ssdmoe_tui.chat.remote import ChatTurn, RemoteEngine
from ssdmoe_tui.engine.run import protocol as P
from ssdmoe_tui.engine.run.service import EngineService
from ssdmoe_tui.options import SamplingOptions
from ssdmoe_tui.prompting.chat_format import prompt_tokens
from ssdmoe_tui.prompting.message import Message
from tests.helpers.engine_events import Events
from tests.helpers.serve_process import start_server, stop

TIMEOUT = 90.0  # one reply or one load on a busy 2-core machine
KINDS = ("service", "remote")


@dataclass
class Engine:
    """An engine under contract, with its events and what a request needs."""

    client: P.EngineClient
    events: Events
    info: P.ModelInfo
    tokenizer: object  # the model's (a remote engine's server keeps its own)
    n: int = 0

    def ask(self, text: str | None, max_tokens: int) -> str:
        """Submit a one-message chat (None: an empty one, which no engine can take) the
        way this engine takes it; its request id."""
        self.n += 1
        rid = f"c{self.n}"
        sampling = SamplingOptions(max_tokens=max_tokens)
        messages = () if text is None else (Message("user", text),)
        if self.client.takes_messages:
            self.client.submit(ChatTurn(rid, messages, sampling=sampling))
        else:
            chat = [{"role": m.role, "content": m.content} for m in messages]
            ids = tuple(prompt_tokens(self.tokenizer, chat)) if chat else ()
            self.client.submit(P.Generate(rid, prompt_tokens=ids, sampling=sampling))
        return rid

    def reply(self, rid: str, seen: list = ()) -> tuple[P.GenerationDone, list[P.Tokens]]:
        """The request's GenerationDone and its Tokens (`seen`: events read before)."""
        done, rest = self.events.until(P.GenerationDone, pred=lambda e: e.request_id == rid)
        events = [*seen, *rest]
        return done, [e for e in events if isinstance(e, P.Tokens) and e.request_id == rid]


def _engine_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name.startswith("ssdmoe-")}


def open_engine(kind: str, demo_model, url: str | None) -> Engine:  # noqa: ANN001
    """A started engine with the demo model loaded (the service loads it; the remote
    engine attaches to the server that holds it)."""
    events = Events()
    if kind == "service":
        client = EngineService(events.post)
        client.use_model_lock = False  # the server's claim on the same model is not ours
        client.start()
        client.submit(P.LoadModel(path=str(demo_model)))
    else:
        client = RemoteEngine(url, events.post)
        client.start()
    loaded, _ = events.until(P.ModelLoaded)
    tokenizer = loaded.tokenizer
    if tokenizer is None:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(str(demo_model))
    return Engine(client, events, loaded.info, tokenizer)


@pytest.fixture(scope="module")
def served(demo_model, tmp_path_factory) -> Iterator[str]:
    served = start_server(demo_model, tmp_path_factory.mktemp("serve"))
    yield served.url
    stop(served.proc)


@pytest.fixture(scope="module", params=KINDS)
def engine(request, demo_model, served) -> Iterator[Engine]:
    eng = open_engine(request.param, demo_model, served)
    yield eng
    eng.client.shutdown(10.0)


def test_both_engines_are_engine_clients(engine):
    assert isinstance(engine.client, P.EngineClient)
    assert engine.info.name == "demo-model" and engine.info.num_experts == 32
    assert engine.info.k == engine.info.trained_k == 4


def test_a_reply_streams_in_tokens_and_ends_once_with_its_text(engine):
    rid = engine.ask("hello there", max_tokens=12)
    done, tokens = engine.reply(rid)
    assert done.finish_reason in ("length", "stop"), done
    assert tokens and "".join(t.text for t in tokens) == done.text
    assert 0 < len(done.k_per_token) <= 12 and set(done.k_per_token) == {4}
    engine.events.until(P.PhaseChanged, pred=lambda e: e.phase == "idle")
    late = []
    while not engine.events.q.empty():
        late.append(engine.events.q.get_nowait())
    assert not [e for e in late if getattr(e, "request_id", None) == rid], late


def test_set_k_reaches_the_next_reply(engine):
    engine.client.submit(P.SetK(2))
    try:
        done, _ = engine.reply(engine.ask("count to ten", max_tokens=6))
        assert done.k_per_token and set(done.k_per_token) == {2}, done.k_per_token
    finally:
        engine.client.submit(P.SetK(4))
    done, _ = engine.reply(engine.ask("and again", max_tokens=4))
    assert set(done.k_per_token) == {4}


def test_cancel_stops_the_reply_in_flight_and_the_next_one_runs(engine):
    rid = engine.ask("tell me a very long story", max_tokens=2000)
    _, seen = engine.events.until(P.Tokens, pred=lambda e: e.request_id == rid)
    engine.client.cancel(rid)
    done, tokens = engine.reply(rid, seen)
    assert done.finish_reason == "cancelled"
    assert done.text == "".join(t.text for t in tokens)
    assert len(done.text) < 2000 * 16  # stopped long before its max tokens
    after, _ = engine.reply(engine.ask("short one", max_tokens=3))
    assert after.finish_reason in ("length", "stop") and after.text


def test_a_refused_request_is_one_error_naming_it_and_the_engine_serves_on(engine):
    rid = engine.ask(None, max_tokens=4)
    err, _ = engine.events.until(P.EngineError, pred=lambda e: e.request_id == rid)
    assert err.message and "\n" not in err.message and not err.fatal
    done, _ = engine.reply(engine.ask("still there?", max_tokens=3))
    assert done.finish_reason in ("length", "stop")


@pytest.mark.parametrize("kind", KINDS)
def test_shutdown_ends_the_engine_threads(kind, demo_model, served):
    before = _engine_threads()
    eng = open_engine(kind, demo_model, served)
    assert _engine_threads() - before  # it runs threads of its own
    t0 = time.monotonic()
    eng.client.shutdown(10.0)
    assert time.monotonic() - t0 < 10.0
    end = time.monotonic() + 5.0
    while _engine_threads() - before and time.monotonic() < end:
        time.sleep(0.05)
    assert not _engine_threads() - before, [t.name for t in _engine_threads() - before]

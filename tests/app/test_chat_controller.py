"""ChatController (the chat's state without Textual) against the real engine service."""

from __future__ import annotations

from dataclasses import replace

from ssdmoe_tui.chat.controller import ChatController
from ssdmoe_tui.config import ChatSettings
from ssdmoe_tui.engine.run import protocol as P
from ssdmoe_tui.engine.run.service import EngineService
from tests.helpers.engine_events import Events, start


def streaming_hello(path) -> tuple[EngineService, Events, ChatController]:
    """The engine on `path` and a controller whose reply to "hello" (4000 tokens at most:
    it outlasts the test's next step) has begun to stream; the caller shuts `svc` down."""
    svc, ev = start(path)
    ctrl = ChatController(ChatSettings(), engine=svc, model=svc.model_info, tokenizer=ev.tokenizer)
    try:
        request = ctrl.prepare("hello")
        ctrl.submit(replace(request, sampling=replace(request.sampling, max_tokens=4000)))
        ev.until(P.Tokens)
    except BaseException:
        svc.shutdown()
        raise
    return svc, ev, ctrl


def test_k_asked_while_a_model_loads_is_applied_once_it_has_loaded(checkpoints) -> None:
    """While a model loads the engine has no runner: a SetK sent then came back as an
    EngineError without a request id, which the controller read as a failed load (the
    load was forgotten, a pending cache size dropped, the K lost)."""
    path = checkpoints("qwen3_moe")
    first, _ = start(path)  # a real ModelInfo: the model the app already holds
    info = first.model_info
    first.shutdown()
    assert info is not None and info.k == 4
    ev = Events()
    svc = EngineService(ev.post)  # its thread starts below: the load is still queued
    ctrl = ChatController(ChatSettings(), engine=svc, model=info)
    try:
        ctrl.open_model(str(path))
        ctrl.set_k(2)
        while not ev.q.empty():
            e = ev.q.get_nowait()
            assert not isinstance(e, P.EngineError), e.message
        assert ctrl.loading == str(path)
        svc.start()
        loaded, _ = ev.until(P.ModelLoaded)
        assert ctrl.model_loaded(loaded.info, loaded.tokenizer).k == 2
        assert svc.model_info is not None and svc.model_info.k == 2
    finally:
        svc.shutdown()


def test_reply_cut_by_a_model_switch_stays_in_the_conversation(checkpoints) -> None:
    """A reply abandoned by opening a model while its conversation stays on screen is
    settled like a stopped one: the text that arrived joins the history (and its stats
    the screen), so the next prompt does not follow an unanswered one."""
    path = checkpoints("qwen3_moe")
    svc, ev, ctrl = streaming_hello(path)
    try:
        ctrl.open_model(str(path))  # the reply in flight is abandoned
        done, _ = ev.until(P.GenerationDone)
        assert done.text and done.finish_reason != "length"  # stopped, not run to the end
        stats = ctrl.reply_done(done)
        assert stats is not None
        assert [(m.role, m.content) for m in ctrl.history] == [
            ("user", "hello"),
            ("assistant", done.text),
        ]
        loaded, _ = ev.until(P.ModelLoaded)
        ctrl.model_loaded(loaded.info, loaded.tokenizer)
        again = ctrl.prepare("again")
        assert [m.role for m in ctrl.history] == ["user", "assistant", "user"]
        assert list(again.prompt_tokens[: len(done.prompt_token_ids)]) == list(
            done.prompt_token_ids
        )  # the whole chat, its first turn included, goes to the engine
    finally:
        svc.shutdown()


def test_reply_of_a_closed_conversation_is_dropped(checkpoints) -> None:
    """New chat while a reply streams: the reply belongs to no conversation now."""
    svc, ev, ctrl = streaming_hello(checkpoints("qwen3_moe"))
    try:
        ctrl.new_chat()
        done, _ = ev.until(P.GenerationDone)
        assert ctrl.reply_done(done) is None and ctrl.history == []
        assert ctrl.why_not_send() is None
    finally:
        svc.shutdown()


def test_a_hostile_chat_template_is_one_line_and_the_chat_goes_on(checkpoints, tmp_path) -> None:
    """Issue 23: the app's path (the controller templating a turn) with a template whose
    nested loops would run for hours: refused within the render budget in one line naming
    chat_template.jinja; no turn is added and the engine was never asked."""
    import shutil
    import time

    import pytest

    from ssdmoe_tui.chat.controller import Refused

    model = tmp_path / "model"
    shutil.copytree(checkpoints("qwen3_moe"), model)
    (model / "chat_template.jinja").write_text(
        "{% for i in range(100000) %}{% for j in range(100000) %}x{% endfor %}{% endfor %}"
    )
    svc, ev = start(model)
    ctrl = ChatController(ChatSettings(), engine=svc, model=svc.model_info, tokenizer=ev.tokenizer)
    try:
        t0 = time.monotonic()
        with pytest.raises(Refused) as refused:
            ctrl.prepare("hello")
        assert time.monotonic() - t0 < 15
        line = str(refused.value)
        assert "\n" not in line and "chat_template.jinja" in line and "budget" in line, line
        assert ctrl.history == []
        assert svc.model_info is not None  # the engine is there and idle
    finally:
        svc.shutdown()

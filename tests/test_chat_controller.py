"""ChatController (the chat's state without Textual) against the real engine service."""

from __future__ import annotations

from ssdmoe_tui.chat.controller import ChatController
from ssdmoe_tui.config import ChatSettings
from ssdmoe_tui.engine import protocol as P
from ssdmoe_tui.engine.service import EngineService
from tests.test_engine_service import Events, start


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
        assert ctrl.model_loaded(loaded.info).k == 2
        assert svc.model_info is not None and svc.model_info.k == 2
    finally:
        svc.shutdown()

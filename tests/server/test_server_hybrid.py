"""The server's prompt cache on hybrid models (Mamba / gated-delta state that cannot be
trimmed): turn N+1 must extend turn N's exact tokens, or nothing is reused. Three turns
reuse >= 97 %, a restarted server continues from the checkpoint on disk, and a new chat
with the same system prompt loads the system part's own checkpoint."""

from __future__ import annotations

import pytest

from ssdmoe_tui.options import EngineOptions
from ssdmoe_tui.server.main import ServeOptions
from tests.helpers.server import (
    Running,
    assert_new_chat_reuses_system_prompt,
    conversation_turns,
)


@pytest.mark.parametrize(
    "arch", ["qwen3_5_moe"]
)  # nemotron_h: tests/sessions/test_sessions_engine.py
def test_hybrid_multi_turn_and_restart(checkpoints, tmp_path, arch):
    model = checkpoints(arch)
    options = ServeOptions(EngineOptions(model=str(model)), cache_root=tmp_path / "sc")
    srv = Running(options)
    try:
        assert srv.server.engine.info.hybrid
        messages, usages = conversation_turns(srv.client(), srv.model, 3)
    finally:
        srv.stop()
    assert usages[0].prompt_tokens_details.cached_tokens == 0  # cold (the system step is its own)
    for u in usages[1:]:
        assert u.prompt_tokens_details.cached_tokens >= 0.97 * u.prompt_tokens, u
    again = Running(options)
    try:
        _, usages = conversation_turns(again.client(), again.model, 1, start=messages)
        u = usages[0]
        assert u.prompt_tokens_details.cached_tokens >= 0.97 * u.prompt_tokens, u
        assert again.server.kv.last_load is not None  # from disk, not a re-prefill
        cached = assert_new_chat_reuses_system_prompt(again)
        assert again.server.kv.last_load[1] == cached  # the system part's checkpoint
    finally:
        again.stop()

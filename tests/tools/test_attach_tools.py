"""The tool loop attached to a server (`--attach`): the app sends the MCP tools with
each request of the server's tool-calling API (OpenAI's `tools`), the server's parser
returns the scripted model's call as `tool_calls`, the user approves it in the app, the
result goes back as a `tool` message and the server's model answers with it. A real
`ssdmoe serve` subprocess, the real MCP server, the pilot."""

from __future__ import annotations

from ssdmoe_tui.mcp_config import check_mcp_servers
from ssdmoe_tui.sessions.app_sessions import AppSessions
from ssdmoe_tui.sessions.store import SessionStore
from ssdmoe_tui.ui.app import ChatSettings, SsdmoeApp
from ssdmoe_tui.ui.screens.tool_approval import ToolApprovalScreen
from ssdmoe_tui.ui.widgets.tool_blocks import ToolCallBlock, ToolResultBlock
from tests.helpers.mcp_servers import stdio_server
from tests.helpers.pilot import SIZE, errors, type_and_send, wait_until
from tests.helpers.scripted_model import ANSWER
from tests.helpers.serve_process import start_server, stop
from tests.helpers.tool_chat import answered, ask_and_answer, replies, settled
from tests.tools.mcp_test_server import FORECAST


def attached(url: str, **settings) -> SsdmoeApp:
    """The app attached to the server at `url`, with the test MCP server configured."""
    servers = check_mcp_servers({"weather": stdio_server()})
    return SsdmoeApp(
        ChatSettings(attach=url, max_tokens=60, mcp_servers=servers, **settings),
        engine_factory=None,
        session_store=AppSessions(SessionStore()),
    )


async def test_the_loop_through_the_servers_tool_calling_api(tool_model, tmp_path, monkeypatch):
    served = start_server(tool_model, tmp_path)
    try:
        monkeypatch.setenv("SSDMOE_LOCK_DIR", str(served.lock_dir))
        app = attached(served.url)
        async with app.run_test(size=SIZE) as pilot:
            await wait_until(pilot, lambda: app.chat.model is not None, 30, "the attach")
            assert app.chat.remote
            await answered(pilot, app, "y")
            (call,) = app.query(ToolCallBlock)
            assert call.call.name == "get_weather" and call.state == "done"
            assert call.call.id.startswith("call_")  # the server's id
            assert [b.text for b in app.query(ToolResultBlock)] == [FORECAST]
            assert replies(app) == ["", ANSWER]
            done = app.chat.last_done
            # the server built the second prompt on its record of the first turn
            assert done.stats.get("kv_hit_rate", 0) > 0.9, done.stats
            roles = [m.role for m in app.chat.history]
            assert roles == ["user", "assistant", "tool", "assistant"]
            assert app.chat.history[1].tool_calls[0]["name"] == "get_weather"
            assert not errors(app)
            conv_id = app.chat.session_id
            await pilot.press("ctrl+q")
        conv = SessionStore().get(conv_id)
        assert [t.role for t in conv.turns] == ["user", "assistant", "tool", "assistant"]
        assert conv.turns[1].tool_calls[0]["name"] == "get_weather"  # as the API sent it

        # --resume, attached again: the calls go back as the server returned them, so its
        # record of the conversation matches and the next turn reuses its KV cache
        again = attached(served.url, resume="")
        async with again.run_test(size=SIZE) as pilot:
            await wait_until(pilot, lambda: again.chat.model is not None, 30, "the attach")
            assert again.chat.session_id == conv_id
            assert [b.call.name for b in again.query(ToolCallBlock)] == ["get_weather"]
            await type_and_send(pilot, "Thanks!")
            await wait_until(
                pilot, lambda: len(replies(again)) == 3 and again.inflight is None, 60, "reply"
            )
            done = again.chat.last_done
            assert done.stats.get("kv_hit_rate", 0) > 0.9, done.stats
            assert not errors(again)
            await pilot.press("ctrl+q")
    finally:
        stop(served.proc)


LINE = "the result of get_weather (56,999 characters) does not fit"


async def _overflowed(app: SsdmoeApp, attach: bool) -> tuple[str, list]:
    """Ask, approve the call whose result overflows, read the one line; then the app
    goes on (the model calls again: denied, it answers). The conversation and history."""
    from tests.helpers.pilot import loaded, record_notifications

    said = record_notifications(app)
    async with app.run_test(size=SIZE) as pilot:
        if attach:
            await wait_until(pilot, lambda: app.chat.model is not None, 30, "attach")
        else:
            await loaded(pilot, app)
        await ask_and_answer(pilot, app, "y")
        await wait_until(pilot, lambda: any(LINE in m for _, m in said), 90, "refusal")
        (shown,) = [m for _, m in said if LINE in m]
        assert "\n" not in shown and "tool loop stops here" in shown, shown
        assert "shorten it" not in shown and "refused (400)" not in shown, shown
        assert not any("refused (400)" in m for _, m in said), said
        await wait_until(pilot, lambda: settled(app), what="the loop to stop")
        assert [m.role for m in app.chat.history] == ["user", "assistant"]
        await type_and_send(pilot, "Thanks!")  # the app goes on: the model calls
        await wait_until(pilot, lambda: isinstance(app.screen, ToolApprovalScreen), 90)
        await pilot.press("n")  # denied: the model answers with that in its context
        await wait_until(pilot, lambda: replies(app)[-1] == ANSWER and settled(app), 90)
        out = app.chat.session_id, list(app.chat.history)
        await pilot.press("ctrl+q")
    return out


async def test_a_result_past_the_context_names_the_tool_attached_and_local(
    tool_model, tmp_path, monkeypatch
):
    """Issue 45: a tool's result too long for the context (the test server's forecast
    3,000 times, ~27,000 tokens against 4,096) was the server's raw refusal under
    --attach ("refused (400): the prompt is ... tokens"), and locally the engine's
    "shorten it", about a message the user never wrote. Both now say, in one line,
    which tool returned how much; the tool loop stops and the app goes on."""
    from ssdmoe_tui.commands.chat import engine_factory

    servers = check_mcp_servers({"weather": stdio_server(env={"WEATHER_REPEAT": "3000"})})
    served = start_server(tool_model, tmp_path)
    try:
        monkeypatch.setenv("SSDMOE_LOCK_DIR", str(served.lock_dir))
        for attach in (served.url, None):
            app = SsdmoeApp(
                ChatSettings(attach=attach, model="" if attach else str(tool_model),
                             max_tokens=60, mcp_servers=servers),
                engine_factory=None if attach else engine_factory,
                session_store=AppSessions(SessionStore()),
            )  # fmt: skip
            conv_id, history = await _overflowed(app, attach is not None)
            # The result that cannot be fed is no part of the conversation the model
            # goes on with (fed again, it would overflow again): what is stored is what
            # the app holds, the denied second call's result included.
            turns = SessionStore().get(conv_id).turns
            roles = ["user", "assistant", "user", "assistant", "tool", "assistant"]
            assert [t.role for t in turns] == roles, attach
            assert [t.text for t in turns] == [m.content for m in history], attach
    finally:
        stop(served.proc)

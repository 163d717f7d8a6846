"""The chat app as a tool-using chat, end to end: a real MCP server (the SDK's own,
over stdio), a real checkpoint whose greedy decoding calls `get_weather` and, given the
result, answers with it (tests/helpers/scripted_model.py), the real engine, the app driven by
Textual's pilot: approve, deny, Esc, quit and --resume with the prefix reused."""

from __future__ import annotations

import sys

import pytest

from ssdmoe_tui.commands.chat import engine_factory
from ssdmoe_tui.mcp_config import check_mcp_servers
from ssdmoe_tui.sessions.app_sessions import AppSessions
from ssdmoe_tui.sessions.store import SessionStore
from ssdmoe_tui.tools.loop import DENIED_TEXT
from ssdmoe_tui.ui.app import ChatSettings, SsdmoeApp
from ssdmoe_tui.ui.screens.tool_approval import ToolApprovalScreen
from ssdmoe_tui.ui.screens.tools import ToolsScreen
from ssdmoe_tui.ui.widgets.tool_blocks import ToolCallBlock, ToolResultBlock
from tests.helpers.mcp_servers import ROOT, gone_within, stdio_server
from tests.helpers.pilot import (
    SIZE,
    errors,
    loaded,
    open_settings,
    record_notifications,
    screen_text,
    type_and_send,
    wait_until,
)
from tests.helpers.scripted_model import ANSWER, write_tool_model
from tests.helpers.tool_chat import (
    answered,
    ask_and_answer,
    make_app,
    replies,
    resumed_with_the_call,
    settled,
)
from tests.tools.mcp_test_server import FORECAST


async def test_approve_run_answer_then_resume_with_the_prefix_reused(tool_model, tmp_path):
    pid_file = tmp_path / "server.pid"
    app = make_app(tool_model, pid_file)
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot, app)
        assert app.chat.tools.servers.pending() == ["weather"]  # not before it is needed
        await answered(pilot, app, "y")
        (call,) = app.query(ToolCallBlock)
        assert call.call.name == "get_weather" and call.state == "done" and call.collapsed
        (result,) = app.query(ToolResultBlock)
        assert result.text == FORECAST and not result.collapsed  # short: shown open
        assert replies(app) == ["", ANSWER]  # the call's reply has no other text
        done = app.chat.last_done
        tok = app.chat.tokenizer
        prompt = tok.decode(list(done.prompt_token_ids))
        assert f"<tool_response>\n{FORECAST}\n</tool_response>" in prompt
        assert '"name": "get_weather"' in prompt  # the tool's schema, in the template's place
        assert not errors(app)
        conv_id = app.chat.session_id
        await wait_until(pilot, lambda: not app.chat.engine.busy, what="the KV checkpoint")
        server_pid = int(pid_file.read_text())
        await pilot.press("ctrl+q")
    assert gone_within(server_pid, 15), "the MCP server outlived the app"
    conv = SessionStore().get(conv_id)
    assert [t.role for t in conv.turns] == ["user", "assistant", "tool", "assistant"]
    assert conv.turns[2].text == FORECAST and conv.turns[2].tool_name == "get_weather"
    assert "<tool_call>" in conv.turns[1].text and conv.turns[3].text == ANSWER
    md = SessionStore().export_markdown(conv_id)
    assert "## Tool result (get_weather)" in md and FORECAST in md and "get_weather" in md
    assert '"role": "tool"' in SessionStore().export_json(conv_id)

    again = make_app(tool_model, resume="")
    async with again.run_test(size=SIZE) as pilot:
        await resumed_with_the_call(pilot, again, conv_id, FORECAST)
        assert replies(again) == ["", ANSWER]
        await type_and_send(pilot, "Thanks!")
        await wait_until(
            pilot, lambda: len(replies(again)) == 3 and settled(again), 90, "the next reply"
        )
        done = again.chat.last_done
        assert done.finish_reason == "stop"
        assert done.stats["kv_hit_rate"] >= 0.97, done.stats  # the checkpoint of the first app
        await wait_until(pilot, lambda: not again.chat.engine.busy, what="the saves")
    conv = SessionStore().get(conv_id)
    assert [t.role for t in conv.turns][-2:] == ["user", "assistant"] and conv.n_turns == 2


async def test_deny_tells_the_model_and_esc_stops_the_loop(tool_model):
    app = make_app(tool_model)
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot, app)
        await answered(pilot, app, "n")
        (call,) = app.query(ToolCallBlock)
        assert call.state == "denied" and call.has_class("denied")
        (result,) = app.query(ToolResultBlock)
        assert result.text == DENIED_TEXT
        prompt = app.chat.tokenizer.decode(list(app.chat.last_done.prompt_token_ids))
        assert DENIED_TEXT in prompt and FORECAST not in prompt
        conv_turns = [m.role for m in app.chat.history]
        assert conv_turns == ["user", "assistant", "tool", "assistant"]

        await pilot.press("ctrl+n")
        await wait_until(pilot, lambda: not app.query(ToolCallBlock), what="the new chat")
        await ask_and_answer(pilot, app, "escape")  # a new conversation asks again
        await wait_until(pilot, lambda: settled(app), 30, "the stop")
        assert len(replies(app)) == 1  # no result was fed back: no second reply
        assert app.query(ToolCallBlock).last().state == "denied"

        await pilot.press("f10")
        await wait_until(pilot, lambda: isinstance(app.screen, ToolsScreen), what="F10")
        await pilot.pause(0.3)
        shown = screen_text(app)
        assert "weather" in shown and "running" in shown and "get_weather(city: string)" in shown
        await pilot.press("escape")


async def test_always_is_remembered_for_the_conversation(tool_model):
    app = make_app(tool_model)
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot, app)
        await answered(pilot, app, "a")
        loop = app.chat.tools
        assert not loop.needs_approval(app.chat.session_id, "get_weather")
        assert loop.needs_approval("another-conversation", "get_weather")
        # F9: max tool rounds is a setting of the conversation (a row only with tools)
        from textual.widgets import Input

        await open_settings(pilot)
        app.screen.query_one("#set-max_tool_rounds", Input).value = "3"
        await pilot.press("ctrl+s")
        await wait_until(pilot, lambda: app.chat.gen.max_tool_rounds == 3, what="the setting")
        assert replies(app)[-1] == ANSWER


@pytest.mark.parametrize("size", [(80, 24), (120, 40)])
async def test_the_first_screen_and_f1_say_where_tools_are(size):
    from ssdmoe_tui.ui.screens.keys import KeysScreen
    from ssdmoe_tui.ui.widgets.welcome import TOOLS, Welcome

    app = SsdmoeApp(ChatSettings(), engine_factory=None)
    async with app.run_test(size=size) as pilot:
        await app.chat_pane.transcript.mount(Welcome())  # what the demo's first frame shows
        app.chat_pane.transcript.show_top()
        await pilot.pause(0.3)
        assert " ".join(TOOLS.split()[:4]) in " ".join(screen_text(app).split())
        await pilot.press("f1")
        await wait_until(pilot, lambda: isinstance(app.screen, KeysScreen), what="F1")
        table = app.screen.table
        rows = [" ".join(str(c) for c in col._cells) for col in table.columns]
        assert "app.tools" in rows[3] and "tool.always" in rows[3] and "tools.start" in rows[3]
        await pilot.press("escape")
        await pilot.press("f10")
        await wait_until(pilot, lambda: isinstance(app.screen, ToolsScreen), what="F10")
        await pilot.pause(0.3)
        assert "No MCP servers configured" in screen_text(app)


async def test_esc_while_a_tool_runs_stops_the_loop(tmp_path_factory):
    slow_model = write_tool_model(
        tmp_path_factory.mktemp("slow") / "qwen3-slow-script",
        call='{"name":"slow","arguments":{"seconds":30}}',
    )
    app = make_app(slow_model)
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot, app)
        await type_and_send(pilot, "Take your time.")
        await wait_until(pilot, lambda: isinstance(app.screen, ToolApprovalScreen), 90, "ask")
        await pilot.press("y")
        block = app.query(ToolCallBlock).last()
        await wait_until(pilot, lambda: block.state == "running", what="the call to run")
        await pilot.press("escape")
        await wait_until(pilot, lambda: settled(app), what="the loop to stop")
        assert block.state == "stopped" and not app.query(ToolResultBlock)
        assert len(replies(app)) == 1  # nothing was fed back
        assert any("Tool loop stopped" in n.message for n in app._notifications)
        assert not app.chat.tools.servers._calls  # the MCP call was cancelled too


async def test_tools_that_overflow_the_context_are_named_in_the_refusal(tool_model):
    """Issue 45: with a server's many tools offered, every message was refused as "the
    prompt is N tokens... shorten it", though the message was a word. The refusal now
    says the tools take the room, naming their servers; nothing is sent or saved."""
    many = {"command": sys.executable, "args": ["-m", "tests.tools.mcp_many_tools"],
            "cwd": str(ROOT), "env": {"TOOLS": "120"}}  # fmt: skip
    servers = check_mcp_servers({"weather": stdio_server(), "many": many})
    app = SsdmoeApp(
        ChatSettings(model=str(tool_model), max_tokens=20, mcp_servers=servers),
        engine_factory=engine_factory,
        session_store=AppSessions(SessionStore()),
    )
    said = record_notifications(app)
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot, app)
        await type_and_send(pilot, "hi")
        refusal = "the 125 MCP tools offered take"
        await wait_until(pilot, lambda: any(refusal in m for _, m in said), what="the refusal")
        (line,) = [m for _, m in said if refusal in m]
        assert line.startswith("the prompt is ") and "the model's context is 4,096" in line
        assert "(server many (120), weather (5))" in line and "enabled_tools" in line, line
        assert not replies(app) and app.chat.history == []  # nothing was sent
        assert app.chat_pane.prompt.text == "hi"  # the message is still there to send
    assert SessionStore().list() == []  # and no empty conversation was left

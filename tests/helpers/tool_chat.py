"""Driving the app's tool loop: ask the scripted model's question, answer its approval,
wait for the reply made with the tool's result (tests/tools)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from ssdmoe_tui.commands.chat import engine_factory
from ssdmoe_tui.mcp_config import check_mcp_servers
from ssdmoe_tui.sessions.app_sessions import AppSessions
from ssdmoe_tui.sessions.store import SessionStore
from ssdmoe_tui.ui.actions import tools as tool_actions
from ssdmoe_tui.ui.app import ChatSettings, SsdmoeApp
from ssdmoe_tui.ui.screens.tool_approval import ToolApprovalScreen
from ssdmoe_tui.ui.widgets.tool_blocks import ToolCallBlock, ToolResultBlock
from ssdmoe_tui.ui.widgets.transcript import AssistantMessage
from tests.helpers.mcp_servers import stdio_server
from tests.helpers.pilot import SIZE, loaded, type_and_send, wait_until

QUESTION = "What is the weather in Paris?"


def make_app(model, pid_file=None, env: dict | None = None, **settings) -> SsdmoeApp:
    """The app on `model` with the test server over stdio (`env`: its environment)."""
    env = {**(env or {}), **({"PID_FILE": str(pid_file)} if pid_file else {})}
    servers = check_mcp_servers({"weather": stdio_server(env=env)})
    return SsdmoeApp(
        ChatSettings(model=str(model), max_tokens=60, mcp_servers=servers, **settings),
        engine_factory=engine_factory,
        session_store=AppSessions(SessionStore()),
    )


def settled(app: SsdmoeApp) -> bool:
    return app.inflight is None and not tool_actions.running(app.chat_pane)


async def ask_and_answer(pilot, app: SsdmoeApp, key: str) -> ToolApprovalScreen:
    await type_and_send(pilot, QUESTION)
    await wait_until(pilot, lambda: isinstance(app.screen, ToolApprovalScreen), 90, "approval")
    screen = app.screen
    assert screen.call.name == "get_weather" and screen.server == "weather"
    assert screen.call.args() == {"city": "Paris"}
    await pilot.press(key)
    return screen


async def answered(pilot, app: SsdmoeApp, key: str) -> None:
    """Ask, answer the approval with `key`, wait for the model's next reply."""
    await ask_and_answer(pilot, app, key)
    await wait_until(pilot, lambda: len(replies(app)) == 2 and settled(app), 90, "answer")


def replies(app: SsdmoeApp) -> list[str]:
    return [m.text for m in app.query(AssistantMessage)]


async def saved(pilot, app: SsdmoeApp) -> str:
    """The open conversation's id, once the engine has written what the turn saves (its
    KV checkpoint): the app may quit then, and a resume finds it all."""
    await wait_until(pilot, lambda: not app.chat.engine.busy, what="the saves")
    assert app.chat.session_id is not None
    return app.chat.session_id


async def restored(pilot, app: SsdmoeApp, conv_id: str) -> None:
    """Wait until `app` has resumed `conv_id`, loaded its model and shown its tool calls
    as blocks again (they are, once the model's tokenizer is here)."""
    await wait_until(pilot, lambda: app.chat.session_id == conv_id, what="the resume")
    await loaded(pilot, app)
    await wait_until(pilot, lambda: app.query(ToolCallBlock), what="the restored call")


@asynccontextmanager
async def resumed(model, conv_id: str, **settings) -> AsyncIterator[tuple[Any, SsdmoeApp]]:
    """The app started again on `model` with `--resume` (the last conversation, which
    must be `conv_id`): (pilot, app) once it is `restored`."""
    app = make_app(model, resume=settings.pop("resume", ""), **settings)
    async with app.run_test(size=SIZE) as pilot:
        await restored(pilot, app, conv_id)
        yield pilot, app


async def resumed_with_the_call(pilot, app: SsdmoeApp, conv_id: str, result: str) -> None:
    """`restored`, with its one get_weather call and `result` shown."""
    await restored(pilot, app, conv_id)
    assert [b.text for b in app.query(ToolResultBlock)] == [result]
    assert [b.call.name for b in app.query(ToolCallBlock)] == ["get_weather"]

"""The tool loop in the app: the UI side of `tools.loop.ToolLoop`. After a reply whose
text holds tool calls, each call is shown as a collapsed block and, unless the user said
"always" for that tool in this conversation, asked about (`ToolApprovalScreen`); the
approved ones run off the UI thread, their results are shown and fed back, and the model
continues. Esc stops it at any point (`stop`)."""

from __future__ import annotations

import asyncio
from typing import Any

from textual.css.query import NoMatches

from ssdmoe_tui.chat.controller import Refused
from ssdmoe_tui.errors import printable, user_message
from ssdmoe_tui.prompting.message import Message
from ssdmoe_tui.tools.calls import ToolCall
from ssdmoe_tui.tools.choice import ToolChoice
from ssdmoe_tui.tools.loop import DENY, OFFERED, ONCE
from ssdmoe_tui.tools.servers import ToolResult
from ssdmoe_tui.ui.screens.tool_approval import STOP, ToolApprovalScreen
from ssdmoe_tui.ui.widgets.tool_blocks import ToolCallBlock, ToolResultBlock

GROUP = "tool-loop"


async def ensure_servers(pane: Any) -> None:
    """Start the configured MCP servers a conversation needs, the first time (their
    failures are one line each; the chat goes on without them)."""
    loop = pane.chat.tools
    if loop is None or not loop.servers.pending():
        return
    pane.notify("Starting MCP servers…", timeout=3)
    show_phase(pane, "starting MCP servers…")
    try:
        failed = await asyncio.to_thread(loop.servers.start)
    finally:
        show_phase(pane, "idle")
    for line in failed:
        pane.notify(line, severity="error", markup=False, timeout=10)


def show_phase(pane: Any, text: str) -> None:
    """The header's phase while the app, not the engine, is what the chat waits on (a
    server starting, the user's approval, a tool running); the engine's next phase
    replaces it, but not its "saving" or "idle" (those of the reply before, which come
    late on a slow machine): the round's end sets "idle" itself."""
    try:
        pane.app.app_phase = "" if text == "idle" else text  # held against the engine's idle
        pane.app.status_bar.phase = text
    except NoMatches:  # the app is closing
        pass


def start_at_launch(app: Any) -> None:
    """Servers the config starts with the app (`start_at_launch = true`)."""
    loop = app.chat.tools
    if loop is None:
        return
    names = [n for n, s in loop.servers.servers.items() if s.config.start_at_launch]
    if not names:
        return

    def start() -> None:
        for line in loop.servers.start(names):
            app.call_from_thread(app.notify, line, severity="error", markup=False, timeout=10)

    app.run_worker(start, thread=True, group="mcp-start", exit_on_error=False)


def watch_stops(app: Any) -> None:
    """A server that stops on its own (it exited, mid-call or later) is one toast saying
    how and where its log is; F10 shows it stopped, the same words beside it."""
    loop = app.chat.tools
    if loop is None:
        return

    def said(line: str) -> None:
        try:
            app.call_from_thread(app.notify, line, severity="error", markup=False, timeout=10)
        except RuntimeError:  # the app is not running (any more)
            pass

    loop.servers.on_stopped = said


def show(app: Any) -> None:
    """F10: the servers, their tools, and the open conversation's choice of them; the
    choice made there is kept with that conversation when the screen closes."""
    from ssdmoe_tui.ui.screens.tools import ToolsScreen

    chat = app.chat
    servers = chat.tools.servers if chat.tools is not None else None
    conversation = chat.session_id
    config = app.settings.config
    refused = config.warnings_about("mcp_servers") if config is not None else ()

    def chosen(choice: ToolChoice | None) -> None:
        if choice is None or choice == chat.tool_choice or chat.session_id != conversation:
            return  # no change, or another conversation is open now
        chat.set_tool_choice(choice)
        on = len(chat.tool_specs())
        app.notify(f"Tools for this conversation: {on} offered to the model.", timeout=4)

    screen = ToolsScreen(
        servers,
        chat.tool_choice if servers is not None else None,
        refused=refused,
        cannot_use=chat.cannot_use_tools,
    )
    app.push_screen(screen, chosen)


def begin_round(pane: Any, calls: tuple[ToolCall, ...]) -> None:
    pane.run_worker(run_round(pane, calls), group=GROUP, exclusive=True, exit_on_error=False)


def running(pane: Any) -> bool:
    return any(w.group == GROUP and w.is_running for w in pane.workers)


def stop(pane: Any) -> bool:
    """Esc: end the tool loop (a call being run is cancelled, its result dropped). True
    if one was running."""
    if not running(pane):
        return False
    pane.workers.cancel_group(pane, GROUP)
    pane.chat.tools.servers.cancel_calls()
    pane.notify("Tool loop stopped.", timeout=3)
    return True


def _server_of(loop: Any, name: str) -> str:
    return next((t.server for t in loop.servers.tools() if t.name == name), "")


async def run_round(pane: Any, calls: tuple[ToolCall, ...]) -> None:
    try:
        await _round(pane, calls)
    except asyncio.CancelledError:
        raise
    except Exception as e:  # noqa: BLE001 - a UI failure: one line, the chat goes on
        pane.notify(f"tool loop failed: {user_message(e)}", severity="error", markup=False)
    finally:
        if pane.chat.inflight is None:  # no reply goes on from here
            show_phase(pane, "idle")


async def _round(pane: Any, calls: tuple[ToolCall, ...]) -> None:
    chat, transcript = pane.chat, pane.transcript
    loop = chat.tools
    if loop is None:
        return
    if why := loop.next_round(chat.gen.max_tool_rounds):
        await transcript.add_notice(why)
        return
    results: list[Message] = []
    for call in calls:
        result = await _answer(pane, loop, call)
        if result is None:  # Esc in the dialog
            await transcript.add_notice("Tool loop stopped: the call was not run.")
            return
        results.append(Message("tool", result.text, name=call.name, tool_call_id=call.id))
        chat.keep_tool_results(results)  # saved before it is shown: a crash loses none
        await transcript.mount(ToolResultBlock(call.name, result.text, result.is_error))
        transcript.scroll_end(animate=False)
    try:
        request = chat.prepare_results(results)
    except Refused as e:
        pane.notify(str(e), severity="warning", markup=False)
        return
    show_phase(pane, "idle")  # until the engine says what the reply is doing
    await pane._start_reply(request)


async def _answer(pane: Any, loop: Any, call: ToolCall) -> ToolResult | None:
    """One call's block and result: not asked about when no running server offers the
    tool ("unknown tool"), else asked (unless "always"), then run or denied; None when
    the user stopped the loop in the dialog."""
    transcript, chat = pane.transcript, pane.chat
    standing = loop.standing(call.name, chat.tool_choice)
    block = ToolCallBlock(call, "waiting for approval" if standing == OFFERED else standing)
    await transcript.mount(block)
    transcript.scroll_end(animate=False)
    if standing != OFFERED:  # nothing to approve: unknown, or off here; the model is told
        result = loop.not_run(call, standing, chat.tool_choice)
        pane.notify(result.note, severity="warning", markup=False)
        return result
    choice = ONCE
    show_phase(pane, f"waiting for approval: {printable(call.name, 40)}")
    if loop.needs_approval(chat.session_id, call.name):
        choice = await pane.app.push_screen_wait(
            ToolApprovalScreen(call, _server_of(loop, call.name))
        )
    if choice == STOP:
        block.set_state("denied")
        return None
    loop.remember(chat.session_id, call.name, choice)
    if choice == DENY:
        block.set_state("denied")
        return loop.denied(call)
    block.set_state("running")
    show_phase(pane, f"running tool {printable(call.name, 40)}")
    ticket = loop.servers.ticket()  # an Esc from here on stops this call, sent or not
    try:
        result = await asyncio.to_thread(loop.run, call, ticket)
    except asyncio.CancelledError:  # Esc: the result, when it comes, is dropped
        block.set_state("stopped")
        raise
    block.set_state("failed" if result.is_error else "done")
    if result.is_error:
        pane.notify(result.note, severity="warning", markup=False)
    return result

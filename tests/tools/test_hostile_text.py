"""Issue 45: text from a tool, a model or a server never drives the terminal.

A tool's result holding a clipboard write (OSC 52), a window title (OSC 0) and a
clear-screen (CSI 2J) reached the real terminal byte for byte, and so did an attached
server's reply. Here the real app (Textual's pilot) runs the real MCP server over stdio
and the scripted checkpoint that calls it (tests/helpers/scripted_model.py), or is
attached to a hostile HTTP server on loopback; what Textual would write to the terminal
(`terminal_output`: the whole screen rendered as `_display` renders it) holds none of
those sequences, the screen shows them as escapes, and what the model is given back and
what is saved stay exact.
"""

from __future__ import annotations

import json

import pytest

from ssdmoe_tui.mcp_config import check_mcp_servers
from ssdmoe_tui.sessions.app_sessions import AppSessions
from ssdmoe_tui.sessions.store import SessionStore
from ssdmoe_tui.terminal_text import is_control, visible
from ssdmoe_tui.ui.app import ChatSettings, SsdmoeApp
from ssdmoe_tui.ui.screens.tool_approval import ToolApprovalScreen
from ssdmoe_tui.ui.widgets.tool_blocks import ToolCallBlock, ToolResultBlock
from ssdmoe_tui.ui.widgets.transcript import AssistantMessage
from tests.helpers.hostile_server import DONE, Hostile, event
from tests.helpers.mcp_servers import stdio_server
from tests.helpers.pilot import SIZE, loaded, screen_text, terminal_output, wait_until
from tests.helpers.scripted_model import ANSWER
from tests.helpers.tool_chat import answered, settled
from tests.tools.mcp_test_server import HOSTILE_FORECAST

SEQUENCES = ("\x1b]52;", "\x1b]0;", "\x1b[2J", "\x1b[31m", "\x07", "\x9b", "\x7f", "\r")
SHOWN = ("\\x1b]52;c;cm0gLXJmIH4K\\x07", "\\x1b]0;pwned\\x07", "\\x1b[2J", "\\x9b2J")


def assert_escaped(app: SsdmoeApp) -> None:
    """Nothing of SEQUENCES in what the terminal would be sent; their escapes on screen."""
    out = terminal_output(app)
    for seq in SEQUENCES:
        assert seq not in out, f"{seq!r} reached the terminal"
    # Textual's own output is CSI sequences (cursor, colour): no OSC, no C1 at all
    assert "\x1b]" not in out and not any(0x80 <= ord(c) <= 0x9F for c in out)
    shown = screen_text(app)
    assert not any(is_control(c) for c in shown)
    for text in SHOWN:
        assert text in shown, f"{text!r} not on screen"


def expand_all(app: SsdmoeApp) -> None:
    for block in [*app.query(ToolCallBlock), *app.query(ToolResultBlock)]:
        block.collapsed = False


@pytest.mark.parametrize("mode", ["result", "error"])
async def test_a_hostile_tool_result_is_shown_escaped_and_kept_exact(tool_model, mode):
    """The result, its block's title, the error toast (mode "error": the tool raises with
    that text) and the Markdown export show the escapes; the model gets the exact text,
    and the conversation file and the JSON export keep it."""
    servers = check_mcp_servers({"weather": stdio_server(env={"HOSTILE": mode})})
    app = SsdmoeApp(
        ChatSettings(model=str(tool_model), max_tokens=60, mcp_servers=servers),
        engine_factory=_engine_factory(),
        session_store=AppSessions(SessionStore()),
    )
    app.NOTIFICATION_TIMEOUT = 600  # the error's toast stays until it is checked
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot, app)
        await answered(pilot, app, "y")
        (result,) = app.query(ToolResultBlock)
        assert HOSTILE_FORECAST in result.text  # as the server sent it (an error: quoted)
        assert result.has_class("error") == (mode == "error")
        prompt = app.chat.tokenizer.decode(list(app.chat.last_done.prompt_token_ids))
        assert HOSTILE_FORECAST in prompt  # the model is given the exact text
        assert [m.text for m in app.query(AssistantMessage)][-1] == ANSWER
        expand_all(app)
        await pilot.pause(0.3)
        if mode == "error":  # the toast holds the tool's first line, escaped
            toasts = [n.message for n in app._notifications]
            assert any("\\x1b]52;c;" in t for t in toasts), toasts
            assert not any(is_control(c) for t in toasts for c in t)
        assert_escaped(app)
        conv_id = app.chat.session_id
        await wait_until(pilot, lambda: settled(app) and not app.chat.engine.busy, what="saves")
        await pilot.press("ctrl+q")
    store = SessionStore()
    tool_turn = store.get(conv_id).turns[2]
    assert tool_turn.role == "tool" and HOSTILE_FORECAST in tool_turn.text
    md = store.export_markdown(conv_id)
    assert not any(is_control(c) for c in md) and visible(HOSTILE_FORECAST) in md
    exported = store.export_json(conv_id)
    assert not any(is_control(c) for c in exported)
    assert HOSTILE_FORECAST in json.loads(exported)["turns"][2]["text"]


def _engine_factory():
    from ssdmoe_tui.commands.chat import engine_factory

    return engine_factory


# ------------------------------------------------------------------ an attached server

EVIL_REASONING = "thinking\x1b]0;pwned\x07 hard"
EVIL_REPLY = "Here:\x1b]52;c;cm0gLXJmIH4K\x07 done\x1b[2J\x9b2J\x1b[31m!"
EVIL_ARGS = json.dumps({"city": "Paris\x1b]52;c;cm0gLXJmIH4K\x07\x1b[2J"})
EVIL_NAME = "get_weather\x1b]0;pwned\x07"


def _sse(delta: dict, finish: str | None = None) -> bytes:
    c = {"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
    return event(json.dumps(c).encode())


def _replies() -> object:
    """The first request gets reasoning, a reply and a tool call, all hostile; the next
    (after the call was denied) a hostile reply."""
    calls = iter(range(100))

    def send(h) -> None:
        first = next(calls) == 0
        h.send_response(200)
        h.send_header("content-type", "text/event-stream")
        h.end_headers()
        call = {"index": 0, "id": "call_1", "function": {"name": EVIL_NAME, "arguments": EVIL_ARGS}}
        parts = (
            [_sse({"reasoning_content": EVIL_REASONING}), _sse({"content": EVIL_REPLY}),
             _sse({"tool_calls": [call]}), _sse({}, "tool_calls")]
            if first else [_sse({"content": EVIL_REPLY}), _sse({}, "stop")]
        )  # fmt: skip
        for p in [*parts, DONE]:
            h.wfile.write(p)
            h.wfile.flush()

    return send


async def test_an_attached_servers_reply_reasoning_and_tool_call_are_shown_escaped():
    hostile = Hostile({"/v1/chat/completions": _replies()})
    try:
        servers = check_mcp_servers({"weather": stdio_server()})
        app = SsdmoeApp(
            ChatSettings(attach=hostile.url, max_tokens=400, mcp_servers=servers),
            engine_factory=None,
            session_store=AppSessions(SessionStore()),
        )
        async with app.run_test(size=SIZE) as pilot:
            await wait_until(pilot, lambda: app.chat.model is not None, what="the attach")
            app.chat_pane.prompt.focus()
            await pilot.press("h", "i", "enter")
            # No server offers a tool of that name: it is answered "unknown tool" without
            # asking (issue 44 M7), its block and the line saying so escaped.
            await wait_until(pilot, lambda: app.query(ToolCallBlock), what="the call")
            block = app.query_one(ToolCallBlock)
            assert block.call.name == EVIL_NAME  # exact: the name the server sent
            assert block.state == "unknown tool" and not isinstance(app.screen, ToolApprovalScreen)
            await wait_until(pilot, lambda: "unknown tool" in screen_text(app), what="drawn")
            out, shown = terminal_output(app), screen_text(app)
            assert "\x1b]" not in out and "\x1b[2J" not in out and "\x07" not in out
            assert "\\x1b]0;pwned\\x07" in shown and "\\x1b]52;c;" in shown
            await wait_until(
                pilot, lambda: len(app.query(AssistantMessage)) == 2 and settled(app), what="reply"
            )
            for message in app.query(AssistantMessage):
                message.thinking_block.collapsed = False
            expand_all(app)
            await pilot.pause(0.3)
            out, shown = terminal_output(app), screen_text(app)
            for seq in SEQUENCES:
                assert seq not in out, f"{seq!r} reached the terminal"
            assert "\x1b]" not in out and not any(0x80 <= ord(c) <= 0x9F for c in out)
            assert "\\x1b]0;pwned\\x07 hard" in shown  # the reasoning
            assert "\\x1b]52;c;cm0gLXJmIH4K\\x07 done\\x1b[2J\\x9b2J" in shown  # the reply
            assert app.chat.history[-1].content == EVIL_REPLY  # kept exact
            await pilot.press("ctrl+q")
    finally:
        hostile.close()


async def test_a_model_folder_named_with_escapes_is_listed_escaped(
    tool_model, tmp_path, monkeypatch
):
    """F4 lists model folders by name (and servers by their lock claims): a name holding
    a title change is shown as escapes."""
    from huggingface_hub import constants

    from tests.helpers.pilot import open_picker

    folder = tmp_path / "model\x1b]0;pwned\x07\x1b[2J"
    folder.mkdir()
    (folder / "config.json").write_text((tool_model / "config.json").read_text())
    index = {"weight_map": {"x.weight": "model-00001-of-00002.safetensors"}}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))  # half-downloaded
    monkeypatch.setenv("SSDMOE_MODEL_DIRS", str(folder))
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "no-hub"))
    app = SsdmoeApp(ChatSettings(), engine_factory=None)
    async with app.run_test(size=SIZE) as pilot:
        screen = await open_picker(pilot, app)
        assert str(folder) in {e.path for e in screen.entries}
        await wait_until(pilot, lambda: "model\\x1b]0;pwned" in screen_text(app), what="drawn")
        out = terminal_output(app)
        assert "\x1b]" not in out and "\x1b[2J" not in out and "\x07" not in out
        assert "model\\x1b]0;pwned\\x07\\x1b[2J" in screen_text(app)


# ------------------------------------------- many calls in one reply, one after a denial

EVIL_CITY = "Oslo\x1b]52;c;cm0gLXJmIH4K\x07\x1b[2J\x9b2J"


def _three_calls(denied: str, approved: str) -> object:
    """The first request: one reply holding three calls (mark `denied`, mark `approved`,
    get_weather with a hostile city); the next: a plain answer."""
    calls = iter(range(100))

    def send(h) -> None:
        first = next(calls) == 0
        h.send_response(200)
        h.send_header("content-type", "text/event-stream")
        h.end_headers()
        args = [{"path": denied}, {"path": approved}, {"city": EVIL_CITY}]
        names = ["mark", "mark", "get_weather"]
        parts = (
            [_sse({"tool_calls": [
                {"index": i, "id": f"call_{i}", "function": {"name": n, "arguments": json.dumps(a)}}
                for i, (n, a) in enumerate(zip(names, args, strict=True))
            ]}), _sse({}, "tool_calls")]
            if first else [_sse({"content": "All done."}), _sse({}, "stop")]
        )  # fmt: skip
        for p in [*parts, DONE]:
            h.wfile.write(p)
            h.wfile.flush()

    return send


async def test_three_calls_in_one_reply_each_asked_the_denied_one_never_run(tmp_path):
    """Issue 45, Do 2: many calls in one reply, a call after a denial. Each call is asked
    about on its own; the denied one never reaches the server (its file is not written),
    the one after it runs once approved, and the third's hostile arguments are shown
    escaped in the approval dialog and its block (done-when: dialogs)."""
    denied, approved = tmp_path / "denied", tmp_path / "approved"
    hostile = Hostile({"/v1/chat/completions": _three_calls(str(denied), str(approved))})
    try:
        servers = check_mcp_servers({"weather": stdio_server()})
        app = SsdmoeApp(
            ChatSettings(attach=hostile.url, max_tokens=400, mcp_servers=servers),
            engine_factory=None,
            session_store=AppSessions(SessionStore()),
        )
        async with app.run_test(size=SIZE) as pilot:
            await wait_until(pilot, lambda: app.chat.model is not None, what="the attach")
            app.chat_pane.prompt.focus()
            await pilot.press("h", "i", "enter")
            asked = []
            for key in ["n", "y", "y"]:
                await wait_until(
                    pilot,
                    lambda: (
                        isinstance(app.screen, ToolApprovalScreen)
                        and app.screen.call.id not in asked
                    ),
                    90,
                    "the next approval",
                )
                asked.append(app.screen.call.id)
                if app.screen.call.name == "get_weather":
                    await pilot.pause(0.3)
                    out, shown = terminal_output(app), screen_text(app)
                    assert "\x1b]" not in out and "\x1b[2J" not in out and "\x07" not in out
                    assert not any(0x80 <= ord(c) <= 0x9F for c in out)
                    # the dialog shows the arguments as JSON: C0 as \u escapes, C1 as \x9b
                    assert "\\u001b]52;c;cm0gLXJmIH4K\\u0007\\u001b[2J\\x9b2J" in shown
                await pilot.press(key)
            assert asked == ["call_0", "call_1", "call_2"]
            await wait_until(
                pilot, lambda: len(app.query(AssistantMessage)) == 2 and settled(app), 90, "reply"
            )
            assert not denied.exists() and approved.read_text() == "ran"
            states = [b.state for b in app.query(ToolCallBlock)]
            assert states == ["denied", "done", "done"]
            results = [b.text for b in app.query(ToolResultBlock)]
            assert results[1:] == ["marked", f"{EVIL_CITY}: no data"]  # exact, shown escaped
            expand_all(app)
            await pilot.pause(0.3)
            out = terminal_output(app)
            assert "\x1b]" not in out and "\x1b[2J" not in out and "\x07" not in out
            await pilot.press("ctrl+q")
    finally:
        hostile.close()


# ------------------------------------------------- `ssdmoe generate` on a terminal

EVIL_SCRIPT = "Look\x1b]0;pwned\x07 see\x1b[2J then\x9bK ok"


def test_generate_escapes_a_models_control_bytes_on_a_terminal_not_in_a_pipe(tmp_path):
    """A model's text holding a title change, a clear screen and a C1 CSI: escaped on a
    terminal (a pty), exact into a pipe."""
    import os
    import subprocess
    import sys

    from tests.helpers.scripted_model import write_tool_model

    model = write_tool_model(tmp_path / "evil", call=EVIL_SCRIPT, answer="Sure")
    cmd = [sys.executable, "-m", "ssdmoe_tui.cli", "generate", "--model", str(model),
           "--prompt", "hi", "--max-tokens", "40"]  # fmt: skip
    master, slave = os.openpty()
    proc = subprocess.Popen(cmd, stdout=slave, stderr=subprocess.DEVNULL)
    os.close(slave)
    out = b""
    while chunk := _read(master):
        out += chunk
    os.close(master)
    assert proc.wait(120) == 0
    text = out.decode()
    assert "\x1b" not in text and "\x07" not in text and "\x9b" not in text
    assert "Look\\x1b]0;pwned\\x07 see\\x1b[2J then\\x9bK ok" in text
    piped = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=True)
    assert EVIL_SCRIPT in piped.stdout  # into a pipe or a file: the exact text


def _read(fd: int) -> bytes:
    import os

    try:
        return os.read(fd, 4096)
    except OSError:  # the pty's other end closed (EIO)
        return b""


def test_the_servers_log_lines_are_escaped(capsys):
    """`ssdmoe serve`'s one log writer: a line quoting what a client sent (a path, an
    error's words) reaches the server's terminal escaped."""
    from ssdmoe_tui.server.serving_engine import _log

    _log("internal error on POST /v1/\x1b]0;pwned\x07x: \x9b2J")
    err = capsys.readouterr().err
    assert err == "ssdmoe serve: internal error on POST /v1/\\x1b]0;pwned\\x07x: \\x9b2J\n"

"""What a new user met with tools (issue 44, item 5: M1, M2, M7, M11, M13, M14), each
through the real app (Textual's pilot) or the real config reader, with the test MCP
server (tests/tools/mcp_test_server.py, the official SDK) where a server is needed."""

from __future__ import annotations

import json
import sys

import pytest

from ssdmoe_tui import paths
from ssdmoe_tui.commands.chat import engine_factory
from ssdmoe_tui.config import config_path, ensure_config_file, load_config
from ssdmoe_tui.engine.run.protocol import PhaseChanged
from ssdmoe_tui.mcp_config import check_mcp_servers
from ssdmoe_tui.sessions.app_sessions import AppSessions
from ssdmoe_tui.sessions.store import SessionStore
from ssdmoe_tui.tools.servers import ToolServers
from ssdmoe_tui.ui.app import ChatSettings, SsdmoeApp
from ssdmoe_tui.ui.screens.dialogs import ConfirmScreen
from ssdmoe_tui.ui.screens.tool_approval import ToolApprovalScreen
from ssdmoe_tui.ui.screens.tools import ToolsScreen
from ssdmoe_tui.ui.widgets.tool_blocks import ToolCallBlock, ToolResultBlock
from tests.helpers.mcp_servers import ROOT, gone_within, stdio_server
from tests.helpers.pilot import (
    SIZE,
    loaded,
    record_notifications,
    screen_text,
    type_and_send,
    wait_until,
)
from tests.helpers.tool_chat import (
    QUESTION,
    answered,
    ask_and_answer,
    make_app,
    replies,
    resumed,
    saved,
    settled,
)


async def test_m1_f10_then_s_without_the_tools_extra_says_how_to_get_it(monkeypatch):
    # Without the `tools` extra, `import mcp` fails: a None in sys.modules is how Python
    # itself marks a module that cannot be imported.
    monkeypatch.setitem(sys.modules, "mcp", None)
    servers = check_mcp_servers({"weather": stdio_server()})
    app = SsdmoeApp(ChatSettings(mcp_servers=servers), engine_factory=None)
    async with app.run_test(size=SIZE) as pilot:
        said = record_notifications(app)
        await pilot.press("f10")
        await wait_until(pilot, lambda: isinstance(app.screen, ToolsScreen), what="F10")
        await pilot.press("s")
        await wait_until(pilot, lambda: said, what="the line about the mcp package")
        assert said == [
            ("error", "MCP servers need the mcp package: pip install 'ssdmoe-tui[tools]'")
        ]
        await pilot.pause(0.3)
        assert app.is_running and isinstance(app.screen, ToolsScreen)
        shown = " ".join(screen_text(app).split())
        assert (
            "failed: needs the mcp package: pip" in shown and "install 'ssdmoe-tui[tools]'" in shown
        )
        await pilot.press("escape")
    assert app.return_code in (0, None)


async def f10_start(pilot, done) -> dict:
    """F10, then `s`; returns the servers' states once `done(states)` holds."""
    app = pilot.app
    await pilot.press("f10")
    await wait_until(pilot, lambda: isinstance(app.screen, ToolsScreen), what="F10")
    await pilot.press("s")
    states = app.chat.tools.servers.servers
    await wait_until(pilot, lambda: done(states), 60, "the servers to start (or fail)")
    return states


TOKEN = "sk-test-0123456789abcdef"  # an env value and a bearer token: never in a warning


def codex_config(path, url: str) -> None:
    """config.toml with tables as a Codex user copies them: one with Codex's HTTP keys
    and a key this app does not know, one with a bad value beside a secret, one good."""
    local = stdio_server()
    path.write_text(
        f"""
[mcp_servers.web]
url = "{url}"
bearer_token_env_var = "SSDMOE_TEST_MCP_TOKEN"
startup_timeout_ms = 20000
tool_timeout_sec = 30
required = true
colour = "blue"

[mcp_servers.broken]
command = "npx"
env = {{ "API_TOKEN" = "{TOKEN}" }}
timeout = "soon"

[mcp_servers.local]
command = {json.dumps(local["command"])}
args = {json.dumps(local["args"])}
cwd = {json.dumps(local["cwd"])}
"""
    )


def test_m2_a_bad_table_drops_its_server_only_and_no_warning_quotes_a_value(
    tmp_path, http_server, monkeypatch
):
    path = tmp_path / "config.toml"
    codex_config(path, http_server)
    loaded = load_config(path)
    servers = loaded.config.mcp_servers
    assert list(servers) == ["web", "local"]  # broken is left out, the others kept
    web = servers["web"]
    assert (web.bearer_token_env_var, web.startup_timeout, web.timeout) == (
        "SSDMOE_TEST_MCP_TOKEN",
        20.0,
        30.0,
    )
    assert loaded.warnings == (
        f"{path}: [mcp_servers] web: unknown key 'colour' ignored",
        f"{path}: [mcp_servers] web: a Codex key this app does not use 'required' ignored",
        f"{path}: [mcp_servers] broken.timeout must be a number of seconds; "
        "server 'broken' not started",
    )
    # the token is read when the server starts and sent as Codex sends it
    monkeypatch.setenv("SSDMOE_TEST_MCP_TOKEN", TOKEN)
    tools = ToolServers(servers)
    try:
        assert tools.start(["web"]) == []
        assert tools.call("whoami", {}).text == f"Bearer {TOKEN}"
    finally:
        tools.close()


def test_m2_an_unset_token_variable_fails_its_server_by_name(tmp_path, http_server, monkeypatch):
    monkeypatch.delenv("SSDMOE_TEST_MCP_TOKEN", raising=False)
    path = tmp_path / "config.toml"
    codex_config(path, http_server)
    tools = ToolServers(load_config(path).config.mcp_servers)
    try:
        assert tools.start(["web"]) == [
            "MCP server web: bearer_token_env_var names $SSDMOE_TEST_MCP_TOKEN, which is not set"
        ]
    finally:
        tools.close()


@pytest.mark.parametrize(
    "table",
    [
        f'[mcp_servers.s]\ncommand = "x"\nenv = {{ "GITHUB_TOKEN" = 5, "K" = "{TOKEN}" }}\n',
        f'[mcp_servers.s]\nurl = "http://h/mcp?api_key={TOKEN}"\nargs = ["{TOKEN}"]\n',
        f'[mcp_servers.s]\nurl = "ftp://h/{TOKEN}"\n',
        f'[mcp_servers.s]\nurl = "http://h/mcp"\nhttp_headers = {{ "X-Key" = 1, "A" = "{TOKEN}" }}\n',
        f'mcp_servers = "{TOKEN}"\n',
        f'[mcp_servers]\ns = "{TOKEN}"\n',
        f'api_key = "{TOKEN}"\n',
    ],
)
def test_m2_issue45_a_config_warning_never_quotes_a_secret(tmp_path, table):
    path = tmp_path / "config.toml"
    path.write_text(table)
    loaded = load_config(path)
    assert len(loaded.warnings) == 1, loaded.warnings
    (line,) = loaded.warnings
    assert str(path) in line and "\n" not in line
    assert TOKEN[:6] not in line and "{" not in line, line


async def test_m2_the_app_says_each_problem_in_one_line_and_f10_lists_the_good_servers(
    tmp_path, http_server, monkeypatch
):
    monkeypatch.setenv("SSDMOE_TEST_MCP_TOKEN", TOKEN)
    path = tmp_path / "config.toml"
    codex_config(path, http_server)
    loaded = load_config(path)
    settings = ChatSettings(
        mcp_servers=loaded.config.mcp_servers, config=loaded, warnings=loaded.warnings
    )
    app = SsdmoeApp(settings, engine_factory=None)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        said = [n.message for n in app._notifications if n.severity == "warning"]
        assert said == list(loaded.warnings)
        await f10_start(pilot, lambda servers: all(s.state == "running" for s in servers.values()))
        await pilot.pause(0.6)  # F10 redraws twice a second
        shown = screen_text(app)
        assert "No MCP servers configured" not in shown
        assert "web" in shown and "local" in shown and "whoami" in shown
        assert TOKEN[:6] not in shown
        await pilot.press("escape")


async def test_m11_the_generated_config_names_f10_for_tools_and_f10_closes_it(ssdmoe_home):
    assert ensure_config_file() is None  # the commented template, as on a first run
    text = config_path().read_text()
    assert "(F10 lists them)" in text and "F7" not in text
    app = SsdmoeApp(ChatSettings(), engine_factory=None)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("f10")
        await wait_until(pilot, lambda: isinstance(app.screen, ToolsScreen), what="F10")
        await pilot.press("f10")
        await wait_until(pilot, lambda: not isinstance(app.screen, ToolsScreen), what="closed")


async def test_m7_a_call_to_a_tool_not_offered_is_answered_without_asking(tool_model):
    """The scripted model calls get_weather; the allow-list leaves only `slow` on: no
    approval dialog, the model is told the tool is unknown and goes on."""
    servers = check_mcp_servers({"weather": stdio_server(enabled_tools=["slow"])})
    app = SsdmoeApp(
        ChatSettings(model=str(tool_model), max_tokens=60, mcp_servers=servers),
        engine_factory=engine_factory,
        session_store=AppSessions(SessionStore()),
    )
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot, app)
        asked = []
        push = app.push_screen_wait

        async def record(screen):
            asked.append(screen)
            return await push(screen)

        app.push_screen_wait = record
        await type_and_send(pilot, QUESTION)
        await wait_until(pilot, lambda: len(replies(app)) == 2 and settled(app), 90, "answer")
        assert asked == []  # nothing to approve
        (call,) = app.query(ToolCallBlock)
        assert call.call.name == "get_weather" and call.state == "unknown tool"
        (result,) = app.query(ToolResultBlock)
        assert result.text == "Error: unknown tool 'get_weather' (available: slow)"
        prompt = app.chat.tokenizer.decode(list(app.chat.last_done.prompt_token_ids))
        assert "unknown tool 'get_weather'" in prompt


@pytest.mark.parametrize("key, state", [("y", "done"), ("n", "denied")])
async def test_m8_resumed_tool_call_blocks_keep_their_state(tool_model, key, state):
    app = make_app(tool_model)
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot, app)
        await answered(pilot, app, key)
        assert app.query_one(ToolCallBlock).state == state
        conv_id = await saved(pilot, app)
    async with resumed(tool_model, conv_id) as (pilot, again):
        (block,) = again.query(ToolCallBlock)
        assert block.call.name == "get_weather" and block.state == state
        assert f"[{state}]" in str(block.title)


async def test_m12_ctrl_q_while_a_tool_runs_asks_first(tool_model, tmp_path):
    pid_file = tmp_path / "server.pid"
    app = make_app(tool_model, pid_file, env={"WEATHER_DELAY": "60"})
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot, app)
        await ask_and_answer(pilot, app, "y")
        block = app.query_one(ToolCallBlock)
        await wait_until(pilot, lambda: block.state == "running", what="the call to run")
        await pilot.press("ctrl+q")
        await wait_until(pilot, lambda: isinstance(app.screen, ConfirmScreen), what="the question")
        assert "A tool call is under way" in screen_text(app)
        await pilot.press("n")  # keep going: the call still runs
        await wait_until(pilot, lambda: not isinstance(app.screen, ConfirmScreen), what="closed")
        assert app.is_running and block.state == "running"
        await pilot.press("ctrl+q")
        await wait_until(pilot, lambda: isinstance(app.screen, ConfirmScreen), what="the question")
        await pilot.press("y")
        await wait_until(pilot, lambda: not app.is_running, 30, "the app to exit")
    assert app.return_code == 0
    assert gone_within(int(pid_file.read_text()), 15), "the MCP server outlived the app"


async def test_m5_m15_the_header_says_what_the_chat_waits_on(tool_model):
    """A server slow to start (M5), the approval, and a tool that takes a while (M15):
    the header's phase says each, never "idle", then "idle" once the answer is in."""
    app = make_app(tool_model, env={"STARTUP_DELAY": "3", "WEATHER_DELAY": "3"})
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot, app)
        seen: list[str] = []

        def saw(phase: str) -> None:
            seen.append(phase)

        app.status_bar.watch(app.status_bar, "phase", saw, init=False)
        await type_and_send(pilot, QUESTION)
        await wait_until(pilot, lambda: isinstance(app.screen, ToolApprovalScreen), 90, "approval")
        assert "starting MCP servers…" in seen
        assert app.status_bar.phase == "waiting for approval: get_weather"
        # the engine's end of the call's reply, late (as SSDMOE_TEST_PACE=fast sends it):
        # the header went back to "idle" with the dialog up
        app.feed(PhaseChanged("saving"))
        app.feed(PhaseChanged("idle"))
        await pilot.pause(0.1)
        assert app.status_bar.phase == "waiting for approval: get_weather"
        await pilot.press("y")
        await wait_until(pilot, lambda: len(replies(app)) == 2 and settled(app), 90, "answer")
        assert "running tool get_weather" in seen
        # from the message to the call's end, the header never read "idle" but between
        # the server's start and the reply (which the engine's phases then describe)
        ran = seen.index("running tool get_weather")
        assert seen[ran + 1] == "idle"
        # after the answer the engine may still be saving its checkpoint ("saving"): idle
        # once that is written (a loaded machine showed "saving" at the answer's end)
        await wait_until(pilot, lambda: app.status_bar.phase == "idle", 30, "idle")


async def test_m13_m14_f10_shows_each_tools_arguments_and_why_a_server_stopped(tmp_path):
    """M13: F10 lists each tool with its arguments and description (as the model is
    told them). M14: a server that exits at once says what it wrote on stderr and where
    its log is (it read only 'Connection closed'), and (issue 45) its exit status."""
    dies = {
        "command": sys.executable,
        "args": ["-c", "import sys; sys.stderr.write('boom: no API key set\\n'); sys.exit(3)"],
    }
    servers = check_mcp_servers({"weather": stdio_server(), "dies": dies})
    app = SsdmoeApp(ChatSettings(mcp_servers=servers), engine_factory=None)
    log = paths.cache_dir() / "mcp-logs" / "mcp-dies.log"
    async with app.run_test(size=(160, 40)) as pilot:
        said = record_notifications(app)
        states = await f10_start(
            pilot, lambda st: st["weather"].state == "running" and st["dies"].state == "failed"
        )
        await pilot.pause(0.6)  # F10 redraws twice a second
        shown = screen_text(app)
        assert "get_weather(city: string)  The weather" in shown
        assert "slow(seconds: number)  Sleep, then" in shown
        assert "failed: exited with status 3" in shown  # the rest folds in its column
        error = states["dies"].error  # issue 45: its exit status, not "Connection closed"
        assert error == f"exited with status 3 (its stderr: boom: no API key set; log: {log})"
        assert said == [("error", f"MCP server dies: {error}")]
        await pilot.press("escape")


def test_m18_the_docs_say_the_tools_extra_has_no_fastmcp():
    """The `tools` extra pins mcp 2.x, which has no FastMCP: docs/app.md says so (and
    what to do about a server written with it), and it is true of the SDK installed."""
    import importlib

    from ssdmoe_tui.config import tomllib  # tomli on Python 3.10

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["optional-dependencies"]["tools"] == ["mcp>=2.0"]
    docs = " ".join((ROOT / "docs" / "app.md").read_text().split())
    assert "`mcp>=2.0`, which removed FastMCP" in docs
    with pytest.raises(ModuleNotFoundError, match="FastMCP was renamed to MCPServer"):
        importlib.import_module("mcp.server.fastmcp")
    importlib.import_module("mcp.server.mcpserver")

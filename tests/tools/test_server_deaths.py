"""Issue 45: an MCP server that dies while the app runs shows as stopped, saying how.

A stdio server killed during a call, or exiting minutes later, left its state "running"
(F10 said so, its tools were still offered) while every call read "Connection closed".
Now its state is "stopped" with how its process ended (its exit status or signal), its
last line on stderr and its log's path; the app says so in one toast; the call in
flight is an error result naming how the server ended; F10's `s` starts it again. The
real test server (tests/tools/mcp_test_server.py, the official SDK) over stdio.
"""

from __future__ import annotations

import os
import signal
import threading
import time

from ssdmoe_tui import paths
from ssdmoe_tui.mcp_config import check_mcp_servers
from ssdmoe_tui.tools.servers import ToolServers
from ssdmoe_tui.ui.app import ChatSettings, SsdmoeApp
from ssdmoe_tui.ui.screens.tools import ToolsScreen
from tests.helpers.mcp_servers import gone_within, stdio_server
from tests.helpers.pilot import record_notifications, screen_text, wait_until


def _wait(what, check, seconds: float = 20.0) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def test_a_server_killed_mid_call_is_stopped_with_its_signal_and_log(tmp_path):
    pid_file = tmp_path / "pid"
    env = {"PID_FILE": str(pid_file), "WEATHER_DELAY": "30"}
    servers = ToolServers(check_mcp_servers({"t": stdio_server(env=env)}), log_dir=tmp_path)
    said: list[str] = []
    servers.on_stopped = said.append
    try:
        assert servers.start() == []
        pid = int(pid_file.read_text())
        killer = threading.Timer(1.0, os.kill, (pid, signal.SIGKILL))
        killer.start()
        t0 = time.monotonic()
        result = servers.call("get_weather", {"city": "Paris"})
        assert time.monotonic() - t0 < 10  # not the 30 s the call would take
        assert result.is_error
        how = "killed by signal 9 (SIGKILL)"
        assert result.note == f"get_weather (t): its server stopped ({how})"
        s = servers.servers["t"]
        log = tmp_path / "mcp-t.log"
        assert s.state == "stopped"
        assert s.error == f"{how} (nothing on its stderr; log: {log})"
        assert said == [f"MCP server t stopped: {s.error}"]
        assert servers.tools() == [] and servers.pending() == []  # not offered, nor restarted
        assert servers.restartable() == ["t"]
        later = servers.call("get_weather", {"city": "Paris"})
        assert later.is_error and "unknown tool 'get_weather'" in later.note
        # started again by hand (F10, s): it runs and answers
        env.pop("WEATHER_DELAY")
        assert servers.start() == [] and s.state == "running" and s.error == ""
        assert servers.call("slow", {"seconds": 0}).text == "done"
    finally:
        servers.close()
    assert gone_within(int(pid_file.read_text()), 10)


async def test_a_server_that_exits_later_is_shown_stopped_in_f10_and_said_once(tmp_path):
    """The app: a toast naming the server, its exit status, its last words on stderr
    and its log; F10 shows it stopped with the same words; its tools are gone."""
    when = tmp_path / "exit-now"
    servers = check_mcp_servers({"weather": stdio_server(env={"EXIT_WHEN": str(when)})})
    app = SsdmoeApp(ChatSettings(mcp_servers=servers), engine_factory=None)
    log = paths.cache_dir() / "mcp-logs" / "mcp-weather.log"
    async with app.run_test(size=(200, 40)) as pilot:
        said = record_notifications(app)
        await pilot.press("f10")
        await wait_until(pilot, lambda: isinstance(app.screen, ToolsScreen), what="F10")
        await pilot.press("s")
        state = app.chat.tools.servers.servers["weather"]
        await wait_until(pilot, lambda: state.state == "running", 60, "the server to start")
        assert app.chat.tools.servers.tools()
        when.write_text("")
        await wait_until(pilot, lambda: state.state == "stopped", 30, "the server to stop")
        error = f"exited with status 7 (its stderr: bye: the database is gone; log: {log})"
        assert state.error == error
        errors = lambda: [m for severity, m in said if severity == "error"]  # noqa: E731
        await wait_until(pilot, errors, 10, "the toast")
        assert errors() == [f"MCP server weather stopped: {error}"]
        await pilot.pause(0.6)  # F10 redraws twice a second
        shown = " ".join(screen_text(app).split())
        assert "stopped: exited with status 7" in shown and "bye: the database is gone" in shown
        assert app.chat.tools.servers.tools() == []
        await pilot.press("escape")

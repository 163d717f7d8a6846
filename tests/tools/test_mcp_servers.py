"""MCP servers from config.toml, on the official SDK: a real server (the SDK's own
`MCPServer`, tests/tools/mcp_test_server.py) over stdio and streamable HTTP; the
config's checks; allow-lists; timeouts and failures as error results; no server left
running after close, an uncaught exception or a kill of the app's process."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from ssdmoe_tui.config import load_config
from ssdmoe_tui.mcp_config import check_mcp_servers
from ssdmoe_tui.tools.servers import SCHEMA_BYTES_MAX, TOOLS_MAX, ToolServers
from ssdmoe_tui.tools.stderr_log import LOG_MAX
from tests.helpers.mcp_servers import ROOT, alive, gone_within, stdio_server
from tests.tools.mcp_test_server import FORECAST


def test_config_reads_codex_shaped_tables(tmp_path):
    path = tmp_path / "config.toml"
    path.write_text(
        textwrap.dedent(
            """
            max_tool_rounds = 3
            [mcp_servers.files]
            command = "npx"
            args = ["-y", "@modelcontextprotocol/server-filesystem", "/tmp"]
            env = { "LOG_LEVEL" = "warn" }
            enabled_tools = ["read_file"]
            tool_timeout_sec = 30

            [mcp_servers.web]
            url = "http://127.0.0.1:8931/mcp"
            enabled = false
            timeout = 5
            """
        )
    )
    loaded = load_config(path)
    assert loaded.warnings == ()
    servers = loaded.config.mcp_servers
    assert loaded.config.max_tool_rounds == 3
    files, web = servers["files"], servers["web"]
    assert (
        files.transport == "stdio" and files.args[0] == "-y" and files.env == {"LOG_LEVEL": "warn"}
    )
    assert files.timeout == 30 and files.allows("read_file") and not files.allows("write_file")
    assert web.transport == "http" and not web.enabled and web.timeout == 5


@pytest.mark.parametrize(
    "table, says",
    [
        ({"x": {}}, "needs either command"),
        ({"x": {"command": "a", "url": "http://h/mcp"}}, "needs either command"),
        ({"x": {"url": "ftp://h"}}, "http:// or https://"),
        ({"x": {"command": "a", "args": "b"}}, "x.args must be a list"),
        ({"x": {"command": "a", "timeout": 0}}, "x.timeout must be in"),
        ({"x": {"command": "a", "comand": "b"}}, "unknown key 'comand'"),
        ({"bad name": {"command": "a"}}, "server name"),
        ({"x": {"command": "a", "env": {"A": 1}}}, "x.env must be"),
    ],
)
def test_a_bad_table_is_one_line_naming_the_file_and_server(tmp_path, table, says):
    import json

    with pytest.raises(ValueError, match=says):
        check_mcp_servers(table)
    if any(isinstance(v, dict) for raw in table.values() for v in raw.values()):
        return  # the file form below writes plain keys only
    path = tmp_path / "config.toml"
    body = "\n".join(
        f"[mcp_servers.{json.dumps(name)}]\n"
        + "\n".join(f"{k} = {json.dumps(v)}" for k, v in raw.items() if not isinstance(v, dict))
        for name, raw in table.items()
    )
    path.write_text(body)
    loaded = load_config(path)
    assert len(loaded.warnings) == 1 and str(path) in loaded.warnings[0]
    assert "\n" not in loaded.warnings[0]
    # an unknown key is ignored (the server kept); any other problem leaves it out
    assert list(loaded.config.mcp_servers) == (["x"] if "unknown key" in says else [])


def test_stdio_server_lists_and_calls_tools_with_the_allow_list():
    servers = ToolServers(check_mcp_servers({"t": stdio_server(disabled_tools=["secret"])}))
    try:
        assert servers.start() == []
        assert servers.servers["t"].state == "running"
        names = sorted(t.name for t in servers.tools())
        assert names == ["fail", "get_weather", "mark", "slow"] and servers.servers["t"].hidden == 1
        spec = next(t for t in servers.tools() if t.name == "get_weather")
        fn = spec.for_template()["function"]
        assert fn["parameters"]["properties"]["city"]["type"] == "string"
        assert servers.call("get_weather", {"city": "Paris"}).text == "Paris: 21 C, sunny"
        failed = servers.call("fail", {})
        assert failed.is_error and failed.note.startswith("fail (t):")
        hidden = servers.call("secret", {})
        assert hidden.is_error and "unknown tool 'secret'" in hidden.text
    finally:
        servers.close()
    assert servers.servers["t"].state == "stopped"


def test_a_call_approved_before_an_esc_is_not_sent(tmp_path):
    """Esc (cancel_calls) can come after the app approved a call and before the worker
    thread running it reaches `call`: the ticket taken at approval stops it there, unsent,
    where the call would otherwise run on with nobody waiting for its result."""
    servers = ToolServers(check_mcp_servers({"t": stdio_server()}))
    mark = tmp_path / "ran"
    try:
        assert servers.start() == []
        ticket = servers.ticket()  # approved
        servers.cancel_calls()  # Esc, before the thread gets to the call
        late = servers.call("mark", {"path": str(mark)}, ticket)
        assert late.is_error and late.note == "mark (t): stopped" and not mark.exists()
        again = servers.call("mark", {"path": str(mark)}, servers.ticket())
        assert again.text == "marked" and mark.read_text() == "ran"
    finally:
        servers.close()


def test_a_stdio_servers_log_is_private(tmp_path):
    """Its stderr can echo tool arguments, which come from the user's prompts: 0600."""
    old = tmp_path / "logs" / "mcp-t.log"
    old.parent.mkdir()
    old.write_text("before\n")
    old.chmod(0o644)
    servers = ToolServers(check_mcp_servers({"t": stdio_server()}), log_dir=tmp_path / "logs")
    try:
        assert servers.start() == []
    finally:
        servers.close()
    assert old.stat().st_mode & 0o777 == 0o600


def test_a_server_flooding_stderr_fills_two_capped_logs_at_most(tmp_path):
    """Issue 45: a server's stderr log had no cap (2.1 GiB in 4 s, appended across runs).
    The log is capped at LOG_MAX; when full it becomes NAME.log.1 (replacing the older
    one) and a new log starts: a full log left by an earlier run is rotated at start,
    and 13 MiB of stderr leave two files of at most 4 MiB, the last words kept."""
    logs = tmp_path / "logs"
    logs.mkdir()
    log, rotated = logs / "mcp-t.log", logs / "mcp-t.log.1"
    with open(log, "wb") as f:
        f.truncate(LOG_MAX + 5)  # sparse: a full log from an earlier run
    table = stdio_server(env={"SHOUT": "1"})
    servers = ToolServers(check_mcp_servers({"t": table}), log_dir=logs)
    try:
        assert servers.start() == []
        assert rotated.stat().st_size == LOG_MAX + 5 and log.stat().st_size < LOG_MAX
        mib = 3 * LOG_MAX // (1 << 20) + 1
        assert servers.call("shout", {"mib": mib}).text == "shouted"
        assert servers.call("get_weather", {"city": "Paris"}).text == FORECAST  # it goes on
        deadline = time.monotonic() + 60
        while b"shout done" not in log.read_bytes() + rotated.read_bytes():
            assert time.monotonic() < deadline, "the flood's end never reached the log"
            time.sleep(0.1)
    finally:
        servers.close()
    assert log.stat().st_size <= LOG_MAX and rotated.stat().st_size <= LOG_MAX
    assert b"\0" not in rotated.read_bytes()  # the old sparse log was rotated out
    assert {p.name for p in logs.iterdir()} == {"mcp-t.log", "mcp-t.log.1"}
    for p in (log, rotated):
        assert p.stat().st_mode & 0o777 == 0o600
    assert log.read_bytes().startswith(b"[ssdmoe: earlier output in mcp-t.log.1")


def test_a_server_listing_hundreds_of_tools_offers_the_model_a_bounded_part():
    """Issue 45: every tool a server listed was offered to the model (10,000 tools made
    every prompt 600,000 tokens). A server offers at most TOOLS_MAX tools whose schemas
    take at most SCHEMA_BYTES_MAX, in its order (a tool that alone would pass it is left
    out, the smaller ones after it still fit), and one line names the server that was cut."""
    table = {"command": sys.executable, "args": ["-m", "tests.tools.mcp_many_tools"],
             "cwd": str(ROOT), "env": {"TOOLS": "300", "HUGE_KIB": "200"}}  # fmt: skip
    servers = ToolServers(check_mcp_servers({"many": table, "t": stdio_server()}))
    try:
        (line,) = servers.start()
        assert line.startswith("MCP server many: 128 of its 301 tools are offered to the model")
        assert "173 left out" in line and "enabled_tools" in line, line
        offered = [t for t in servers.tools() if t.server == "many"]
        assert [t.name for t in offered] == [f"tool_{i:05d}" for i in range(TOOLS_MAX)]
        size = sum(len(json.dumps(t.for_template()).encode()) for t in offered)
        assert size <= SCHEMA_BYTES_MAX
        assert servers.servers["t"].cut == 0 and len(servers.tools()) == TOOLS_MAX + 5
        assert servers.call("tool_00005", {"text": "a"}).text == "tool 5: a"
        assert "unknown tool 'tool_00200'" in servers.call("tool_00200", {"text": "a"}).text
    finally:
        servers.close()


def test_close_leaves_no_file_descriptor_open():
    """The background loop is closed with the servers (its selector and wake-up pipe are
    three descriptors an app that opens and closes tool servers would leak each time)."""
    before = len(os.listdir("/proc/self/fd"))
    for _ in range(3):
        servers = ToolServers(check_mcp_servers({"t": stdio_server()}))
        assert servers.start() == []
        assert servers.call("get_weather", {"city": "Oslo"}).text.startswith("Oslo")
        servers.close()
    assert len(os.listdir("/proc/self/fd")) == before


def test_a_tool_past_its_timeout_is_an_error_result_and_the_server_goes_on():
    servers = ToolServers(check_mcp_servers({"t": stdio_server(timeout=1)}))
    try:
        assert servers.start() == []
        t0 = time.monotonic()
        slow = servers.call("slow", {"seconds": 20})
        assert time.monotonic() - t0 < 6
        assert slow.is_error and "timed out after 1 s" in slow.text and "\n" not in slow.note
        assert servers.call("get_weather", {"city": "Paris"}).text == "Paris: 21 C, sunny"
    finally:
        servers.close()


def test_streamable_http_server(http_server):
    servers = ToolServers(
        check_mcp_servers({"web": {"url": http_server, "enabled_tools": ["get_weather"]}})
    )
    try:
        assert servers.start() == []
        assert [t.name for t in servers.tools()] == ["get_weather"]
        assert servers.call("get_weather", {"city": "Paris"}).text == "Paris: 21 C, sunny"
    finally:
        servers.close()


def test_a_server_that_cannot_start_is_one_line_and_the_others_run(tmp_path):
    servers = ToolServers(
        check_mcp_servers(
            {
                "gone": {"command": str(tmp_path / "no-such-command")},
                "ok": stdio_server(),
                "off": stdio_server(enabled=False),
            }
        )
    )
    try:
        failed = servers.start()
        assert len(failed) == 1 and failed[0].startswith("MCP server gone:")
        assert "\n" not in failed[0]
        states = {n: s.state for n, s in servers.servers.items()}
        assert states == {"gone": "failed", "ok": "running", "off": "disabled"}
    finally:
        servers.close()


_APP = """
import os, sys, time
from ssdmoe_tui.mcp_config import check_mcp_servers
from ssdmoe_tui.tools.servers import SCHEMA_BYTES_MAX, TOOLS_MAX, ToolServers
servers = ToolServers(check_mcp_servers({"t": {
    "command": sys.executable, "args": ["-m", "tests.tools.mcp_test_server", "stdio"],
    "env": {"PID_FILE": sys.argv[1]}}}))
assert servers.start() == []
print("started", flush=True)
if sys.argv[2] == "crash":
    raise RuntimeError("the app crashed")
time.sleep(60)
"""


@pytest.mark.parametrize("how", ["crash", "kill"])
def test_no_server_outlives_the_app(tmp_path, how):
    """An uncaught exception closes the servers (atexit); a process killed outright
    leaves its stdio server end of file on stdin, which ends it."""
    pid_file = tmp_path / "pid"
    app = subprocess.Popen(
        [sys.executable, "-c", _APP, str(pid_file), how],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert app.stdout.readline().strip() == "started", app.stderr.read()
        server_pid = int(pid_file.read_text())
        assert alive(server_pid)
        if how == "kill":
            os.kill(app.pid, signal.SIGKILL)
        app.wait(30)
        assert gone_within(server_pid, 15)
    finally:
        if app.poll() is None:
            app.kill()
            app.wait(5)


# issue 45, Do 2: a value of the wrong type for every key a server's table takes
_WRONG = {
    "command": 5, "args": "run", "env": ["A=1"], "env_vars": "HOME", "cwd": ["/tmp"],
    "url": 8080, "bearer_token_env_var": 1, "http_headers": "x", "env_http_headers": 3,
    "enabled": "yes", "timeout": "60", "tool_timeout_sec": [60], "startup_timeout_sec": True,
    "startup_timeout_ms": "10000", "enabled_tools": "get_weather", "disabled_tools": {"a": 1},
    "start_at_launch": 1,
}  # fmt: skip


def test_every_key_of_the_wrong_type_is_one_line_naming_it_and_no_value():
    from ssdmoe_tui.mcp_config import _KEYS

    assert set(_WRONG) == _KEYS  # every key the reader takes
    for key, value in _WRONG.items():
        base = {"url": "http://127.0.0.1:1/mcp"} if key in (
            "bearer_token_env_var", "http_headers", "env_http_headers"
        ) else {"command": "server"}  # fmt: skip
        table = {"x": {**base, key: value}} if key not in base else {"x": {key: value}}
        with pytest.raises(ValueError) as e:
            check_mcp_servers(table)
        line = str(e.value)
        assert "\n" not in line and f"x.{key}" in line, (key, line)
        assert "Traceback" not in line and len(line) < 300

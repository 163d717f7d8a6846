"""Issue 45, "MCP messages" and Do 2: what a broken or hostile MCP server gets from the
app is one clear line per server, the other servers and tools usable, nothing run that
was not offered.

Found: a malformed handshake or tool schema showed the SDK's page of validation text; a
missing `cwd` read "command not found"; a server writing garbage on stdout "did not
start in 3 s" without a word about it; one unusable tool dropped its whole server; tool
names with newlines, escapes or look-alike letters were offered to the model. The
hostile servers are tests/tools/mcp_raw_server.py (hand-written JSON-RPC: the SDK's own
server never sends such things); the big result comes from the real SDK server.
"""

from __future__ import annotations

import sys
import time

import pytest

from ssdmoe_tui.mcp_config import check_mcp_servers
from ssdmoe_tui.tools.servers import RESULT_CHARS_MAX, ToolServers
from tests.helpers.mcp_servers import ROOT, stdio_server

NAME_RULE = "a tool's name is 1 to 128 letters, digits, _ - . or /"


def raw(mode: str, **extra) -> dict:
    """A `[mcp_servers.NAME]` table starting the hand-written server in `mode`."""
    return {
        "command": sys.executable,
        "args": ["-m", "tests.tools.mcp_raw_server"],
        "cwd": str(ROOT),
        "env": {"MODE": mode},
        **extra,
    }


def test_servers_that_cannot_start_are_one_clear_line_each(tmp_path):
    servers = ToolServers(
        check_mcp_servers(
            {
                "nocwd": raw("ok", cwd=str(tmp_path / "gone")),
                "garbage": raw("garbage", startup_timeout_sec=3),
                "hang": raw("hang", startup_timeout_sec=3),
                "badinit": raw("badinit"),
                "ok": raw("ok"),
            }
        ),
        log_dir=tmp_path,
    )
    try:
        t0 = time.monotonic()
        failed = servers.start()
        assert time.monotonic() - t0 < 15  # each within its startup timeout
        log = tmp_path / "mcp-badinit.log"
        assert failed == [
            f"MCP server nocwd: cwd {tmp_path / 'gone'}: no such folder",
            "MCP server garbage: did not start in 3 s: it wrote 'hello, this is not JSON' on "
            "its stdout, which is not MCP (a server speaks JSON-RPC there; its own messages "
            "go to stderr)",
            "MCP server hang: did not start in 3 s",
            "MCP server badinit: it sent an invalid InitializeResult (capabilities: Input "
            "should be a valid dictionary or instance of ServerCapabilities) (nothing on its "
            f"stderr; log: {log})",
        ]
        assert servers.servers["ok"].state == "running"
        assert [t.name for t in servers.tools()] == ["good"]
        assert servers.call("good", {}).text == "ran good"
    finally:
        servers.close()


def test_an_unusable_tool_is_left_out_by_name_and_its_server_runs(tmp_path):
    """One tool whose schema the SDK cannot read, names with a newline, an escape or a
    Cyrillic look-alike: left out, named in one line each server; the rest offered. A
    call to a name that differs by case or by a look-alike letter runs nothing."""
    servers = ToolServers(check_mcp_servers({"badtool": raw("badtool"), "names": raw("names")}))
    try:
        failed = servers.start()
        assert failed == [
            "MCP server badtool: 1 of its tools left out: 'bad': invalid Tool (inputSchema: "
            "Input should be a valid dictionary)",
            "MCP server names: 3 of its tools left out: 'x\\ny', 't\\x1b]0;pwned\\x07', "
            f"'g\u043e\u043ed': {NAME_RULE}",  # printable: the rule, not the letters, says why
        ]
        assert [s.state for s in servers.servers.values()] == ["running", "running"]
        offered = sorted(t.name for t in servers.servers["names"].tools)
        assert offered == ["..", "Good", "a/b", "good"]
        assert servers.call("Good", {}).text == "ran Good"  # names are case-sensitive
        for name in ["GOOD", "g\u043e\u043ed", "x\ny"]:
            result = servers.call(name, {})
            assert result.is_error and result.note.startswith(f"unknown tool {name!r}")
    finally:
        servers.close()


@pytest.mark.parametrize(
    "repeat",
    [
        110_000,  # 2.1 MB, 3 s
        pytest.param(1_200_000, marks=pytest.mark.slow),  # 22.8 MB, 29 s: `make test-slow`
    ],
)
def test_a_big_result_is_cut_for_the_context_and_the_server_goes_on(repeat):
    env = {"WEATHER_REPEAT": str(repeat)}
    servers = ToolServers(check_mcp_servers({"t": stdio_server(env=env, timeout=120)}))
    try:
        assert servers.start() == []
        result = servers.call("get_weather", {"city": "Paris"})
        assert not result.is_error
        assert result.text.endswith(f"\n[... cut at {RESULT_CHARS_MAX:,} characters]")
        assert len(result.text) < RESULT_CHARS_MAX + 100
        assert servers.call("slow", {"seconds": 0}).text == "done"
    finally:
        servers.close()

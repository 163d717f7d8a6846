"""A real MCP server (tests/tools/mcp_test_server.py, the official SDK) over stdio and
over streamable HTTP on a loopback port."""

from __future__ import annotations

import socket
import subprocess
import sys
import time

import pytest

from tests.helpers.mcp_servers import ROOT, free_port
from tests.helpers.scripted_model import write_tool_model


@pytest.fixture
def http_server():
    """The test server on streamable HTTP: its URL (stopped after the test)."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.tools.mcp_test_server", "http", str(port)],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            break
        except OSError:
            if proc.poll() is not None:
                raise RuntimeError("the test MCP server did not start") from None
            time.sleep(0.2)
    yield f"http://127.0.0.1:{port}/mcp"
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)


@pytest.fixture(scope="module")
def tool_model(tmp_path_factory):
    """The scripted checkpoint whose greedy decoding calls get_weather, then answers."""
    return write_tool_model(tmp_path_factory.mktemp("scripted") / "qwen3-tool-script")

"""The test MCP server (tests/tools/mcp_test_server.py, the official SDK) as the app's
config names it, and watching the processes it starts."""

from __future__ import annotations

import os
import socket
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def stdio_server(**extra) -> dict:
    """A `[mcp_servers.NAME]` table that starts the test server over stdio."""
    return {
        "command": sys.executable,
        "args": ["-m", "tests.tools.mcp_test_server", "stdio"],
        "cwd": str(ROOT),
        **extra,
    }


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie (exited, not reaped by its parent) is not running
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return True


def gone_within(pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not alive(pid):
            return True
        time.sleep(0.1)
    return not alive(pid)

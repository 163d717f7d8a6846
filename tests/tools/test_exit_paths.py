"""No MCP server outlives the real app, in a real terminal (tmux): `ssdmoe` with a
config.toml that starts the test server at launch, then ctrl+q, or SIGTERM."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers.mcp_servers import ROOT, alive, gone_within

pytestmark = pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")


def _tmux(sock: str, *args: str) -> str:
    out = subprocess.run(["tmux", "-L", sock, "-f", "/dev/null", *args], capture_output=True,
                         text=True, timeout=20)  # fmt: skip
    return out.stdout


def _wait(cond, timeout: float, what: str) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return
        time.sleep(0.3)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


@pytest.mark.parametrize("how", ["ctrl+q", "sigterm"])
def test_the_mcp_server_stops_with_the_app(tmp_path, how):
    home = Path(os.environ["SSDMOE_HOME"])
    pid_file = tmp_path / "server.pid"
    (home / "config").mkdir(parents=True, exist_ok=True)
    (home / "config" / "config.toml").write_text(
        "[mcp_servers.weather]\n"
        f'command = "{sys.executable}"\n'
        'args = ["-m", "tests.tools.mcp_test_server", "stdio"]\n'
        f'cwd = "{ROOT}"\n'
        f'env = {{ "PID_FILE" = "{pid_file}" }}\n'
        "start_at_launch = true\n"
    )
    sock = f"ssdmoe-mcp-{os.getpid()}-{how[-1]}"
    bin_ = Path(sys.executable).parent
    env = f"SSDMOE_HOME='{home}' SSDMOE_LOCK_DIR='{tmp_path}/locks'"
    cmd = (
        f"cd '{ROOT}' && {env} TERM=xterm-256color '{bin_}/ssdmoe'; echo SSDMOE-EXITED $?; sleep 60"
    )
    _tmux(sock, "new-session", "-d", "-s", "t", "-x", "120", "-y", "40", cmd)
    try:
        _wait(lambda: pid_file.exists() and pid_file.read_text().strip(), 120, "the MCP server")
        server = int(pid_file.read_text())
        assert alive(server)
        time.sleep(1.0)  # the app is drawn and takes keys
        if how == "ctrl+q":
            _tmux(sock, "send-keys", "-t", "t", "C-q")
        else:
            shell = _tmux(sock, "display", "-p", "-t", "t", "#{pane_pid}").strip()
            app = subprocess.run(["pgrep", "-P", shell], capture_output=True, text=True).stdout
            os.kill(int(app.split()[0]), signal.SIGTERM)

        def exited() -> bool:
            return "SSDMOE-EXITED" in _tmux(sock, "capture-pane", "-p", "-t", "t")

        _wait(exited, 60, "the app to exit")
        assert gone_within(server, 10), "the MCP server outlived the app"
    finally:
        _tmux(sock, "kill-server")

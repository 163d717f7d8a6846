"""The chat app on two ranks, in a real terminal (tmux): `ssdmoe launch -n 2 --backend
ring ... ssdmoe --distributed` draws the app on rank 0 (which takes the terminal from
mlx.launch's pipes), rank 1 follows; a reply streams, the engine panel shows each rank's
share, and ctrl+q ends both ranks with status 0 (the launch's status)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
import uuid

import pytest

from tests.helpers.ports import free_port

pytestmark = pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux")


@pytest.mark.slow  # two ranks launched in tmux: `make test-slow`
def test_app_on_two_ranks_in_tmux(checkpoints, tmp_path):
    path = checkpoints("qwen3_moe")
    tmux = ["tmux", "-L", f"ssdmoe-dist-{uuid.uuid4().hex[:8]}", "-f", "/dev/null"]
    app = [sys.executable, "-m", "ssdmoe_tui.cli", "--distributed", "--model", str(path)]
    app += ["--max-tokens", "8", "--expert-cache", "100K"]
    launch = [sys.executable, "-m", "ssdmoe_tui.cli", "launch", "-n", "2", "--backend", "ring"]
    launch += ["--starting-port", str(free_port()), *app]
    shell = (
        f"sleep 1; SSDMOE_HOME={tmp_path / 'home'} TERM=xterm-256color {subprocess.list2cmdline(launch)};"
        " echo SSDMOE-EXITED $?; sleep 60"
    )

    def pane() -> str:
        r = subprocess.run([*tmux, "capture-pane", "-p", "-t", "s"], capture_output=True, text=True)
        return r.stdout

    def wait_for(needle: str, timeout: float) -> str:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            screen = pane()
            if needle in screen:
                return screen
            time.sleep(0.5)
        pytest.fail(f"no {needle!r} on screen after {timeout:g} s:\n{pane()}")

    subprocess.run(
        [*tmux, "new-session", "-d", "-s", "s", "-x", "120", "-y", "60", shell], check=True
    )
    try:
        subprocess.run([*tmux, "set-option", "-t", "s", "window-size", "manual"], check=True)
        subprocess.run([*tmux, "resize-window", "-t", "s", "-x", "120", "-y", "60"], check=True)
        wait_for("Loaded qwen3_moe", 120)
        subprocess.run([*tmux, "send-keys", "-t", "s", "-l", "hello there"], check=True)
        time.sleep(0.5)
        subprocess.run([*tmux, "send-keys", "-t", "s", "Enter"], check=True)
        wait_for("8 tokens", 90)  # the reply's header (max tokens 8)
        screen = wait_for("ranks (last reply)", 10)
        assert "rank 0  50.0 % of experts" in screen and "rank 1  50.0 % of experts" in screen
        assert "MiB/tok · hit" in screen and "all_sum" in screen, screen
        subprocess.run([*tmux, "send-keys", "-t", "s", "C-q"], check=True)
        screen = wait_for("SSDMOE-EXITED", 30)
        assert "SSDMOE-EXITED 0" in screen, screen
        assert "ssdmoe: error" not in screen, screen
    finally:
        subprocess.run([*tmux, "kill-server"], capture_output=True)

"""The real terminal app in tmux: scripts/tmux_smoke.sh starts `ssdmoe`, chats, quits."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers.tmux import REPLY_DONE, tmux, wait_pane

ROOT = Path(__file__).parents[2]
SCRIPT = ROOT / "scripts" / "tmux_smoke.sh"


def test_tmux_smoke():
    out = subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, timeout=420)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "tmux_smoke: OK" in out.stdout


@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")
def test_sigterm_restores_the_terminal_and_saves_like_ctrl_q(tmp_path):
    """Issue 33 N6: SIGTERM (a closed session, `kill`) left the alternate screen and mouse
    reporting on, 'Terminated' in the prompt box, and the reply in flight unsaved."""
    from ssdmoe_tui.sessions.store import SessionStore

    sock = f"ssdmoe-term-{os.getpid()}"
    bin_ = Path(sys.executable).parent
    env = f"SSDMOE_HOME='{os.environ['SSDMOE_HOME']}' SSDMOE_LOCK_DIR='{tmp_path}/locks'"
    cmd = (f"cd '{ROOT}' && {env} TERM=xterm-256color '{bin_}/ssdmoe' --max-tokens 20; "
           "echo SSDMOE-EXITED $?; sleep 60")  # fmt: skip
    tmux(sock, "new-session", "-d", "-s", "t", "-x", "120", "-y", "40", cmd)
    try:
        tmux(sock, "set-option", "-t", "t", "window-size", "manual")
        tmux(sock, "resize-window", "-t", "t", "-x", "120", "-y", "40")
        wait_pane(sock, "demo-model is ready", 180)
        tmux(sock, "send-keys", "-t", "t", "-l", "hello from tmux")
        time.sleep(0.5)
        tmux(sock, "send-keys", "-t", "t", "Enter")
        wait_pane(sock, REPLY_DONE, 90)
        # A second prompt, long enough that SIGTERM comes during its prefill.
        tmux(sock, "send-keys", "-t", "t", "-l", " ".join(f"disk {i} reads" for i in range(300)))
        time.sleep(0.5)
        tmux(sock, "send-keys", "-t", "t", "Enter")
        wait_pane(sock, "prefill", 60, first_line=True)  # the status bar's phase
        shell = tmux(sock, "display", "-p", "-t", "t", "#{pane_pid}").strip()
        app = subprocess.run(["pgrep", "-P", shell], capture_output=True, text=True).stdout
        os.kill(int(app.split()[0]), signal.SIGTERM)
        pane = wait_pane(sock, "SSDMOE-EXITED", 30)
        assert "SSDMOE-EXITED 143" in pane, pane
        assert "Terminated" not in pane and "Traceback" not in pane, pane
        modes = "#{alternate_on} #{mouse_any_flag} #{mouse_button_flag} #{mouse_sgr_flag}"
        assert tmux(sock, "display", "-p", "-t", "t", modes).split() == ["0"] * 4
        assert tmux(sock, "display", "-p", "-t", "t", "#{cursor_flag}").strip() == "1"
    finally:
        tmux(sock, "kill-server")
    [summary] = SessionStore().list()
    turns = SessionStore().get(summary.id).turns
    assert [t.role for t in turns] == ["user", "assistant", "user"]
    assert turns[0].text == "hello from tmux" and turns[2].text.startswith("disk 0 reads")

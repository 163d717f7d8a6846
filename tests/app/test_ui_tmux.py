"""The real terminal app in tmux: scripts/tmux_smoke.sh starts `ssdmoe`, chats, quits."""

from __future__ import annotations

import subprocess
from pathlib import Path

SCRIPT = Path(__file__).parents[2] / "scripts" / "tmux_smoke.sh"


def test_tmux_smoke():
    out = subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, timeout=420)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "tmux_smoke: OK" in out.stdout

"""Driving the real terminal app in tmux: a private tmux server (`-L sock`), its pane
read as the user sees it."""

from __future__ import annotations

import subprocess
import time


def tmux(sock: str, *args: str) -> str:
    out = subprocess.run(["tmux", "-L", sock, "-f", "/dev/null", *args], capture_output=True,
                         text=True, timeout=20)  # fmt: skip
    return out.stdout


def wait_pane(sock: str, needle: str, timeout: float, first_line: bool = False) -> str:
    """The pane's text once `needle` is on it (on its first line), else AssertionError."""
    end = time.monotonic() + timeout
    pane = ""
    while time.monotonic() < end:
        pane = tmux(sock, "capture-pane", "-p", "-t", "t")
        if needle in (pane.splitlines()[:1] or [""])[0] if first_line else needle in pane:
            return pane
        time.sleep(0.3)
    raise AssertionError(f"no {needle!r} on screen after {timeout} s:\n{pane}")

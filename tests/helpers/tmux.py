"""Driving the real terminal app in tmux: a private tmux server (`-L sock`), its pane
read as the user sees it."""

from __future__ import annotations

import re
import subprocess
import time

#: A finished reply's header ends with the K it used ("… N tokens · X tok/s · K 4"); on a
#: narrow chat column "· K 4" may wrap onto the next line.
REPLY_DONE = re.compile(r"tok/s · K \d|^\s*▌ · K \d", re.M)


def tmux(sock: str, *args: str) -> str:
    out = subprocess.run(["tmux", "-L", sock, "-f", "/dev/null", *args], capture_output=True,
                         text=True, timeout=20)  # fmt: skip
    return out.stdout


def wait_pane(
    sock: str, needle: str | re.Pattern[str], timeout: float, first_line: bool = False
) -> str:
    """The pane's text once `needle` (a string, or a pattern searched for) is on it (on
    its first line), else AssertionError."""
    end = time.monotonic() + timeout
    pane = ""
    while time.monotonic() < end:
        pane = tmux(sock, "capture-pane", "-p", "-t", "t")
        text = (pane.splitlines()[:1] or [""])[0] if first_line else pane
        found = needle.search(text) if isinstance(needle, re.Pattern) else needle in text
        if found:
            return pane
        time.sleep(0.3)
    raise AssertionError(f"no {needle!r} on screen after {timeout} s:\n{pane}")

"""`ssdmoe serve` as a user starts it: a subprocess on a free loopback port with its own
lock and data folders, for the tests that attach the app to a server (`--attach`)."""

from __future__ import annotations

import os
import queue
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
START_TIMEOUT = 90.0  # MLX's import and the demo's load, on a busy 2-core machine


@dataclass
class Served:
    proc: subprocess.Popen
    url: str
    lock_dir: Path

    @property
    def port(self) -> int:
        return int(self.url.rsplit(":", 1)[1])


def start_server(
    model: Path,
    root: Path,
    *,
    api_key: str | None = None,
    per_token_s: float = 0.0,
    args: tuple[str, ...] = ("--no-disk-cache", "--max-tokens", "64"),
    stderr: Path | None = None,
) -> Served:
    """`ssdmoe serve --port 0` with its own lock folder and data folder; waits (bounded)
    for its ready line. `per_token_s` > 0: each token of its replies at least that long
    after the previous one (tests/helpers/paced_serve.py), for a test that acts mid-reply.
    `args`: the other flags (the default keeps no disk cache); `stderr`: a file that
    gets its log (appended), else it goes nowhere."""
    lock_dir = root / "locks"
    env = {**os.environ, "SSDMOE_LOCK_DIR": str(lock_dir), "SSDMOE_HOME": str(root / "home")}
    env.pop("SSDMOE_API_KEY", None)
    if api_key is not None:
        env["SSDMOE_API_KEY"] = api_key
    entry = (
        ["tests.helpers.paced_serve", str(per_token_s)] if per_token_s > 0 else ["ssdmoe_tui.cli"]
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", *entry, "serve", "--model", str(model), "--port", "0", *args],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL if stderr is None else stderr.open("a"),
        text=True,
    )
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(x) for x in proc.stdout], daemon=True).start()
    end = time.monotonic() + START_TIMEOUT
    while time.monotonic() < end:
        try:
            line = lines.get(timeout=0.5)
        except queue.Empty:
            if proc.poll() is not None:
                break
            continue
        if line.startswith("ssdmoe serve: http://"):
            url = line.split()[2].removesuffix("/v1")
            return Served(proc, url, lock_dir)
    proc.kill()
    raise AssertionError("ssdmoe serve did not start")


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.wait(10)

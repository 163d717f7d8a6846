"""The one way tests run the `ssdmoe` command: this interpreter, the package from this
checkout, output captured as text, always under a timeout."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def run_cli(
    args: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    drop_env: tuple[str, ...] = (),
    timeout: float = 120,
    input: str | None = None,
    check: bool = False,
) -> subprocess.CompletedProcess:
    """`ssdmoe ARGS` in a child process. `env` is added to this process's environment
    after the variables starting with any of `drop_env` are taken out (e.g. "HF_", so
    the child cannot reach the real Hub cache)."""
    full = {k: v for k, v in os.environ.items() if not (drop_env and k.startswith(drop_env))}
    full |= dict(env or {})
    return subprocess.run(
        [sys.executable, "-m", "ssdmoe_tui.cli", *args],
        cwd=ROOT,
        env=full,
        capture_output=True,
        text=True,
        timeout=timeout,
        input=input,
        check=check,
    )


def main_json(
    args: Sequence[str], out: Path, capsys: pytest.CaptureFixture[str]
) -> tuple[str, dict]:
    """`ssdmoe ARGS --json OUT` in this process (`ssdmoe_tui.cli.main`), which must exit
    0: what it printed, and the report it wrote to OUT."""
    from ssdmoe_tui.cli import main

    assert main([*args, "--json", str(out)]) == 0
    return capsys.readouterr().out, json.loads(out.read_text())

"""kill -9 at random moments during conversation and KV checkpoint saves: every
conversation stays loadable, no committed turn or checkpoint is lost, and the next
start leaves no temp file (issue 11, fault checks). The trials run in a fork server
(tests/fault_kill_worker.py) so each costs a fork, not an interpreter start."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from ssdmoe_tui import paths
from ssdmoe_tui.sessions.checkpoints import list_checkpoints, load_checkpoint
from ssdmoe_tui.sessions.store import SessionStore
from tests.cli_runner import run_cli
from tests.fault_kill_worker import FP, turn_text, turn_tokens

ROOT = Path(__file__).resolve().parents[2]
TRIALS = 30


def temps(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if ".tmp" in p.name]


def test_kill_9_during_saves_loses_nothing(tmp_path):
    out = tmp_path / "kills.json"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    r = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "fault_kill_worker.py"), str(TRIALS), "5", str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    report = json.loads(out.read_text())
    assert sum(k["writes"] for k in report["kills"]) > TRIALS  # the writers got going
    home = Path(os.environ["SSDMOE_HOME"])
    left = temps(home)

    # The next start removes every temp file the killed writers left.
    r = run_cli(["index", "--help"], env=env, timeout=60)
    assert r.returncode == 0, r.stderr
    assert temps(home) == [], f"left after the next start (before: {len(left)})"

    store = SessionStore()
    problems: list[str] = []
    listed = {s.id for s in store.list(problems.append)}
    assert problems == [] and listed == set(report["committed"])
    for conv_id, done in report["committed"].items():
        conv = store.get(conv_id)  # loadable
        n = len(conv.turns)
        assert n >= done["turns"], f"{conv_id}: {n} turns stored, {done['turns']} committed"
        assert n <= done["turns"] + 1  # at most the write the kill cut before its report
        for i, turn in enumerate(conv.turns):
            assert turn.text == turn_text(conv_id, i) and turn.token_ids == turn_tokens(i)
        # Every checkpoint on disk is whole, and the last committed one (or a newer) serves.
        history = conv.history_tokens()
        skipped: list[str] = []
        if done["kv_tokens"]:
            _, got = load_checkpoint(store.folder(conv_id), history, FP, on_skip=skipped.append)
            assert got >= done["kv_tokens"]
        assert skipped == []
        assert all(c.size > 0 for c in list_checkpoints(store.folder(conv_id)))
    assert paths.sessions_dir() == store.root
    print(
        f"kill -9 trials: {TRIALS} in {report['seconds']} s, "
        f"{sum(k['writes'] for k in report['kills'])} committed writes, "
        f"{len(left)} temp files left by kills, 0 after the next start"
    )

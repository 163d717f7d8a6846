"""kill -9 at random moments during conversation and KV checkpoint saves: every
conversation stays loadable, no committed turn or checkpoint is lost, and the next
start leaves no temp file (issue 11, fault checks). The trials run in a fork server
(tests/helpers/fault_kill_worker.py) so each costs a fork, not an interpreter start."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from ssdmoe_tui import paths
from ssdmoe_tui.sessions.checkpoints import list_checkpoints, load_checkpoint
from ssdmoe_tui.sessions.store import SessionStore, Turn
from tests.helpers.cli_runner import run_cli
from tests.helpers.fault_kill_worker import FP, turn_text, turn_tokens

ROOT = Path(__file__).resolve().parents[2]
WORKER = ROOT / "tests" / "helpers" / "fault_kill_worker.py"
TRIALS = 30


def temps(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if ".tmp" in p.name]


def test_kill_9_during_saves_loses_nothing(tmp_path):
    out = tmp_path / "kills.json"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    r = subprocess.run(
        [sys.executable, str(WORKER), str(TRIALS), "5", str(out)],
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


# A writer stopped at the atomic writer's pause point (its temp file written, not yet
# fsynced or renamed) and killed there: the case the random kills above rarely reach.
PAUSED_WRITER = r"""
import os, signal, sys
from ssdmoe_tui import atomic
from ssdmoe_tui.sessions.store import SessionStore, Turn

what, conv_id = sys.argv[1], sys.argv[2]
store = SessionStore()
conv = store.get(conv_id)

def pause(tmp):
    print(f"PAUSED {tmp}", flush=True)
    os.kill(os.getpid(), signal.SIGSTOP)  # the parent kills us here

atomic._pause_point = pause
if what == "turn":
    store.add_turn(conv, Turn("user", "the turn the kill cuts", [9, 9, 9]))
else:
    import mlx.core as mx
    from mlx_lm.models.cache import KVCache
    from ssdmoe_tui.sessions.checkpoints import save_checkpoint
    cache = KVCache()
    kv = mx.zeros((1, 2, 4, 32))
    cache.update_and_fetch(kv, kv)
    save_checkpoint(store.folder(conv_id), [cache], [1, 2, 3, 4], "fp")
print("NOT KILLED", flush=True)
"""


def _kill_at_the_pause_point(what: str, conv_id: str, env: dict) -> Path:
    import signal

    proc = subprocess.Popen([sys.executable, "-c", PAUSED_WRITER, what, conv_id], cwd=ROOT,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)  # fmt: skip
    try:
        line = proc.stdout.readline()
        assert line.startswith("PAUSED "), (line, proc.stderr.read()[-2000:])
        tmp = Path(line.split(" ", 1)[1].strip())
        assert tmp.exists()  # the temp file is there, under its final folder
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    return tmp


def test_a_kill_inside_the_atomic_writer_leaves_the_old_file_and_a_swept_temp(tmp_path):
    """Deterministic: the writer is stopped at `atomic._pause_point` (temp written, not
    renamed) and SIGKILLed there, for a conversation save and a KV checkpoint save."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    store = SessionStore()
    conv = store.create("m", "fp")
    store.add_turn(conv, Turn("user", "kept", [1, 2]))
    before = (store.folder(conv.id) / "conversation.json").read_bytes()
    left = [_kill_at_the_pause_point(what, conv.id, env) for what in ("turn", "kv")]
    assert all(p.exists() for p in left), left  # the kills left their temp files
    assert (store.folder(conv.id) / "conversation.json").read_bytes() == before
    assert [t.text for t in store.get(conv.id).turns] == ["kept"]
    assert list_checkpoints(store.folder(conv.id)) == []  # no torn checkpoint in place
    r = run_cli(["index", "--help"], env=env, timeout=60)  # the next start sweeps them
    assert r.returncode == 0, r.stderr
    assert [p for p in left if p.exists()] == []
    assert temps(Path(os.environ["SSDMOE_HOME"])) == []

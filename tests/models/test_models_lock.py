"""The machine-wide model lock, exercised by real processes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from ssdmoe_tui.models.lock import ModelLockedError, acquire_model_lock, lock_path, read_holder

ROOT = Path(__file__).resolve().parents[2]

HOLDER = textwrap.dedent(
    """
    import sys
    from ssdmoe_tui.models.lock import acquire_model_lock
    lock = acquire_model_lock(sys.argv[1])
    print("locked", flush=True)
    sys.stdin.read()  # hold until the parent closes our stdin
    lock.release()
    print("released", flush=True)
    """
)


def _holder(model: str) -> subprocess.Popen:
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, model],
        cwd=ROOT,
        env=dict(os.environ),  # SSDMOE_HOME from the autouse fixture: same lock file
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "locked"
    return proc


def test_second_process_is_told_who_holds_the_model() -> None:
    proc = _holder("mlx-community/Qwen3-30B-A3B-4bit")
    try:
        with pytest.raises(ModelLockedError) as e:
            acquire_model_lock("demo")
        msg = str(e.value)
        assert "\n" not in msg
        assert f"pid {proc.pid}" in msg
        assert "mlx-community/Qwen3-30B-A3B-4bit" in msg
        assert "-c" in msg  # the holder's command line (python -c ...)
        assert e.value.holder is not None and e.value.holder.pid == proc.pid
    finally:
        proc.stdin.close()
        assert proc.stdout.readline().strip() == "released"
        proc.wait(timeout=10)
    with acquire_model_lock("demo") as lock:
        assert lock.held
        holder = read_holder(lock_path())
        assert holder is not None and holder.pid == os.getpid() and holder.model == "demo"
    assert not lock.held
    assert read_holder(lock_path()) is None  # released: the label is cleared


def test_lock_is_freed_when_the_holder_is_killed() -> None:
    proc = _holder("big-model")
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=10)
    lock = acquire_model_lock("after-crash")
    try:
        assert read_holder(lock_path()).model == "after-crash"
    finally:
        lock.release()


def test_loser_reports_one_line() -> None:
    """The losing process formats the error as the CLI does: one line, holder named."""
    proc = _holder("mlx-community/NVIDIA-Nemotron-3-Nano-30B-A3B-4bit")
    try:
        code = (
            "import sys\n"
            "from ssdmoe_tui.errors import user_message\n"
            "from ssdmoe_tui.models.lock import acquire_model_lock, ModelLockedError\n"
            "try:\n    acquire_model_lock('x')\n"
            "except ModelLockedError as e:\n"
            "    print('ssdmoe: error: ' + user_message(e), file=sys.stderr); sys.exit(1)\n"
        )
        r = subprocess.run(
            [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=30
        )
        assert r.returncode == 1
        assert len(r.stderr.strip().splitlines()) == 1
        assert f"pid {proc.pid}" in r.stderr and "Nemotron" in r.stderr
    finally:
        proc.stdin.close()
        proc.wait(timeout=10)


def test_same_process_cannot_take_it_twice_and_relabel() -> None:
    lock = acquire_model_lock("a")
    try:
        with pytest.raises(ModelLockedError, match=f"pid {os.getpid()}"):
            acquire_model_lock("b")
        lock.relabel("c")
        assert read_holder(lock_path()).model == "c"
    finally:
        lock.release()
        lock.release()  # idempotent
    acquire_model_lock("b").release()


def test_lock_is_machine_wide_not_per_cache_folder(tmp_path) -> None:
    """Two processes with different SSDMOE_HOME / XDG_CACHE_HOME still share one lock:
    the default lock folder is <tmp>/ssdmoe-locks-<uid> (TMPDIR points it into this
    test's folder, so parallel test runs on the machine do not meet)."""
    machine_tmp = tmp_path / "machine-tmp"
    machine_tmp.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "SSDMOE_LOCK_DIR"}
    env |= {"TMPDIR": str(machine_tmp)}
    one = env | {"SSDMOE_HOME": str(tmp_path / "home-1"), "XDG_CACHE_HOME": str(tmp_path / "c1")}
    two = env | {"SSDMOE_HOME": str(tmp_path / "home-2"), "XDG_CACHE_HOME": str(tmp_path / "c2")}
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, "/models/Qwen3-30B-A3B"],
        cwd=ROOT,
        env=one,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout.readline().strip() == "locked"
        code = (
            "from ssdmoe_tui.models.lock import acquire_model_lock, lock_path\n"
            "print(lock_path())\n"
            "acquire_model_lock('/models/Qwen3-30B-A3B')\n"
        )
        r = subprocess.run(
            [sys.executable, "-c", code],
            cwd=ROOT,
            env=two,
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert r.returncode != 0 and f"pid {proc.pid}" in r.stderr
        path = Path(r.stdout.strip())
        assert path.parent == machine_tmp / f"ssdmoe-locks-{os.getuid()}"
        assert oct(path.parent.stat().st_mode & 0o777) == "0o700"
    finally:
        proc.stdin.close()
        proc.wait(timeout=10)
    assert not path.exists()  # released: the file goes with the lock


def test_label_hides_the_api_key(tmp_path, monkeypatch) -> None:
    """The label (shown to the next process in its error line) held `serve --api-key KEY`."""
    monkeypatch.setattr(sys, "argv", ["/x/ssdmoe", "serve", "--api-key", "s3cret", "--api-key=k2"])
    with acquire_model_lock("m", path=tmp_path / "model.lock") as lock:
        command = read_holder(lock.path).command
    assert "s3cret" not in command and "k2" not in command, command
    assert command == "ssdmoe serve --api-key '***' '--api-key=***'"


def test_no_form_of_the_key_reaches_the_label_or_the_busy_line(tmp_path, monkeypatch) -> None:
    """Issue 23: `--api-k KEY` (an abbreviation argparse used to take) and labels written by
    an older process that did not redact: neither the label read back nor the "another
    ssdmoe is running" line shows the key."""
    monkeypatch.setattr(sys, "argv", ["ssdmoe", "serve", "--api-k", "s3cret", "--api=k2"])
    path = tmp_path / "model.lock"
    with acquire_model_lock("m", path=path) as lock:
        command = read_holder(lock.path).command
        assert "s3cret" not in command and "k2" not in command, command
        with pytest.raises(ModelLockedError) as busy:
            acquire_model_lock("m", path=path)
        assert "s3cret" not in str(busy.value) and "k2" not in str(busy.value)
    old = tmp_path / "old.lock"  # a label an unredacting version wrote
    old.write_text('{"pid": 1, "model": "m", "command": "ssdmoe serve --api-ke s3cret"}')
    assert read_holder(old).command == "ssdmoe serve --api-ke '***'"

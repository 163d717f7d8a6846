"""The memory-aware model lock, exercised by real processes on a fake small machine."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from ssdmoe_tui.errors import SsdmoeError
from ssdmoe_tui.models.lock import (
    ModelLockedError,
    acquire_model_lock,
    live_holders,
    lock_dir,
    read_holder,
    served_models,
)

ROOT = Path(__file__).resolve().parents[2]
MiB = 1 << 20

HOLDER = textwrap.dedent(
    """
    import sys
    from ssdmoe_tui.models.lock import acquire_model_lock
    need = int(sys.argv[2]) if sys.argv[2] != "none" else None
    lock = acquire_model_lock(sys.argv[1], need_bytes=need)
    print("locked", flush=True)
    sys.stdin.read()  # hold until the parent closes our stdin
    lock.release()
    print("released", flush=True)
    """
)

CLAIMANT = textwrap.dedent(
    """
    import sys
    from ssdmoe_tui.errors import user_message
    from ssdmoe_tui.models.lock import acquire_model_lock, ModelLockedError
    try:
        acquire_model_lock(sys.argv[1], need_bytes=int(sys.argv[2])).release()
    except ModelLockedError as e:
        print("ssdmoe: error: " + user_message(e), file=sys.stderr); sys.exit(1)
    print("loaded")
    """
)


def _env(memory: int | None = None) -> dict:
    env = dict(os.environ)  # SSDMOE_LOCK_DIR from the autouse fixture: same folder
    if memory is not None:
        env["SSDMOE_TEST_AVAILABLE_MEMORY"] = str(memory)
    return env


def _holder(model: str, need: int | None, env: dict | None = None) -> subprocess.Popen:
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, model, "none" if need is None else str(need)],
        cwd=ROOT,
        env=env or _env(),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "locked"
    return proc


def _claim(model: str, need: int, memory: int) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", CLAIMANT, model, str(need)],
        cwd=ROOT,
        env=_env(memory),
        capture_output=True,
        text=True,
        timeout=60,
    )


def _end(proc: subprocess.Popen) -> None:
    proc.stdin.close()
    proc.wait(timeout=10)


def test_a_second_model_loads_when_both_fit_and_is_refused_with_the_numbers() -> None:
    """A 1000 MiB machine: a holder declared 600 MiB; 300 MiB fits, 500 MiB does not."""
    memory = 1000 * MiB
    proc = _holder("mlx-community/Qwen3-30B-A3B-4bit", 600 * MiB, _env(memory))
    try:
        fits = _claim("small", 300 * MiB, memory)
        assert fits.returncode == 0 and fits.stdout.strip() == "loaded", fits.stderr
        refused = _claim("big", 500 * MiB, memory)
        assert refused.returncode == 1
        (line,) = refused.stderr.strip().splitlines()
        assert "needs 500.0 MiB" in line and "600.0 MiB held by" in line, line
        assert f"pid {proc.pid} (mlx-community/Qwen3-30B-A3B-4bit)" in line, line
        assert "1000.0 MiB available" in line, line
    finally:
        _end(proc)
    assert _claim("big", 500 * MiB, memory).returncode == 0  # the holder quit: room now


def test_several_holders_add_up() -> None:
    memory = 1000 * MiB
    one = _holder("a", 400 * MiB, _env(memory))
    two = _holder("b", 400 * MiB, _env(memory))
    try:
        r = _claim("c", 300 * MiB, memory)
        assert r.returncode == 1
        assert "800.0 MiB held by" in r.stderr and f"pid {one.pid} (a)" in r.stderr
        assert f"pid {two.pid} (b)" in r.stderr
    finally:
        _end(one)
        _end(two)


def test_a_killed_holder_frees_its_claim() -> None:
    memory = 1000 * MiB
    proc = _holder("big-model", 900 * MiB, _env(memory))
    assert _claim("x", 500 * MiB, memory).returncode == 1
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=10)
    assert len(list(lock_dir().glob("model-*.lock"))) == 1  # its file is still there...
    r = _claim("after-crash", 500 * MiB, memory)
    assert r.returncode == 0, r.stderr  # ...but it claims nothing
    assert list(lock_dir().glob("model-*.lock")) == []  # stale claim removed, ours released


def test_an_undeclared_holder_holds_the_whole_machine() -> None:
    proc = _holder("/models/old-style", None)
    try:
        with pytest.raises(ModelLockedError) as e:
            acquire_model_lock("demo", need_bytes=1)
        msg = str(e.value)
        assert "\n" not in msg and "another ssdmoe is running" in msg
        assert f"pid {proc.pid}" in msg and "/models/old-style" in msg and "-c" in msg
    finally:
        _end(proc)
    with acquire_model_lock("demo") as lock:
        holder = read_holder(lock.path)
        assert holder is not None and holder.pid == os.getpid() and holder.model == "demo"
    assert live_holders() == []


def test_relabel_checks_the_new_figure(tmp_path) -> None:
    folder = tmp_path / "locks"
    other = acquire_model_lock("other", need_bytes=600, folder=folder, available=lambda: 1000)
    mine = acquire_model_lock("a", need_bytes=300, folder=folder, available=lambda: 1000)
    try:
        with pytest.raises(ModelLockedError, match="needs 500 B"):
            mine.relabel("b", 500, available=lambda: 1000)
        assert read_holder(mine.path).model == "a"
        mine.relabel("c", 350, available=lambda: 1000)
        assert read_holder(mine.path).model == "c" and read_holder(mine.path).need_bytes == 350
    finally:
        mine.release()
        mine.release()  # idempotent
        other.release()


def test_files_are_private(tmp_path, monkeypatch) -> None:
    monkeypatch.delenv("SSDMOE_LOCK_DIR")
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)  # re-read TMPDIR
    with acquire_model_lock("m", need_bytes=1) as lock:
        assert lock.path.parent == tmp_path / f"ssdmoe-locks-{os.getuid()}"
        assert oct(lock.path.parent.stat().st_mode & 0o777) == "0o700"
        assert oct(lock.path.stat().st_mode & 0o777) == "0o600"
        for f in lock.path.parent.iterdir():
            assert oct(f.stat().st_mode & 0o777) == "0o600", f
    assert not lock.path.exists()


def test_label_hides_the_api_key(tmp_path, monkeypatch) -> None:
    """The label (shown to the next process in its error line) held `serve --api-key KEY`."""
    monkeypatch.setattr(sys, "argv", ["/x/ssdmoe", "serve", "--api-key", "s3cret", "--api-key=k2"])
    with acquire_model_lock("m", folder=tmp_path) as lock:
        command = read_holder(lock.path).command
        raw = lock.path.read_text()
    assert "s3cret" not in raw and "k2" not in raw, raw
    assert command == "ssdmoe serve --api-key '***' '--api-key=***'"


def test_no_form_of_the_key_reaches_the_label_or_the_busy_line(tmp_path, monkeypatch) -> None:
    """Issue 23: `--api-k KEY` and labels written by an older process that did not redact:
    neither the label read back nor the "another ssdmoe is running" line shows the key."""
    monkeypatch.setattr(sys, "argv", ["ssdmoe", "serve", "--api-k", "s3cret", "--api=k2"])
    with acquire_model_lock("m", folder=tmp_path) as lock:
        command = read_holder(lock.path).command
        assert "s3cret" not in command and "k2" not in command, command
        with pytest.raises(ModelLockedError) as busy:
            acquire_model_lock("m", folder=tmp_path)
        assert "s3cret" not in str(busy.value) and "k2" not in str(busy.value)
    old = tmp_path / "old.lock"  # a label an unredacting version wrote
    old.write_text('{"pid": 1, "model": "m", "command": "ssdmoe serve --api-ke s3cret"}')
    assert read_holder(old).command == "ssdmoe serve --api-ke '***'"


GENERATE = "import sys; from ssdmoe_tui import cli; sys.exit(cli.main(sys.argv[1:]))"


def test_ssdmoe_generate_loads_beside_a_holder_only_when_it_fits(demo_model) -> None:
    """Real `ssdmoe generate` processes on the demo model next to a holder that declared
    600 MiB: the machine's (fake) memory either holds both, and it generates, or is one
    byte short, and it is refused with the one line."""
    from ssdmoe_tui.engine.run.open import memory_need, plan_engine
    from ssdmoe_tui.options import CacheBudget, EngineOptions

    opts = EngineOptions(model=str(demo_model), expert_cache=CacheBudget.parse("4M"))
    need = memory_need(plan_engine(opts))
    held = 600 * MiB
    proc = _holder("/models/held", held)

    def generate(memory: int) -> subprocess.CompletedProcess:
        argv = ["generate", "hi", "--model", str(demo_model), "--expert-cache", "4M"]
        argv += ["--max-tokens", "2", "--raw", "--json"]
        return subprocess.run(
            [sys.executable, "-c", GENERATE, *argv],
            cwd=ROOT,
            env=_env(memory),
            capture_output=True,
            text=True,
            timeout=120,
        )

    try:
        ok = generate(held + need)
        assert ok.returncode == 0, ok.stderr
        assert '"text"' in ok.stdout or "text" in ok.stdout
        refused = generate(held + need - 1)
        assert refused.returncode != 0
        (line,) = refused.stderr.strip().splitlines()
        assert line.startswith("ssdmoe: error: not enough memory for a second model"), line
        assert f"held by pid {proc.pid} (/models/held)" in line, line
    finally:
        _end(proc)


SERVING_HOLDER = textwrap.dedent(
    """
    import sys
    from ssdmoe_tui.models.lock import acquire_model_lock
    lock = acquire_model_lock(sys.argv[1], need_bytes=1)
    lock.advertise(sys.argv[2], key_required=True)
    print("locked", flush=True)
    sys.stdin.read()
    """
)


def test_a_serving_holder_advertises_its_url_and_goes_with_its_process(tmp_path) -> None:
    """Issue 22 item 8: `ssdmoe serve` puts its URL in its claim (and whether it wants a
    key, never the key); `served_models` lists it while it lives, and a relabel keeps it."""
    proc = subprocess.Popen(
        [sys.executable, "-c", SERVING_HOLDER, "/models/served", "http://127.0.0.1:8123"],
        cwd=ROOT,
        env=_env(),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout.readline().strip() == "locked"
        (served,) = served_models()
        assert served.url == "http://127.0.0.1:8123" and served.key_required
        assert served.pid == proc.pid and served.model == "/models/served"
    finally:
        proc.kill()
        proc.wait(10)
    assert served_models() == []  # killed: its claim is stale, and removed
    with acquire_model_lock("plain", need_bytes=1, folder=tmp_path) as lock:
        assert served_models(tmp_path) == []  # a holder that serves nothing is not listed
        with pytest.raises(SsdmoeError, match="not a loopback server URL"):
            lock.advertise("http://127.0.0.1:8123/v1; rm -rf /")
        lock.advertise("http://[::1]:9000")
        lock.relabel("other", 2, available=lambda: 100)
        holder = read_holder(lock.path)
        assert holder.url == "http://[::1]:9000" and not holder.key_required
        assert holder.model == "other"
    # A label with an odd URL (a damaged or foreign file) advertises nothing.
    odd = tmp_path / "odd.lock"
    odd.write_text('{"pid": 1, "model": "m", "url": "file:///etc/passwd"}')
    assert read_holder(odd).url == ""


# A process holding a claim file whose label it wrote itself (a damaged or hostile one).
FORGED_HOLDER = textwrap.dedent(
    """
    import fcntl, os, sys
    os.makedirs(os.environ["SSDMOE_LOCK_DIR"], mode=0o700, exist_ok=True)
    path = os.path.join(os.environ["SSDMOE_LOCK_DIR"], "model-forged.lock")
    fd = os.open(path, os.O_CREAT | os.O_RDWR | os.O_TRUNC, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    os.write(fd, sys.argv[1].encode())
    print("locked", flush=True)
    sys.stdin.read()
    """
)


def _forged(label: str, env: dict | None = None) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", FORGED_HOLDER, label], cwd=ROOT,
                            env=env or _env(), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True)  # fmt: skip
    assert proc.stdout.readline().strip() == "locked"
    return proc


def test_claims_are_validated_a_negative_need_cancels_nothing(tmp_path) -> None:
    """Issue 34 (6): a live claim with a negative `need_bytes` cancelled the others, so a
    model that must be refused loaded; it now counts as undeclared (the whole machine).
    A stray folder named like a claim refused every load; what is not a claim file is
    ignored (and left alone)."""
    memory = 1000 * MiB
    for need in (-(10**12), 10**30, True, 1.5, "1"):
        forged = _forged(json.dumps({"pid": 1, "model": "forged", "need_bytes": need}))
        try:
            (holder,) = [h for _, h in live_holders()]
            assert holder.need_bytes is None, need
            r = _claim("big", 500 * MiB, memory)
            assert r.returncode == 1 and "forged" in r.stderr, (need, r.stderr)
        finally:
            _end(forged)
    stray = lock_dir() / "model-stray.lock"
    stray.mkdir(parents=True)
    try:
        assert live_holders() == []
        r = _claim("small", 300 * MiB, memory)
        assert r.returncode == 0, r.stderr
        assert stray.is_dir()  # not ours to remove
    finally:
        stray.rmdir()


def test_only_loopback_claims_are_listed(tmp_path) -> None:
    """Issue 34 (2): a claim advertising a foreign URL was listed in F4, and the app
    would have sent it $SSDMOE_API_KEY; only this machine's loopback is listed now."""
    for url, listed in (("http://evil.example:8080", False), ("http://10.0.0.5:8080", False),
                        ("http://127.0.0.2:8080", True), ("http://localhost:8080", True),
                        ("http://[::1]:8080", True)):  # fmt: skip
        forged = _forged(json.dumps({"pid": 1, "model": "m", "need_bytes": 1, "url": url,
                                     "key_required": True}))  # fmt: skip
        try:
            assert [h.url for h in served_models()] == ([url] if listed else []), url
        finally:
            _end(forged)
    with acquire_model_lock("plain", need_bytes=1, folder=tmp_path) as lock:
        with pytest.raises(SsdmoeError, match="not a loopback server URL"):
            lock.advertise("http://192.168.1.5:8080")


def test_a_claim_whose_url_python_cannot_split_is_not_listed(tmp_path) -> None:
    """A claim's `url` that urllib refuses outright (an unclosed or non-address IPv6
    bracket) raised ValueError out of the claim reader, so one damaged claim in the
    machine-wide lock folder broke every launch and F4 with a traceback; it advertises
    nothing now, and `--attach` with such a URL is one line."""
    from ssdmoe_tui.errors import BadValueError
    from ssdmoe_tui.options import is_loopback_url, server_url

    for url in ("http://[::1", "http://[zz]:8080"):
        forged = _forged(json.dumps({"pid": 1, "model": "m", "need_bytes": 1, "url": url}))
        try:
            (holder,) = [h for _, h in live_holders()]
            assert holder.model == "m" and holder.url == "", url
            assert [h.url for h in served_models()] == [], url
            assert not is_loopback_url(url)
            with pytest.raises(BadValueError, match="is not a server URL"):
                server_url(url)
        finally:
            _end(forged)


def test_the_api_key_goes_on_its_own_only_to_loopback(monkeypatch) -> None:
    """Issue 34 (2): $SSDMOE_API_KEY is sent without asking only to a server on this
    machine's loopback; a server that wants no key gets none."""
    from ssdmoe_tui.ui.actions.attach import env_key_for

    monkeypatch.setenv("SSDMOE_API_KEY", "k-123")
    for url, required, sent in (("http://127.0.0.1:8080", True, "k-123"),
                                ("http://localhost:8080", None, "k-123"),
                                ("http://[::1]:8080", True, "k-123"),
                                ("http://127.0.0.1:8080", False, None),
                                ("http://evil.example:8080", True, None),
                                ("http://192.168.1.5:8080", None, None)):  # fmt: skip
        assert env_key_for(url, required) == sent, url

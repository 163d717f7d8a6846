"""Expert-parallel streaming: two real ranks (`mlx.launch -n 2 --backend ring`, loopback).

Each launch starts two Python processes that load a small checkpoint, so the launches
are few (four) and short: tokens against one process (every architecture, bare engine
and engine service), `serve --distributed` driven by the openai client (then a rank
killed mid-reply), bytes per rank and the all_sum cost from `bench --distributed`, and a
rank that cannot read its shard. A failing rank ends the run on both ranks with one
line."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.sample_utils import make_sampler

from ssdmoe_tui.bench.bench import fixed_prompt
from ssdmoe_tui.engine.distributed.expert_map import ExpertMap
from ssdmoe_tui.engine.distributed.group import Distributed
from ssdmoe_tui.engine.model.loader import load_streamed
from ssdmoe_tui.engine.run.runner import Runner

BIN = Path(sys.executable).parent
PROMPT = [5, 17, 300, 42, 7, 99, 1000, 3, 64, 128, 256, 511, 12, 13, 14, 15, 16, 700, 33, 2]
N_TOKENS = 12
LAUNCH_TIMEOUT_S = 90


def _free_port(avoid: tuple[int, ...] = ()) -> int:
    """A port p with p and p+1 free (the ring backend takes one per rank), not near `avoid`."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            p = s.getsockname()[1]
        if p >= 65000 or any(abs(p - a) <= 1 for a in avoid):
            continue
        with socket.socket() as s2:
            try:
                s2.bind(("127.0.0.1", p + 1))
            except OSError:
                continue
        return p
    raise RuntimeError("no free port pair")


def _launch_cmd(cmd: list[str], avoid: tuple[int, ...] = ()) -> list[str]:
    return [
        str(BIN / "mlx.launch"), "-n", "2", "--backend", "ring",
        "--starting-port", str(_free_port(avoid)), *cmd,
    ]  # fmt: skip


def _run(cmd: list[str], env: dict | None = None) -> subprocess.CompletedProcess:
    p = subprocess.Popen(
        _launch_cmd(cmd),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
        env={**os.environ, **(env or {})},
        start_new_session=True,
    )
    try:
        out, err = p.communicate(timeout=LAUNCH_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, err = p.communicate()
        pytest.fail(f"launch did not end within {LAUNCH_TIMEOUT_S} s:\n{err[-3000:]}")
    return subprocess.CompletedProcess(p.args, p.returncode, out, err)


def _single_tokens(
    path: Path, prompt: list[int], n: int, budget: str, k: int | None = None
) -> tuple[list[int], int]:
    sm = load_streamed(path, expert_cache=budget)
    try:
        sm.tokenizer.eos_token_ids = set()
        res = Runner(sm, k=k).generate(prompt, max_tokens=n, sampler=make_sampler(0.0))
        return res.tokens, sm.cache.counters.bytes_read
    finally:
        sm.close()


# ---------------------------------------------------------------- in-process


def test_expert_map_is_balanced_and_deterministic():
    m = ExpertMap(ranks=3, num_layers=5, num_experts=16)
    owners = np.array([[m.owner(layer, e) for e in range(16)] for layer in range(5)])
    for layer in range(5):
        counts = np.bincount(owners[layer], minlength=3)
        assert counts.max() - counts.min() <= 1
        for r in range(3):
            assert (m.owned_mask(layer, r) == (owners[layer] == r)).all()
    assert sum(m.owned_count(r) for r in range(3)) == 80
    assert max(m.owned_count(r) for r in range(3)) - min(m.owned_count(r) for r in range(3)) <= 1
    d = m.as_dict()
    assert d["owned_experts"] == [m.owned_count(r) for r in range(3)]
    assert ExpertMap(3, 5, 16) == m  # nothing random


@pytest.mark.parametrize("value", ["abc", "0", "-1", "nan", "inf", "1e300"])
def test_bad_heartbeat_timeout_is_one_line(value, monkeypatch):
    """SSDMOE_DIST_TIMEOUT: a timeout sockets cannot take (inf, 1e300 overflow them) is
    refused with the variable named, not an OverflowError at connect time."""
    from ssdmoe_tui.engine.distributed.failure import DistributedError
    from ssdmoe_tui.engine.distributed.watchdog import ENV_TIMEOUT
    from ssdmoe_tui.engine.distributed.watchdog import timeout_s as _timeout_s

    monkeypatch.setenv(ENV_TIMEOUT, value)
    with pytest.raises(DistributedError, match=ENV_TIMEOUT) as e:
        _timeout_s()
    assert "\n" not in str(e.value) and repr(value) in str(e.value)
    monkeypatch.setenv(ENV_TIMEOUT, "2.5")
    assert _timeout_s() == 2.5


@pytest.mark.parametrize("flag", [["--prefetch"], ["--trace", "t.jsonl"]])
def test_options_that_do_not_combine_are_refused_in_one_line(flag, capsys):
    from ssdmoe_tui import cli

    assert cli.main(["generate", "--distributed", "--prompt", "hi", *flag]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"ssdmoe: error: {flag[0]} does not combine with --distributed"]


@pytest.mark.parametrize("flag", [["--prefetch"], ["--routing-trace", "t.jsonl"]])
def test_serve_refuses_the_same_options(flag):
    """serve --distributed starts its ranks itself: it must refuse what generate refuses
    (in a subprocess with a bound, since a regression would start serving)."""
    code = "import sys; from ssdmoe_tui.cli import main; sys.exit(main(sys.argv[1:]))"
    argv = [sys.executable, "-c", code, "serve", "--distributed", "--port", "0", *flag]
    p = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert p.returncode == 1, p.stderr[-2000:]
    assert p.stderr.strip().splitlines() == [
        f"ssdmoe: error: {flag[0]} does not combine with --distributed"
    ]


@pytest.mark.parametrize("bank_bytes", [None, "20K"])
def test_one_rank_group_is_the_single_process_engine(checkpoints, monkeypatch, bank_bytes):
    """The distributed switch on a group of one (every expert owned; groups of rows when
    the cache is smaller than a prefill's union; slots over several banks) gives one
    process's tokens."""
    from ssdmoe_tui.engine.experts.cache import BANK_BYTES_ENV

    if bank_bytes:
        monkeypatch.setenv(BANK_BYTES_ENV, bank_bytes)
    path = checkpoints("qwen3_moe")
    want, _ = _single_tokens(path, PROMPT, 8, "60K")
    dist = Distributed(mx.distributed.init(strict=False))
    assert dist.size == 1
    sm = load_streamed(path, expert_cache="60K", distributed=dist)
    try:
        assert type(sm.blocks[0].switch_mlp).__name__ == "DistributedSwitch"
        assert sm.cache.num_banks > (2 if bank_bytes else 0)
        sm.tokenizer.eos_token_ids = set()
        got = Runner(sm).generate(PROMPT, max_tokens=8, sampler=make_sampler(0.0))
        assert sm.times.grouped_calls > 0  # the 20-token prefill did not fit in 60K
    finally:
        sm.close()
    assert got.tokens == want


# ---------------------------------------------------------------- two ranks


def test_two_ranks_match_one_process(checkpoints):
    """Greedy tokens of two ranks equal one process's on every architecture (the
    per-layer sum is exact), and an EngineService on two ranks (what `serve
    --distributed` runs) stays in step with rank 0: K set per request, a cancel while
    decoding, a next turn that reuses the KV cache. One launch for both (start-up is
    most of a launch's time)."""
    archs = ("qwen3_5_moe", "nemotron_h", "mixtral")
    paths = [checkpoints(a) for a in archs]
    qwen = checkpoints("qwen3_moe")
    want = {str(p): _single_tokens(p, PROMPT, N_TOKENS, "100K")[0] for p in paths}
    want_k = {k: _single_tokens(qwen, PROMPT, N_TOKENS, "100K", k=k)[0] for k in (2, 4)}
    ids = ",".join(map(str, PROMPT))
    cmd = [sys.executable, "-m", "tests.distributed_worker", ids, str(N_TOKENS), "100K"]
    r = _run([*cmd, str(qwen), *map(str, paths)])
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("{")]
    assert len(lines) == 1, r.stderr[-3000:]  # rank 0 alone reports
    got = json.loads(lines[0])
    assert got["engine"] == want
    svc = got["service"]
    assert svc["a"]["tokens"] == want_k[2]
    assert svc["b"]["tokens"] == want_k[4]
    assert svc["c"]["finish"] == "cancelled" and 0 < len(svc["c"]["tokens"]) < 10_000
    assert svc["d"]["tokens"] == want_k[4]  # still in step after the cancel
    assert len(svc["e"]["tokens"]) == N_TOKENS
    assert svc["e"]["stats"]["reused_prompt_tokens"] > len(PROMPT)  # KV reuse, in step
    d = svc["b"]["stats"]["distributed"]
    assert len(d["per_rank"]) == 2 and d["all_sum_calls_per_token"] == 3


def test_serve_on_rank_0_and_a_killed_rank(checkpoints, tmp_path):
    """`mlx.launch -n 2 ... ssdmoe serve --distributed`: rank 0 serves HTTP (the official
    openai client gets one process's greedy text, JSON and SSE), rank 1 follows. Then rank
    1 is killed (SIGKILL) while a reply streams: rank 0, blocked in a collective, ends the
    launch with one line naming rank 1, well within the heartbeat timeout."""
    import shlex

    import openai

    from tests.server.test_server import HELLO, generate_json

    path = checkpoints("qwen3_moe")
    want = generate_json(path, HELLO[0]["content"], max_tokens=12)
    port = _free_port()
    serve = [sys.executable, "-m", "ssdmoe_tui.cli", "serve", "--distributed", "--model"]
    serve += [str(path), "--port", str(port), "--expert-cache", "100K"]
    pids = shlex.quote(str(tmp_path))
    cmd = ["/bin/sh", "-c", f"echo $$ > {pids}/rank$MLX_RANK.pid; exec {shlex.join(serve)}"]
    p = subprocess.Popen(
        _launch_cmd(cmd, avoid=(port,)),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        env={**os.environ, "SSDMOE_DIST_TIMEOUT": "30"},
        start_new_session=True,
    )
    try:
        client = openai.OpenAI(
            base_url=f"http://127.0.0.1:{port}/v1", api_key="x", max_retries=0, timeout=60
        )
        end = time.monotonic() + 60
        model = None
        while model is None and time.monotonic() < end and p.poll() is None:
            try:
                model = client.models.list().data[0].id
            except openai.APIConnectionError:
                time.sleep(0.2)
        if model is None:
            os.killpg(p.pid, signal.SIGKILL)
            pytest.fail(f"the server on rank 0 did not come up:\n{p.communicate()[1][-3000:]}")
        r = client.chat.completions.create(
            model=model, messages=HELLO, max_tokens=12, temperature=0
        )
        assert r.choices[0].message.content == want["text"]
        d = r.model_extra["ssdmoe"]["distributed"]
        assert [x["rank"] for x in d["per_rank"]] == [0, 1]
        assert all(x["requested_bytes"] > 0 for x in d["per_rank"])
        chunks = client.chat.completions.create(
            model=model, messages=HELLO, max_tokens=12, temperature=0, stream=True
        )
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert text == want["text"]
        long = client.chat.completions.create(
            model=model, messages=HELLO, max_tokens=2000, temperature=0, stream=True
        )
        t_kill = None
        try:
            for c in long:
                if t_kill is None and c.choices and c.choices[0].delta.content:
                    os.kill(int((tmp_path / "rank1.pid").read_text()), signal.SIGKILL)
                    t_kill = time.monotonic()
        except (openai.APIError, httpx.HTTPError):
            pass  # the server went away mid-reply, as it should
        assert t_kill is not None, "no token streamed"
        _, err = p.communicate(timeout=30)
        assert time.monotonic() - t_kill < 15
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.communicate()
    errs = _errors(err.decode(errors="replace"))
    assert len(errs) == 1, err.decode(errors="replace")[-3000:]
    assert "rank 1" in errs[0] and "exited unexpectedly" in errs[0], errs


def test_bench_two_ranks_bytes_per_rank_and_all_sum(checkpoints, tmp_path):
    """`bench --distributed`: same tokens as one process, each rank requests about half
    the bytes one process does at the same total cache, and the all_sum cost is reported."""
    path = checkpoints("qwen3_moe")
    from mlx_lm.utils import load_tokenizer

    prompt = fixed_prompt(load_tokenizer(path), 24)
    want, single_bytes = _single_tokens(path, prompt, 10, "120K")
    out = tmp_path / "bench.json"
    flags = "--k 4 --expert-cache 60K --prompt-tokens 24 --decode-tokens 10 --prefill-step 2048"
    flags += " --baseline skip --no-warmup --disk-mib 1"
    bench = [sys.executable, "-m", "ssdmoe_tui.cli", "bench", "--distributed", *flags.split()]
    r = _run([*bench, "--model", str(path), "--json", str(out)])
    assert out.exists(), r.stderr[-3000:]
    res = json.loads(out.read_text())
    assert res["conditions"]["distributed"]["ranks"] == 2
    cfg = res["configs"][0]
    assert cfg["token_ids"] == want
    d = cfg["distributed"]
    assert d["ranks"] == 2 and len(d["per_rank"]) == 2
    assert d["expert_map"]["owned_fraction"] == [0.5, 0.5]
    assert d["all_sum_ms_per_token"] > 0 and d["all_sum_latency_us"] > 0
    assert d["all_sum_calls_per_token"] == 3  # one per MoE layer
    total = sum(p["requested_bytes"] for p in d["per_rank"])
    for p in d["per_rank"]:
        assert p["all_sum_ms_per_token"] > 0
        assert p["requested_bytes"] > 0
        assert 0.3 < p["requested_bytes"] / single_bytes < 0.7, (p, single_bytes)
    assert 0.7 < total / single_bytes < 1.3


def _truncated_copy(src: Path, dst: Path) -> Path:
    """A copy of the checkpoint whose last shard lost its tail (a broken copy on one host)."""
    shutil.copytree(src, dst)
    shards = sorted(dst.glob("*.safetensors"))
    last = shards[-1]
    size = last.stat().st_size
    with open(last, "r+b") as f:
        f.truncate(size - 4096)
    return dst


def _per_rank_shell(cmd0: list[str], cmd1: str) -> list[str]:
    """Rank 0 runs cmd0; rank 1 runs the shell text cmd1 ($MLX_RANK tells them apart)."""
    import shlex

    return [
        "/bin/sh", "-c",
        f'if [ "$MLX_RANK" = 1 ]; then {cmd1}; else exec {shlex.join(cmd0)}; fi',
    ]  # fmt: skip


def _errors(stderr: str) -> list[str]:
    return [ln for ln in stderr.splitlines() if "ssdmoe: error:" in ln]


def test_rank_that_cannot_read_its_shard_ends_the_run_with_one_line(checkpoints, tmp_path):
    import shlex

    good = checkpoints("qwen3_moe")
    bad = _truncated_copy(good, tmp_path / "broken")
    gen = [sys.executable, "-m", "ssdmoe_tui.cli", "generate", "--distributed", "--raw"]
    gen += ["--prompt", "hello", "--max-tokens", "4", "--expert-cache", "100K"]
    t0 = time.monotonic()
    r = _run(_per_rank_shell([*gen, "--model", str(good)], shlex.join([*gen, "--model", str(bad)])))
    assert time.monotonic() - t0 < 60
    errs = _errors(r.stderr)
    assert len(errs) == 1, r.stderr[-3000:]
    assert "rank 1:" in errs[0] and "truncated" in errs[0], errs

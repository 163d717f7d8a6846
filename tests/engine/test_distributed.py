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
from tests.helpers.ports import free_port

BIN = Path(sys.executable).parent
PROMPT = [5, 17, 300, 42, 7, 99, 1000, 3, 64, 128, 256, 511, 12, 13, 14, 15, 16, 700, 33, 2]
N_TOKENS = 12
LAUNCH_TIMEOUT_S = 90


def _launch_cmd(cmd: list[str], avoid: tuple[int, ...] = ()) -> list[str]:
    """`ssdmoe launch` (mlx.launch, exiting with the ranks' status) of two local ranks."""
    return [
        sys.executable, "-m", "ssdmoe_tui.cli", "launch", "-n", "2", "--backend", "ring",
        "--starting-port", str(free_port(avoid)), *cmd,
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
    cmd = [sys.executable, "-m", "tests.helpers.distributed_worker", ids, str(N_TOKENS), "100K"]
    r = _run([*cmd, str(qwen), *map(str, paths)])
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("{")]
    assert len(lines) == 1, r.stderr[-3000:]  # rank 0 alone reports
    assert r.returncode == 0, r.stderr[-3000:]
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


@pytest.mark.slow  # a two-rank launch (mlx.launch): `make test-slow`
def test_serve_on_rank_0_and_a_killed_rank(checkpoints, tmp_path):
    """`mlx.launch -n 2 ... ssdmoe serve --distributed`: rank 0 serves HTTP (the official
    openai client gets one process's greedy text, JSON and SSE), rank 1 follows. Then rank
    1 is killed (SIGKILL) while a reply streams: rank 0, blocked in a collective, ends the
    launch with one line naming rank 1, well within the heartbeat timeout."""
    import openai

    from tests.helpers.server import generate_json
    from tests.helpers.texts import HELLO

    path = checkpoints("qwen3_moe")
    want = generate_json(path, HELLO[0]["content"], max_tokens=12)
    p, client, model = _start_serve(path, tmp_path, {"SSDMOE_DIST_TIMEOUT": "30"})
    try:
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
    assert p.returncode == 1  # the launch's status: a rank failed (mlx.launch says 0)


def _start_serve(path: Path, tmp_path: Path, env: dict) -> tuple[subprocess.Popen, object, str]:
    """`ssdmoe launch ... serve --distributed` on a free port: (launch, openai client,
    model id), each rank's pid in tmp_path/rank<N>.pid."""
    import shlex

    import openai

    port = free_port()
    serve = [sys.executable, "-m", "ssdmoe_tui.cli", "serve", "--distributed", "--model"]
    serve += [str(path), "--port", str(port), "--expert-cache", "100K"]
    pids = shlex.quote(str(tmp_path))
    cmd = ["/bin/sh", "-c", f"echo $$ > {pids}/rank$MLX_RANK.pid; exec {shlex.join(serve)}"]
    p = subprocess.Popen(
        _launch_cmd(cmd, avoid=(port,)),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        env={**os.environ, **env},
        start_new_session=True,
    )
    client = openai.OpenAI(
        base_url=f"http://127.0.0.1:{port}/v1", api_key="x", max_retries=0, timeout=60
    )
    end = time.monotonic() + 60
    while time.monotonic() < end and p.poll() is None:
        try:
            return p, client, client.models.list().data[0].id
        except openai.APIConnectionError:
            time.sleep(0.2)
    os.killpg(p.pid, signal.SIGKILL)
    pytest.fail(f"the server on rank 0 did not come up:\n{p.communicate()[1][-3000:]}")


@pytest.mark.slow  # a two-rank launch (mlx.launch): `make test-slow`
def test_serve_kv_checkpoints_survive_a_restart_on_every_rank(checkpoints, tmp_path):
    """`serve --distributed` keeps KV checkpoints: after a restart of the launch (SIGINT
    to rank 0: a clean stop, status 0) the conversation's next turn reuses >= 97 % of its
    prompt from the checkpoint on disk, on both ranks alike (they would be out of step
    otherwise), and the second rank on the same machine reads rank 0's copy."""
    from tests.helpers.server import conversation_turns

    path = checkpoints("qwen3_moe")
    env = {"SSDMOE_HOME": str(tmp_path / "home"), "SSDMOE_DIST_TIMEOUT": "30"}
    p, client, model = _start_serve(path, tmp_path, env)
    try:
        messages, usages = conversation_turns(client, model, 2)
        for u in usages[1:]:
            assert u.prompt_tokens_details.cached_tokens >= 0.97 * u.prompt_tokens, u
        os.kill(int((tmp_path / "rank0.pid").read_text()), signal.SIGINT)
        _, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.communicate()
    assert p.returncode == 0 and not _errors(err.decode(errors="replace")), err[-3000:]
    saved = list((tmp_path / "home").rglob("*.safetensors"))
    assert saved and all("chains" in f.parts for f in saved), saved
    n_saved = len(saved)
    p, client, model = _start_serve(path, tmp_path, env)
    try:
        start = [dict(m) for m in messages]
        _, usages = conversation_turns(client, model, 1, start=start)
        u = usages[0]
        assert u.prompt_tokens_details.cached_tokens >= 0.97 * u.prompt_tokens, u
    finally:
        os.kill(int((tmp_path / "rank0.pid").read_text()), signal.SIGINT)
        try:
            p.communicate(timeout=60)
        finally:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.communicate()
    assert n_saved <= len(list((tmp_path / "home").rglob("*.safetensors")))


@pytest.mark.slow  # a two-rank launch (mlx.launch): `make test-slow`
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
    assert r.returncode == 0, r.stderr[-3000:]
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


@pytest.mark.slow  # a two-rank launch (mlx.launch): `make test-slow`
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
    assert r.returncode == 1, r.stderr[-3000:]


def test_launch_status_is_the_ranks_status(tmp_path):
    """`ssdmoe launch`'s status from the ranks' records: the first rank that failed by
    itself wins over one the launcher stopped (SIGTERM); rank 0 speaks for a rank whose
    own record is elsewhere (another machine); a rank no one accounts for is a failure."""
    from ssdmoe_tui.engine.distributed.exit_status import STOPPED, launch_status

    def put(rank: int, status: int, peers: dict | None = None) -> None:
        data = {"rank": rank, "status": status, "peers": peers or {}}
        (tmp_path / f"rank-{rank}.json").write_text(json.dumps(data))

    put(0, 0, {"1": 0})
    assert launch_status(tmp_path, 2).status == 0
    assert launch_status(tmp_path, 3).missing() == [2]
    assert launch_status(tmp_path, 3).status == 1
    put(1, 3)
    put(0, STOPPED, {"1": 1})
    assert launch_status(tmp_path, 2).status == 3  # rank 1's own record wins
    (tmp_path / "rank-1.json").unlink()
    assert launch_status(tmp_path, 2).status == 1  # rank 0's view of rank 1


def test_launch_passes_mlx_launch_refusals_and_counts_ranks(tmp_path):
    """A bad mlx.launch option is mlx.launch's own status; the rank count comes from
    mlx.launch's flags (hosts x -n, or the hostfile)."""
    from ssdmoe_tui.commands.launch import expected_ranks

    p = subprocess.run(
        [sys.executable, "-m", "ssdmoe_tui.cli", "launch", "--backend", "nope", "true"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert p.returncode == 2 and "backend" in p.stderr
    hosts = tmp_path / "hosts.json"
    hosts.write_text(json.dumps({"backend": "ring", "hosts": [{"ssh": "a"}, {"ssh": "b"}]}))
    assert expected_ranks(["--hostfile", str(hosts), "ssdmoe"]) == 2
    assert expected_ranks(["-n", "3", "ssdmoe", "generate"]) == 3
    assert expected_ranks(["--hosts", "a,b", "-n", "2", "x"]) == 4


def _prefill_union_and_decode(path: Path) -> tuple[dict, list]:
    from ssdmoe_tui.engine.policy.traces import DECODE, read_trace

    union: dict[int, set] = {}
    decode = []
    for step in read_trace(path).steps:
        if step.phase == DECODE:
            decode.append(step.layers)
        else:
            for layer, ids in step.layers:
                union.setdefault(layer, set()).update(ids)
    return union, decode


@pytest.mark.slow  # a two-rank launch (mlx.launch): `make test-slow`
def test_trace_prefetch_and_routing_trace_on_two_ranks(checkpoints, tmp_path, capsys, monkeypatch):
    """`--trace` and `--prefetch` with `--distributed`: rank 0 records the routing every
    rank sees (the same trace as one process), each rank prefetches its own experts, and
    the tokens are one process's. Then `--routing-trace` of that trace on both ranks: one
    process's trace-routed tokens, the lookups split between the ranks."""
    from ssdmoe_tui import cli
    from ssdmoe_tui.engine.experts.prefetch import COLD_ENV

    monkeypatch.setenv(COLD_ENV, "0")  # decode guesses take slots not asked for this token
    path = checkpoints("qwen3_moe")
    gen = ["generate", "--raw", "--prompt", "hello there you", "--max-tokens", "6"]
    gen += ["--expert-cache", "216K", "--model", str(path), "--json", "--prefetch"]

    def single(*extra: str) -> dict:
        assert cli.main([*gen, *extra]) == 0
        return json.loads(capsys.readouterr().out)

    def two_ranks(*extra: str) -> dict:
        r = _run([sys.executable, "-m", "ssdmoe_tui.cli", *gen, "--distributed", *extra])
        assert r.returncode == 0, r.stderr[-3000:]
        return json.loads(r.stdout.strip().splitlines()[-1])

    one_trace, two_trace = tmp_path / "one.jsonl", tmp_path / "two.jsonl"
    want = single("--trace", str(one_trace))
    got = two_ranks("--trace", str(two_trace))
    assert got["token_ids"] == want["token_ids"]
    assert _prefill_union_and_decode(two_trace) == _prefill_union_and_decode(one_trace)
    per_rank = got["stats"]["distributed"]["per_rank"]
    assert all(r["prefetch_issued"] > 0 for r in per_rank), per_rank

    want = single("--routing-trace", str(one_trace))
    got = two_ranks("--routing-trace", str(one_trace))
    assert got["stats"]["routing"] == want["stats"]["routing"] == "trace:one.jsonl"
    assert got["token_ids"] == want["token_ids"]
    per_rank = got["stats"]["distributed"]["per_rank"]
    lookups = sum(r["hits"] + r["misses"] for r in per_rank)
    assert lookups == want["stats"]["expert_cache_hits"] + want["stats"]["expert_cache_misses"]
    assert all(r["misses"] > 0 for r in per_rank), per_rank  # each reads its own share


@pytest.mark.parametrize("routed", [False, True])
def test_one_rank_group_records_prefetches_and_replays_as_one_process(
    checkpoints, tmp_path, routed, monkeypatch
):
    """The distributed switch on a group of one (it owns every expert) against the
    single-process switch, with a trace recorder, prefetch (the next router's lookahead;
    co-occurrence when trace-routed) and, `routed`, a routing trace: the same tokens, the
    same recorded routing and the very same cache lookups, hits, misses and prefetches."""
    from ssdmoe_tui.engine.experts.prefetch import COLD_ENV, OVERLAP_ENV
    from ssdmoe_tui.engine.policy.traces import TraceWriter
    from ssdmoe_tui.engine.run.open import open_engine
    from ssdmoe_tui.options import CacheBudget, EngineOptions

    monkeypatch.setenv(COLD_ENV, "0")  # decode guesses take slots not asked for this token
    # every guess read, as the lookups wait for them: with the overlap, which guesses a
    # layer's lookup finds started is the prefetch thread's pace, not the same two runs
    monkeypatch.setenv(OVERLAP_ENV, "off")
    path = checkpoints("qwen3_moe")
    trace = tmp_path / "model.jsonl"
    # 20 of 48 slots: a prefill's union fits (one process would feed the co-occurrence
    # predictor group by group otherwise), and prefetch has something to read
    budget = "360K"
    if routed:
        want, _ = _single_tokens(path, PROMPT, 8, "216K")  # any recording will do
        meta = {"model_type": "qwen3_moe", "k": 4, "num_layers": 3, "num_experts": 16}
        sm = load_streamed(path, expert_cache="216K")
        w = TraceWriter(trace, meta)
        step = {"n": 0}
        sm.cache.on_route = lambda layer, ids: w.add(
            step["n"], layer, ids, phase=int(step["n"] > 0)
        )
        sm.tokenizer.eos_token_ids = set()
        for ev in Runner(sm).stream(PROMPT, max_tokens=8, sampler=make_sampler(0.0)):
            step["n"] += type(ev).__name__ == "TokenEvent"
        w.close()
        sm.close()
    dist = Distributed(mx.distributed.init(strict=False))
    results = []
    for d in (None, dist):
        opts = EngineOptions(
            model=str(path), expert_cache=CacheBudget.parse(budget), prefetch=True,
            routing_trace=str(trace) if routed else None,
        )  # fmt: skip
        runner = open_engine(opts, distributed=d)
        rows: list = []

        def record(layer, ids, rows=rows) -> None:
            # one process records a prefill larger than the cache group by group
            if rows and rows[-1][0] == layer:
                rows[-1][1].extend(map(int, ids))
            else:
                rows.append((layer, list(map(int, ids))))

        runner.sm.cache.on_route = record
        runner.sm.tokenizer.eos_token_ids = set()
        try:
            res = runner.generate(PROMPT, max_tokens=8, sampler=make_sampler(0.0))
            c = runner.sm.cache.counters
            figures = (c.hits, c.misses, c.bytes_read, c.prefetch_issued, c.prefetch_used)
            kind = type(runner.sm.blocks[0].switch_mlp).__name__
            results.append((res.tokens, rows, figures, kind))
        finally:
            runner.close()
    (t1, r1, f1, k1), (t2, r2, f2, k2) = results
    assert (k1, k2) == ("StreamedSwitch", "DistributedSwitch")
    assert t2 == t1 and r2 == r1 and f2 == f1
    assert f1[3] > 0  # prefetch was exercised

"""`ssdmoe bench` on a tiny random checkpoint: fields, arithmetic, resident baseline."""

from __future__ import annotations

import json

import pytest

from ssdmoe_tui.bench.bench import BenchOptions, _baseline_decision, fixed_prompt
from ssdmoe_tui.cli import main
from ssdmoe_tui.memory import MemoryLimit, memory_limit
from ssdmoe_tui.options import EngineOptions

KS = [4, 2]
BUDGETS = ["64K", "1M"]
DECODE = 6


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from tests.helpers.checkpoints import build

    return build("qwen3_moe", tmp_path_factory.mktemp("bench") / "qwen3_moe")


@pytest.fixture(scope="module")
def bench_json(tiny, tmp_path_factory):
    out = tmp_path_factory.mktemp("bench-out") / "bench.json"
    rc = main(
        [
            "bench",
            "--model", str(tiny),
            "--k", ",".join(map(str, KS)),
            "--expert-cache", ",".join(BUDGETS),
            "--prompt-tokens", "24",
            "--decode-tokens", str(DECODE),
            "--disk-mib", "1",
            "--json", str(out),
        ]
    )  # fmt: skip
    assert rc == 0
    res = json.loads(out.read_text())
    assert res["complete"] is True
    return out, res


def test_conditions_recorded(bench_json, tiny):
    _, res = bench_json
    c = res["conditions"]
    assert c["model_type"] == "qwen3_moe"
    assert c["quantization"]["bits"] == 4 and c["quantization"]["group_size"] == 32
    for key in ("mlx", "mlx_lm", "ssdmoe"):
        assert c["versions"][key] and c["versions"][key] != "unknown"
    assert c["device"]["backend"] in ("cpu", "gpu/Metal", "gpu/CUDA")
    assert c["dtype"] in ("float32", "bfloat16", "float16")
    assert c["prompt_tokens"] == 24 and c["decode_tokens"] == DECODE
    assert c["mode"] == "warm" and c["ks"] == KS and c["expert_cache"] == BUDGETS
    assert c["date"].endswith("Z")
    assert c["expert_piece_bytes"] and sum(c["expert_piece_bytes"]) == c["expert_bytes"]
    assert len(res["configs"]) == len(KS) * len(BUDGETS)
    for r in res["configs"]:
        assert r["reader"] in ("native", "python")
        assert r["page_cache"] == "warm"


def test_arithmetic_is_consistent(bench_json):
    _, res = bench_json
    c = res["conditions"]
    eb, layers = c["expert_bytes"], c["num_layers_moe"]
    for r in res["configs"]:
        k, steps = r["k"], r["decode_steps"]
        assert r["generated_tokens"] == DECODE and steps == DECODE - 1
        assert 0.0 <= r["hit_rate"] <= 1.0
        # each decode step routes exactly K distinct experts in every MoE layer
        assert r["decode_hits"] + r["decode_misses"] == k * layers * steps
        assert r["decode_requested_bytes"] == r["decode_misses"] * eb
        assert r["requested_mib_per_token"] == pytest.approx(
            r["decode_misses"] * eb / steps / 2**20, abs=1e-4
        )
        assert r["bytes_per_token_no_cache"] == eb * k * layers
        for ms in (r["ms_per_token"], r["prefill_ms_per_token"]):
            parts = ms["router_sync"] + ms["read_wait"] + ms["cache_bookkeeping"] + ms["rest"]
            assert ms["total"] == pytest.approx(parts, abs=3e-3)
            assert min(ms["router_sync"], ms["read_wait"], ms["cache_bookkeeping"]) >= 0
        ms = r["ms_per_token"]
        assert r["decode_tok_s"] == pytest.approx(1000 * steps / (ms["total"] * steps), rel=1e-2)
        disk = res["disk"]["by_k"][str(k)]
        bw = disk["bytes"] / disk["seconds"]
        assert disk["bytes"] == disk["batches"] * k * eb
        if r["hit_rate"] < 1.0:
            assert r["io_ceiling_tok_s"] == pytest.approx(
                bw / (eb * k * layers * (1 - r["hit_rate"])), rel=1e-3
            )
            assert r["achieved_over_ceiling"] == pytest.approx(
                r["decode_tok_s"] / r["io_ceiling_tok_s"], rel=1e-2
            )
        else:
            assert r["io_ceiling_note"] == "no reads (hit rate 100%)"
        assert r["peak_mlx_memory_bytes"] > 0 and r["peak_rss_bytes"] > 0
        # the prompt's peak is part of the turn's (decode can only add to it)
        assert 0 < r["prefill_peak_mlx_memory_bytes"] <= r["peak_mlx_memory_bytes"]
        assert r["memory_bound_bytes"] == (
            r["resident_memory_bytes"] + r["expert_cache_budget_bytes"] + r["kv_cache_bytes"]
        )
        assert r["kv_cache_bytes"] > 0 and r["resident_memory_bytes"] > 0
        assert r["peak_over_memory_bound"] == pytest.approx(
            r["peak_mlx_memory_bytes"] / r["memory_bound_bytes"], rel=1e-3
        )
        # prefill against reading every expert once per chunk
        chunks = r["prefill_chunks"]
        assert chunks == -(-(r["prompt_tokens"] - 1) // c["prefill_step"])
        assert r["prefill_union_share"] == pytest.approx(
            r["prefill_requested_bytes"] / (c["expert_set_bytes"] * chunks), abs=1e-4
        )
        assert r["prefill_read_all_tok_s"] == pytest.approx(
            r["prompt_tokens"] * bw / (c["expert_set_bytes"] * chunks), rel=1e-3
        )
        assert r["prefill_over_read_all"] == pytest.approx(
            r["prefill_tok_s"] / r["prefill_read_all_tok_s"], rel=1e-2
        )
    small = [r for r in res["configs"] if r["expert_cache"] == "64K"]
    big = [r for r in res["configs"] if r["expert_cache"] == "1M"]
    # 1M holds every expert of the tiny model: no expert is ever read twice
    for r in big:
        assert r["budget_over_expert_set"] >= 1.0
        assert r["prefill_requested_bytes"] + r["decode_requested_bytes"] <= c["expert_set_bytes"]
    assert all(r["budget_over_expert_set"] < 1.0 and r["decode_misses"] > 0 for r in small)


def test_resident_baseline_ran_and_matches(bench_json):
    _, res = bench_json
    base = res["resident_baseline"]
    assert base["status"] == "ran"
    assert sorted(int(k) for k in base["by_k"]) == sorted(KS)
    for r in res["configs"]:
        b = base["by_k"][str(r["k"])]
        assert b["generated_tokens"] == DECODE and b["decode_tok_s"] > 0
        assert r["ratio_decode_vs_resident"] == pytest.approx(
            r["decode_tok_s"] / b["decode_tok_s"], rel=1e-3
        )
        # streamed greedy output is plain mlx-lm's, token for token
        assert r["tokens_match_resident"] is True
        assert r["token_ids"] == b["token_ids"]


def test_reuse_baseline_json_and_plot(bench_json, tiny, tmp_path, capsys):
    path, first = bench_json
    out = tmp_path / "again.json"
    png = tmp_path / "plot.png"
    text = tmp_path / "text.txt"
    text.write_text("Experts per token trade bytes for quality. " * 8)
    rc = main(
        [
            "bench", "--model", str(tiny), "--k", "2", "--expert-cache", "64K",
            "--prompt-tokens", "24", "--decode-tokens", str(DECODE), "--disk-mib", "1",
            "--no-warmup", "--baseline-json", str(path), "--json", str(out), "--plot", str(png),
            "--wide", "--quality", str(text), "--quality-tokens", "24",
        ]
    )  # fmt: skip
    assert rc == 0
    res = json.loads(out.read_text())
    assert res["resident_baseline"]["source"] == str(path)
    (r,) = res["configs"]
    assert r["resident_decode_tok_s"] == first["resident_baseline"]["by_k"]["2"]["decode_tok_s"]
    # quality recorded beside the speed of the same K (the trained K is scored too)
    assert set(res["quality"]["by_k"]) == {"4", "2"} and res["quality"]["text_tokens"] == 24
    assert r["quality"] == res["quality"]["by_k"]["2"]
    assert 0 < r["quality"]["routing_mass"] < 1 and 0 < r["routing_mass"] < 1
    captured = capsys.readouterr()
    assert "streamed/resident" in captured.out  # --wide: every column
    assert "quality at each K" in captured.out and "only mean something" in captured.out
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert "matplotlib is not installed" in captured.err and not png.exists()
    else:
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_baseline_refused_when_model_exceeds_memory(tiny):
    opts = BenchOptions(engine=EngineOptions(model=str(tiny)))
    small = MemoryLimit(mem_available=1 << 30, cgroup_limit=None, cgroup_usage=None)
    why = _baseline_decision(opts, 3 << 30, small)
    assert why is not None and why.startswith("cannot run: model 3.0 GiB > memory")
    assert _baseline_decision(opts, 100 << 20, small) is None
    capped = MemoryLimit(mem_available=64 << 30, cgroup_limit=16 << 30, cgroup_usage=1 << 30)
    assert capped.available == 15 << 30
    assert _baseline_decision(opts, 19 << 30, capped).startswith("cannot run: model 19.0 GiB")
    assert memory_limit().available > 0


def test_fixed_prompt_is_deterministic(tiny):
    from mlx_lm.utils import load_tokenizer

    tok = load_tokenizer(tiny)
    a, b = fixed_prompt(tok, 100), fixed_prompt(tok, 100)
    assert a == b and len(a) == 100
    assert fixed_prompt(tok, 7) == a[:7]


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--k", "99"], "K=99 is outside 1..16"),
        (["--decode-tokens", "1"], "--decode-tokens must be >= 2"),
        (["--expert-cache", "lots"], None),
    ],
)
def test_bad_input_is_one_line(tiny, args, needle, capsys):
    try:
        rc = main(["bench", "--model", str(tiny), "--no-warmup", *args])
    except SystemExit as e:  # argparse rejects malformed values itself
        rc = e.code
    assert rc != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert err and "Traceback" not in "\n".join(err)
    if needle:
        assert needle in err[-1]


def test_missing_model_is_one_line(tmp_path, capsys):
    rc = main(["bench", "--model", str(tmp_path / "nope")])
    assert rc != 0
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "nope" in err


def test_prefetch_both_reports_precision_recall_and_net_gain(tiny, tmp_path, capsys, monkeypatch):
    from ssdmoe_tui.engine.experts.prefetch import COLD_ENV

    monkeypatch.setenv(COLD_ENV, "0")  # guesses only take slots not asked for this token
    out = tmp_path / "pf.json"
    rc = main(
        [
            "bench", "--model", str(tiny), "--k", "2", "--expert-cache", "64K",
            "--prompt-tokens", "16", "--decode-tokens", str(DECODE), "--disk-mib", "1",
            "--baseline", "skip", "--prefetch", "both", "--json", str(out),
        ]
    )  # fmt: skip
    assert rc == 0
    res = json.loads(out.read_text())
    off, on = res["configs"]
    assert (off["prefetch"], on["prefetch"]) == (False, True)
    assert "prefetch_precision" not in off
    assert on["prefetch_issued"] >= on["prefetch_used"] >= 0
    assert on["prefetch_issued"] > 0, "a 64K cache misses every step: something is predicted"
    assert on["prefetch_precision"] == pytest.approx(
        on["prefetch_used"] / on["prefetch_issued"], abs=1e-4
    )
    assert on["prefetch_recall"] == pytest.approx(
        on["prefetch_used"] / on["decode_misses"], abs=1e-4
    )
    assert on["prefetch_decode_vs_off"] == pytest.approx(
        on["decode_tok_s"] / off["decode_tok_s"], rel=1e-3
    )
    assert off["token_ids"] == on["token_ids"]  # prefetch never changes the output
    printed = capsys.readouterr().out
    assert "+pf" in printed and "precision" in printed and "x of off" in printed


def test_summary_flags_host_slots_outside_a_cgroup_cap(bench_json):
    """MLX-CUDA host-placed slots are driver memory: the table says the cap excludes them."""
    import copy

    from ssdmoe_tui.bench.report import summary

    _, res = bench_json
    assert "MLX-CUDA placement" not in summary(res)  # CPU: nothing to say
    res = copy.deepcopy(res)
    for r in res["configs"]:
        r["slot_placement"] = "host"
    res["conditions"]["memory"]["cgroup_limit_bytes"] = 16 << 30
    text = summary(res)
    assert "slots host (MLX-CUDA placement)" in text
    assert "not charged to the cgroup cap" in text


@pytest.mark.parametrize(
    "content",
    [
        b'{"resident_baseline": "x"}',
        b'{"resident_baseline": {"status": "ran", "by_k": {"a": 1}}}',
        b"[1]",
        b"\xff\xfe",
        b"[" * 100_000,
    ],
)
def test_damaged_baseline_json_is_one_line_naming_the_file(content, tmp_path):
    from ssdmoe_tui.bench.bench import _load_baseline_json
    from ssdmoe_tui.errors import BadValueError

    path = tmp_path / "old.json"
    path.write_bytes(content)
    with pytest.raises(BadValueError) as e:
        _load_baseline_json(path, {})
    assert str(path) in str(e.value) and "\n" not in str(e.value)


def test_bench_options_typed_once(tiny):
    """Budgets arrive parsed (strings from programmatic callers are parsed the same way);
    each configuration's engine options are the shared ones with its K, budget, prefetch."""
    from ssdmoe_tui.errors import BadValueError
    from ssdmoe_tui.options import CacheBudget

    opts = BenchOptions(engine=EngineOptions(model=str(tiny), reader="python"), budgets=["64K"])
    assert opts.budgets == [CacheBudget(64 << 10, "64K")] and opts.engine.prefill_step == 512
    one = opts.engine_for(2, opts.budgets[0], prefetch=True)
    assert (one.k, one.expert_cache.bytes, one.prefetch) == (2, 64 << 10, True)
    assert one.reader == "python" and one.model == str(tiny)
    for bad in ({"prefetch": "maybe"}, {"baseline": "never"}, {"budgets": ["lots"]}):
        with pytest.raises(BadValueError) as e:
            BenchOptions(engine=EngineOptions(model=str(tiny)), **bad)
        assert "\n" not in str(e.value)


def test_batch_reports_aggregate_per_stream_and_bytes_per_sequence(tiny, tmp_path, capsys):
    """`--batch 1,3`: each B on a fresh engine; the steady-state window decodes B rows per
    step; `--batch-check` reruns every row alone: greedy tokens equal on CPU; the model
    fits, so mlx-lm's resident `BatchGenerator` runs the same rows beside each."""
    out = tmp_path / "batch.json"
    rc = main(
        [
            "bench", "--model", str(tiny), "--k", "4", "--expert-cache", "64K",
            "--prompt-tokens", "16", "--decode-tokens", "10", "--disk-mib", "1",
            "--baseline", "force", "--no-warmup", "--batch", "1,3", "--batch-check",
            "--json", str(out),
        ]
    )  # fmt: skip
    assert rc == 0
    res = json.loads(out.read_text())
    one, three = res["batch"]
    assert (one["batch"], three["batch"]) == (1, 3)
    for r in (one, three):
        b = r["batch"]
        assert r["window_steps"] >= 1
        assert r["aggregate_decode_tok_s"] == pytest.approx(
            b * r["per_stream_decode_tok_s"], rel=1e-3
        )
        assert r["rows_equal_alone"] == b and r["token_mismatch_rate"] == 0
        # rows are held open until the last has joined, then decode 10 more together
        assert len(r["token_ids"]) == b and all(len(t) >= 10 for t in r["token_ids"])
        assert len(r["token_ids"][-1]) == 10
        bg = r["resident_batch_generator"]
        assert bg["status"] == "ran" and bg["tokens_equal_engine"] == b
        assert bg["aggregate_decode_tok_s"] > 0 and bg["engine_vs_resident"] > 0
    assert three["union_experts_per_layer"] > one["union_experts_per_layer"] == 4
    assert len({tuple(t) for t in three["token_ids"]}) == 3  # three different prompts
    assert three["aggregate_vs_b1"] == pytest.approx(
        three["aggregate_decode_tok_s"] / one["aggregate_decode_tok_s"], rel=1e-2
    )
    assert one["token_ids"][0] == res["configs"][0]["token_ids"]  # B=1 row 0: the bench prompt
    printed = capsys.readouterr().out
    assert "batched decode" in printed and "| 4 | 64K | 3 |" in printed
    assert "| 3/3 |" in printed and "resident BatchGenerator tok/s" in printed


def test_storage_file_cache_thermal_and_response_times_recorded(bench_json, tiny):
    """Issue 24 item 5: the drive, file system, file-cache state before the run and the
    thermal state are conditions; prefill, decode and total response time come apart."""
    from ssdmoe_tui.bench.report import summary

    _, res = bench_json
    c = res["conditions"]
    fs = c["storage"]["file_system"]
    assert fs["type"] != "unknown" and str(tiny.resolve()).startswith(fs["mount_point"])
    assert set(c["storage"]["drive"]) >= {"device", "model", "interface", "rotational"}
    before = c["page_cache_before"]
    assert before["method"] == "mincore" and before["files"] >= 1
    assert 0.0 <= before["resident_share"] <= 1.0
    for when in ("thermal_before", "thermal_after"):
        assert c[when]["state"]  # "unknown" with a note where the OS tells nothing
    for r in res["configs"]:
        # warm mode read the shards once: the file cache holds them when each config starts
        assert r["page_cache_resident_share"] == pytest.approx(1.0, abs=0.01)
        assert 0 < r["first_token_s"] == pytest.approx(r["prefill_s"], abs=0.05)
        assert r["response_s"] == pytest.approx(r["first_token_s"] + r["decode_s"], abs=0.05)
        assert r["decode_cpu_ms_per_token"] > 0  # CPU time of the decode window, per step
        # the prefill chunk by chunk: every prompt token once, the first token's step last
        chunks = r["prefill_chunks_s"]
        assert sum(n for n, _ in chunks) == r["prompt_tokens"] and chunks[-1][0] == 1
        assert sum(t for _, t in chunks) == pytest.approx(r["prefill_s"], abs=0.05)
        # the same chunks' reading, router sync and the process's page faults
        detail = r["prefill_chunks_detail"]
        assert len(detail) == len(chunks)
        # (each figure rounded to 0.1 ms)
        assert sum(d["read_s"] for d in detail) <= r["prefill_read_s"] + 1e-4 * len(detail) + 1e-4
        assert all(d["read_s"] >= 0 and d["router_sync_s"] >= 0 for d in detail)
        assert all(len(d["faults"]) == 2 and min(d["faults"]) >= 0 for d in detail)
    text = summary(res, wide=True)
    assert f"| {fs['type']} on {fs['mount_point']} |" in text
    assert "response time (prefill to the first token + decode = total)" in text


def _trace_batches(tiny, tmp_path, trace_tokens: int, batches: str, decode: int) -> list:  # noqa: ANN001
    """`bench --batch BATCHES --batch-check` routed by a trace of `trace_tokens` decode
    steps the tiny model recorded itself: the JSON's batch rows."""
    trace = tmp_path / "own.jsonl"
    assert main(["generate", "--model", str(tiny), "--prompt", "one two three four five",
                 "--raw", "--max-tokens", str(trace_tokens), "--trace", str(trace)]) == 0  # fmt: skip
    out = tmp_path / "batch.json"
    rc = main(
        [
            "bench", "--model", str(tiny), "--expert-cache", "64K", "--routing-trace",
            str(trace), "--prompt-tokens", "16", "--decode-tokens", str(decode), "--disk-mib",
            "1", "--baseline", "skip", "--no-warmup", "--batch", batches, "--batch-check",
            "--json", str(out),
        ]
    )  # fmt: skip
    assert rc == 0
    return json.loads(out.read_text())["batch"]


def test_batch_check_follows_each_rows_trace_offset(tiny, tmp_path, capsys):
    """Trace-driven `--batch-check`: each row is rerun alone from its own offset of the
    trace (the position the batch gave it), so on CPU every row equals its batched run;
    before, the rerun continued the trace where the batch had left it (0/B equal)."""
    for r in _trace_batches(tiny, tmp_path, 12, "1,2", 8):
        assert r["rows_equal_alone"] == r["batch"] and r["token_mismatch_rate"] == 0
    capsys.readouterr()


def test_pipeline_both_alternates_which_runs_first(tiny, tmp_path):
    """`--pipeline both`: each configuration serial and pipelined, the order alternating
    from one (budget, K) to the next, so neither always runs second."""
    out = tmp_path / "both.json"
    rc = main(
        ["bench", "--model", str(tiny), "--k", "4", "--expert-cache", ",".join(BUDGETS),
         "--prompt-tokens", "8", "--decode-tokens", "2", "--disk-mib", "1",
         "--baseline", "skip", "--no-warmup", "--pipeline", "both", "--json", str(out)]
    )  # fmt: skip
    assert rc == 0
    configs = json.loads(out.read_text())["configs"]
    assert [(c["expert_cache"], c["pipeline"]) for c in configs] == [
        ("64K", False), ("64K", True), ("1M", True), ("1M", False)
    ]  # fmt: skip


def test_the_report_lists_a_long_prompts_chunks():
    """A prompt prefilled in several chunks gets a line of seconds per chunk (the first
    token's step left out); one chunk, or a result from before the figure, none."""
    from ssdmoe_tui.bench.report import _chunks_fragment

    r = {"prefill_chunks_s": [[4096, 3.641], [4096, 3.95], [191, 0.2], [1, 0.02]]}
    assert _chunks_fragment(r) == "4096: 3.64, 4096: 3.95, 191: 0.20 s"
    assert _chunks_fragment({"prefill_chunks_s": [[4096, 3.6], [1, 0.02]]}) is None
    assert _chunks_fragment({}) is None


def test_trace_rows_stay_their_offsets_apart_whatever_their_joins_cost(tiny, tmp_path, capsys):
    """Trace-driven `--batch 4`: row i joins `len(trace) * i / 4` decode steps past where
    row 0 has reached along the trace (bench/batch.py `_Spread`), so as the window starts
    the rows sit about that far apart, less only the steps row 0 decoded during row i's
    own join. With offsets fixed before the joins, each row lost every step the earlier
    joins took, and rows that joined a quarter of the trace apart lined up on one step
    (H100, 2026-12-07: three of four rows within a step, routing alike)."""
    (row,) = _trace_batches(tiny, tmp_path, 40, "4", 4)
    places = row["trace_places"]
    span = row["routing_decode_steps"]
    apart = [places[i] - places[0] for i in range(4)]
    for i in range(1, 4):
        # row i lags by the steps of its own join only: here 2-3 (chunks sized to the join
        # budget, then its first token); the old placement lost every earlier join's too
        assert span * i // 4 - 3 <= apart[i] <= span * i // 4, (apart, span)
    assert row["rows_equal_alone"] == 4 and row["token_mismatch_rate"] == 0
    capsys.readouterr()

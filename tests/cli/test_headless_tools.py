"""The headless tools as a newcomer meets them: bench table width, quiet demo-model, help and docs."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from ssdmoe_tui.bench.report import WIDTH, summary
from ssdmoe_tui.cli import main
from tests.helpers.fixture_paths import FIXTURES

ROOT = Path(__file__).resolve().parents[2]


def _result() -> dict:
    """A bench result with the widest values the table meets in practice."""
    config = {
        "k": 8,
        "expert_cache": "auto",
        "budget_over_expert_set": 1.0,
        "prefetch": True,
        "page_cache": "cold (drop_caches)",
        "prefill_tok_s": 1234.5,
        "decode_tok_s": 123.45,
        "ms_per_token": {
            "total": 1234.5,
            "router_sync": 123.4,
            "read_wait": 1000.1,
            "cache_bookkeeping": 11.0,
            "rest": 100.0,
        },
        "hit_rate": 0.8125,
        "requested_mib_per_token": 1234.5,
        "device_mib_per_token": 1234.5,
        "decode_read_gb_s": 12.34,
        "peak_mlx_memory_bytes": 123 << 30,
        "peak_rss_bytes": 123 << 30,
        "io_ceiling_tok_s": 12.34,
        "achieved_over_ceiling": 0.95,
        "resident_decode_tok_s": 12.34,
        "ratio_decode_vs_resident": 0.99,
        "tokens_match_resident": False,
        "tokens_common_prefix": 123,
        "routing_mass": 0.8734,
        "prefetch_precision": 0.14,
        "prefetch_recall": 0.06,
        "prefetch_decode_vs_off": 0.99,
        "peak_over_memory_bound": 1.003,
        "prefill_union_share": 0.9,
        "prefill_over_read_all": 1.2,
    }
    configs = []
    for k in (8, 4, 2):
        for budget in ("auto", "512M"):
            c = copy.deepcopy(config)
            c["k"], c["expert_cache"] = k, budget
            configs.append(c)
    return {
        "conditions": {
            "model": "/home/someone/models/mlx-community/Qwen3.5-35B-A3B-4bit",
            "model_type": "qwen3_5_moe",
            "checkpoint_bytes": 19 << 30,
            "num_layers_moe": 40,
            "num_experts": 256,
            "expert_bytes": 1_769_472,
            "quantization": {"bits": 4, "group_size": 64},
            "versions": {"mlx": "0.32.4", "mlx_lm": "0.32.2", "ssdmoe": "0.1.0"},
            "device": {"backend": "gpu/Metal", "name": "Apple M3 Max"},
            "dtype": "bfloat16",
            "date": "2026-11-30T12:00:00Z",
            "prompt_tokens": 512,
            "decode_tokens": 128,
            "mode": "cold",
            "queue_depth": 16,
            "memory": {"mem_available_bytes": 30 << 30, "cgroup_limit_bytes": 16 << 30},
            "trained_k": 8,
        },
        "disk": {
            "page_cache": "cold",
            "by_k": {str(k): {"gb_per_s": 5.1, "reader": "native"} for k in (8, 4, 2)},
        },
        "resident_baseline": {"status": "cannot run: model 19.0 GiB > memory"},
        "configs": configs,
    }


def test_bench_table_fits_100_columns_with_a_legend_and_wide_has_every_column():
    text = summary(_result())
    too_wide = [line for line in text.splitlines() if len(line) > WIDTH]
    assert not too_wide, too_wide
    assert "router" in text and "87.3%" in text and "vs" in text and "mlx-lm" in text
    assert "cache hit: share of expert lookups" in text  # the legend
    assert "--wide shows every column" in text
    wide = summary(_result(), wide=True)
    assert "ms/tok = sync+read+cache+rest" in wide and "streamed/resident" in wide
    assert "I/O ceiling tok/s" in wide
    md = summary(_result(), markdown=True)
    assert "| K | expert cache | decode tok/s |" in md


def test_demo_model_does_not_print_mlx_lm_quantization_info(tmp_path, capfd):
    from tests.helpers.checkpoints import MIXTRAL

    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(MIXTRAL))
    assert main(["demo-model", "--config", str(cfg), "--out", str(tmp_path / "m")]) == 0
    out, err = capfd.readouterr()
    assert "bits per weight" not in out + err and "[INFO]" not in out + err
    assert out.strip() == str(tmp_path / "m")


@pytest.mark.parametrize(
    "config",
    [
        {},  # no model_type
        {"model_type": "llama", "hidden_size": 64},  # dense
        {  # MoE, but mlx-lm's ModelArgs needs more (vocab_size...)
            "model_type": "qwen3_moe", "num_experts": 8, "num_experts_per_tok": 2,
            "num_hidden_layers": 2, "hidden_size": 64, "moe_intermediate_size": 64,
        },
    ],
)  # fmt: skip
def test_demo_model_bad_config_is_one_line_naming_it(config, tmp_path, capsys):
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(config))
    assert main(["demo-model", "--config", str(cfg), "--out", str(tmp_path / "m")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"ssdmoe: error: {cfg}: "), err
    assert "Error:" not in err[0]  # not a bare exception type
    assert not (tmp_path / "m").exists()  # nothing half-made left behind


@pytest.mark.parametrize("force", [False, True])
def test_demo_model_never_replaces_a_folder_it_did_not_write(tmp_path, capsys, force):
    """`demo-model --out DIR` replaces DIR whole: a folder without the demo stamp (the
    user's own files) is refused in one line and left as it was, with --force too."""
    from ssdmoe_tui.models.demo import DEMO_VERSION, ensure_demo_model

    mine = tmp_path / "work"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    argv = ["demo-model", "--out", str(mine), *(["--force"] if force else [])]
    assert main(argv) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "is not a demo model folder" in err[0] and str(mine) in err[0]
    assert [p.name for p in mine.iterdir()] == ["notes.txt"]
    demo = tmp_path / "demo"  # a current demo folder is returned as is, nothing rewritten
    demo.mkdir()
    (demo / ".ssdmoe-demo").write_text(str(DEMO_VERSION))
    assert ensure_demo_model(demo) == demo and len(list(demo.iterdir())) == 1


def test_readme_and_models_supported_list_every_architecture(capsys):
    from ssdmoe_tui.checkpoint.arch import ARCHITECTURES

    readme = (ROOT / "README.md").read_text()
    assert main(["models", "supported"]) == 0
    listed = capsys.readouterr().out
    for arch in ARCHITECTURES:
        assert f"`{arch}`" in readme, arch
        assert arch in listed, arch
    assert "mixtral" in listed


def test_trace_replay_help_names_the_recording_flag(capsys):
    with pytest.raises(SystemExit) as e:
        main(["trace", "replay", "--help"])
    assert e.value.code == 0
    help_text = " ".join(capsys.readouterr().out.split())
    assert "ssdmoe generate --trace FILE" in help_text
    assert "ssdmoe --trace" not in help_text


def test_generate_batch_json_each_sequence_equal_alone(tmp_path, capsys):
    """`generate --batch 3` with two prompts: three sequences (the prompts repeated),
    decoded together; each equal to `generate` of its prompt alone (greedy). 40 tokens:
    the later rows join in chunks sized by measured time, so on a loaded machine they
    take more of the first row's steps (a clean clone's run with 8 tokens saw the first
    row end before the third had joined)."""
    from tests.helpers.checkpoints import build

    model = str(build("mixtral", tmp_path / "mixtral"))
    base = ["generate", "--model", model, "--max-tokens", "40", "--json"]
    alone = []
    for text in ("Hello there", "Why stream experts?"):
        assert main([*base, "--prompt", text]) == 0
        alone.append(json.loads(capsys.readouterr().out.strip().splitlines()[-1]))
    argv = [*base, "--prompt", "Hello there", "--prompt", "Why stream experts?", "--batch", "3"]
    assert main(argv) == 0
    got = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    seqs = got["sequences"]
    assert [s["token_ids"] for s in seqs] == [a["token_ids"] for a in (*alone, alone[0])]
    assert [s["text"] for s in seqs] == [a["text"] for a in (*alone, alone[0])]
    assert got["batch"]["max_rows"] == 3 and got["batch"]["steps"] >= 1
    assert all(s["stats"]["generated_tokens"] == 40 for s in seqs)


def test_demo_model_takes_the_quantization_of_its_config(tmp_path, capsys):
    """Issue 33: `demo-model --config` on the demo's own config failed ("input size 96 is
    not a multiple of group size 64"): the config's group size and bits are used now,
    and flags still override them (a size that cannot fit is one line naming the file)."""
    from ssdmoe_tui.models.demo import TRAINED_DIR

    cfg = TRAINED_DIR / "config.json"
    out = tmp_path / "m"
    assert main(["demo-model", "--config", str(cfg), "--out", str(out)]) == 0
    q = json.loads((out / "config.json").read_text())["quantization"]
    assert (q["group_size"], q["bits"], q["mode"]) == (32, 4, "affine")
    assert q["model.layers.0.mlp.gate"] == {"group_size": 64, "bits": 8}  # the router's
    argv = ["generate", "--model", str(out), "--prompt", "hi", "--max-tokens", "3"]
    assert main(argv) == 0
    capsys.readouterr()
    argv = ["demo-model", "--config", str(cfg), "--out", str(tmp_path / "b"), "--bits", "8"]
    assert main(argv) == 0
    assert json.loads((tmp_path / "b" / "config.json").read_text())["quantization"]["bits"] == 8
    capsys.readouterr()
    # the first trained demo's expert width (96; 128 since DEMO_VERSION 6) fits no group of 64
    narrow = tmp_path / "narrow.json"
    narrow.write_text(json.dumps({**json.loads(cfg.read_text()), "moe_intermediate_size": 96}))
    argv = ["demo-model", "--config", str(narrow), "--out", str(tmp_path / "c")]
    assert main([*argv, "--group-size", "64"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(narrow) in err[0] and "64" in err[0], err


def test_eval_runs_with_no_argument_on_the_demo_and_its_held_out_text(capsys):
    """Issue 33 N17: every command ran on the demo with no argument but `eval`, which
    needed --text; it now takes the GPL v3 text it ships (held out of the demo's
    training), and says so."""
    from ssdmoe_tui.commands.eval import DEFAULT_TEXT

    assert main(["eval", "--max-tokens", "64", "--k", "4"]) == 0
    out, err = capsys.readouterr()
    assert "no --text: the GNU GPL v3 text" in err and str(DEFAULT_TEXT) in err
    assert f"text: {DEFAULT_TEXT}, 64 tokens" in out
    assert DEFAULT_TEXT.read_bytes() == (FIXTURES / "heldout" / "gpl3.txt").read_bytes()

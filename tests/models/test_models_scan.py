"""`ssdmoe models`: what it finds in a hub cache and model folders, and what it reports."""

from __future__ import annotations

import json
import os
from pathlib import Path

from ssdmoe_tui.models import registry
from ssdmoe_tui.models.demo import ensure_demo_model
from ssdmoe_tui.models.scan import measure_experts, read_config, scan_models
from tests.helpers.cli_runner import run_cli
from tests.helpers.fakes import add_to_hub_cache, fake_config, write_checkpoint

ROOT = Path(__file__).resolve().parents[2]
MIB = 1 << 20


def _models_json(env: dict[str, str]) -> list[dict]:
    r = run_cli(["models", "--json"], env=env, drop_env=("HF_", "SSDMOE_"), timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stderr == ""
    return json.loads(r.stdout)


def test_models_json_reports_header_bytes(tmp_path: Path) -> None:
    cache = tmp_path / "hub"
    qwen = write_checkpoint(tmp_path / "src-qwen", fake_config(layers=3, experts=8, k=2))
    add_to_hub_cache(cache, "test-org/Qwen-Tiny-4bit", tmp_path / "src-qwen")
    nemo_cfg = fake_config("nemotron_h", layers=6, experts=16, k=4, hidden=128, inter=64)
    nemo = write_checkpoint(tmp_path / "src-nemo", nemo_cfg)
    add_to_hub_cache(cache, "test-org/Nemo-Tiny-4bit", tmp_path / "src-nemo")
    # A dense model in the cache is not a MoE checkpoint: not listed.
    dense = tmp_path / "src-dense"
    dense.mkdir()
    (dense / "config.json").write_text('{"model_type": "llama", "hidden_size": 64}')
    add_to_hub_cache(cache, "test-org/Dense", dense)
    # An extra folder of model folders (SSDMOE_MODEL_DIRS) with a nested-config Qwen3.5.
    extra = tmp_path / "models"
    q35 = write_checkpoint(extra / "q35", fake_config("qwen3_5_moe", layers=2, experts=4))
    raw = write_checkpoint(extra / "raw", fake_config(quantized=False))

    env = {
        "HF_HUB_CACHE": str(cache),
        "HF_HUB_OFFLINE": "1",
        "SSDMOE_HOME": str(tmp_path / "home"),
        "SSDMOE_MODEL_DIRS": os.pathsep.join([str(extra), str(tmp_path / "nowhere")]),
    }
    rows = {row["name"]: row for row in _models_json(env)}
    assert set(rows) == {"test-org/Qwen-Tiny-4bit", "test-org/Nemo-Tiny-4bit", "q35", "raw"}

    r = rows["test-org/Qwen-Tiny-4bit"]
    per_layer = qwen["bytes_per_expert"]
    assert r["bytes_per_expert"] == per_layer[0]
    # Sum of every switch_mlp tensor of layer 0 (as written), divided by the 8 experts.
    layer0 = sum(n for name, n in qwen["tensors"].items() if ".layers.0.mlp.switch_mlp." in name)
    assert r["bytes_per_expert"] == layer0 // 8
    assert r["mib_per_token"] == round(sum(per_layer.values()) * 2 / MIB, 3)
    assert (r["architecture"], r["num_experts"], r["trained_k"], r["moe_layers"]) == (
        "qwen3_moe",
        8,
        2,
        3,
    )
    assert r["supported"] is True and r["reason"] is None and r["source"] == "hub"
    blobs = cache / "models--test-org--Qwen-Tiny-4bit" / "blobs"
    assert r["size_bytes"] == sum(f.stat().st_size for f in blobs.iterdir())
    assert len(r["revision"]) == 40

    n = rows["test-org/Nemo-Tiny-4bit"]
    assert n["architecture"] == "nemotron_h" and n["moe_layers"] == 3
    assert n["bytes_per_expert"] == nemo["bytes_per_expert"][1]
    assert n["bytes_per_expert"] == registry.expert_bytes_from_config(nemo_cfg, 4, 32)

    assert rows["q35"]["architecture"] == "qwen3_5_moe" and rows["q35"]["supported"]
    assert rows["q35"]["bytes_per_expert"] == q35["bytes_per_expert"][0]
    assert rows["raw"]["supported"] is False and "unquantized" in rows["raw"]["reason"]
    assert rows["raw"]["bytes_per_expert"] == raw["bytes_per_expert"][0]


def test_incomplete_hub_snapshot_is_listed_as_not_usable(tmp_path: Path) -> None:
    cache = tmp_path / "hub"
    write_checkpoint(tmp_path / "src", fake_config(), shards=3)
    add_to_hub_cache(
        cache, "test-org/Partial", tmp_path / "src", skip=("model-00003-of-00003.safetensors",)
    )
    [entry] = scan_models(cache_dir=cache)
    assert entry.name == "test-org/Partial" and not entry.supported
    assert "incomplete" in entry.reason and "ssdmoe models fetch test-org/Partial" in entry.reason


def test_demo_model_and_extra_dirs_are_listed(demo_model: Path, tmp_path: Path) -> None:
    """The real demo checkpoint (mlx-lm quantized) is found in the demo folder and measured."""

    from ssdmoe_tui.paths import demo_model_dir

    ensure_demo_model(demo_model_dir())
    extra = tmp_path / "one-model"
    write_checkpoint(extra, fake_config("nemotron_h", layers=4))
    entries = scan_models([extra], cache_dir=tmp_path / "no-hub")
    by_name = {e.name: e for e in entries}
    assert set(by_name) == {"demo", "one-model"}
    demo = by_name["demo"]
    config = read_config(demo_model_dir())
    q = registry.quantization(config)
    assert demo.supported, demo.reason
    assert demo.bytes_per_expert == registry.expert_bytes_from_config(config, q.bits, q.group_size)


def test_real_mlx_lm_checkpoints_match_engine_index(checkpoints) -> None:
    """mlx-lm-quantized checkpoints of each supported architecture: supported, and the
    header measurement equals the config arithmetic and the engine's own expert index."""
    from ssdmoe_tui.engine.experts.index import build_index

    for arch in registry.SUPPORTED_ARCHITECTURES:
        folder = checkpoints(arch)
        config = read_config(folder)
        info = registry.check_supported(config, folder)
        measured = measure_experts(folder)
        assert measured.bytes_per_expert == info.expert_bytes, arch
        assert measured.bytes_per_expert == build_index(folder).expert_bytes, arch


def test_table_output(tmp_path: Path, capsys, monkeypatch) -> None:
    import argparse

    from huggingface_hub import constants

    from ssdmoe_tui.commands.models import run_list

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "no-hub"))
    folder = tmp_path / "m"
    write_checkpoint(folder, fake_config())
    monkeypatch.setenv("SSDMOE_MODEL_DIRS", str(folder))
    run_list(argparse.Namespace(json=False, dir=[]))
    out = capsys.readouterr().out.splitlines()
    assert out[0].split() == [
        "MODEL",
        "ARCH",
        "SIZE",
        "EXPERTS",
        "K",
        "EXPERT",
        "MiB/TOKEN",
        "SUPPORTED",
        "PATH",
    ]
    # Issue 33 N18: each row says where the model is (the demo's folder too).
    rows = [line.split() for line in out[1:] if line.startswith("m ")]
    assert [row[-2:] for row in rows] == [["yes", str(folder)]], out


def test_models_dir_typo_is_said(tmp_path: Path, capsys, monkeypatch) -> None:
    """`models --dir TYPO` says the folder does not exist instead of listing nothing."""
    from ssdmoe_tui.cli import main

    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "no-hub"))
    assert main(["models", "--json", "--dir", str(tmp_path / "typo")]) == 0
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"ssdmoe: note: --dir {tmp_path / 'typo'}: no such folder"]


def test_models_lists_the_demo_with_its_folder(tmp_path: Path, capsys, monkeypatch) -> None:
    """Issue 33 N18: `ssdmoe models` printed `demo` without saying where it is."""
    from ssdmoe_tui import paths
    from ssdmoe_tui.cli import main
    from ssdmoe_tui.models.demo import ensure_demo_model

    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "no-hub"))
    demo = ensure_demo_model(paths.demo_model_dir())
    assert main(["models"]) == 0
    [row] = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("demo ")]
    assert row.split()[-1] in (str(demo), "~" + str(demo)[len(str(Path.home())) :]), row

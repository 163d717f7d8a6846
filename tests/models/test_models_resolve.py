"""`--model` resolution: local folders, repo ids in a hand-built hub cache, clear misses."""

from __future__ import annotations

import os
import socket
import subprocess
from pathlib import Path

import pytest

from ssdmoe_tui.errors import BadValueError, ModelError, UnsupportedModelError
from ssdmoe_tui.models.resolve import parse_spec, resolve_model
from tests.helpers.cli_runner import run_cli
from tests.helpers.fakes import add_to_hub_cache, fake_config, write_checkpoint

ROOT = Path(__file__).resolve().parents[2]
REPO = "test-org/Tiny-MoE-4bit"


@pytest.fixture
def hub(tmp_path: Path) -> tuple[Path, Path, Path]:
    """(cache, snapshot, source folder) for REPO in a hand-made hub cache."""
    src = tmp_path / "src"
    write_checkpoint(src, fake_config())
    cache = tmp_path / "hub"
    snap = add_to_hub_cache(cache, REPO, src, refs=("main", "v1"))
    return cache, snap, src


def _cli(args: list[str], env: dict[str, str], timeout: float = 60) -> subprocess.CompletedProcess:
    return run_cli(args, env=env, drop_env=("HF_",), timeout=timeout)


def test_local_folder(tmp_path: Path) -> None:
    folder = tmp_path / "my-moe"
    write_checkpoint(folder, fake_config("nemotron_h", layers=4))
    assert resolve_model(str(folder)) == folder
    assert resolve_model(str(folder / "config.json")) == folder
    os.chdir(tmp_path)
    assert resolve_model("my-moe") == folder  # a relative folder wins over a repo id


def test_repo_id_found_in_hub_cache(hub) -> None:
    cache, snap, _ = hub
    assert resolve_model(REPO, cache_dir=cache) == snap
    assert resolve_model(f"{REPO}@v1", cache_dir=cache) == snap
    assert resolve_model(f"{REPO}@{snap.name}", cache_dir=cache) == snap
    # The files are the hub's symlinks into blobs/.
    assert (snap / "config.json").is_symlink()


def test_repo_id_found_through_hf_env_in_cli(hub, tmp_path: Path) -> None:
    """HF_HUB_CACHE and HF_HUB_OFFLINE reach huggingface_hub: the CLI prints the snapshot."""
    cache, snap, _ = hub
    env = {"HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": "1", "SSDMOE_HOME": str(tmp_path)}
    r = _cli(["models", "fetch", REPO], env)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == str(snap)
    # HF_HOME alone works too (the hub cache is $HF_HOME/hub).
    home = tmp_path / "hf-home"
    (home).mkdir()
    os.symlink(cache, home / "hub")
    r = _cli(["models", "fetch", REPO], {"HF_HOME": str(home), "HF_HUB_OFFLINE": "1"})
    assert r.returncode == 0, r.stderr
    assert Path(r.stdout.strip()).name == snap.name


def test_missing_repo_offline_is_one_clear_line(tmp_path: Path) -> None:
    env = {
        "HF_HUB_CACHE": str(tmp_path / "empty-hub"),
        "HF_HUB_OFFLINE": "1",
        "SSDMOE_HOME": str(tmp_path),
    }
    missing = "mlx-community/Qwen3-30B-A3B-4bit"
    r = _cli(["models", "fetch", missing], env)
    assert r.returncode != 0
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert "Traceback" not in r.stderr
    assert missing in lines[0] and "HF_HUB_OFFLINE=1" in lines[0]
    assert f"ssdmoe models fetch {missing}" in lines[0]
    assert str(tmp_path / "empty-hub") in lines[0]
    assert "copy the model folder" in lines[0]
    # A revision is named as given.
    r2 = _cli(["models", "fetch", f"{missing}@main"], env)
    assert len(r2.stderr.strip().splitlines()) == 1 and "@main" in r2.stderr


def test_missing_repo_without_network_is_one_clear_line(tmp_path: Path) -> None:
    with socket.socket() as s:  # a port nobody listens on: connection refused
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {
        "HF_HUB_CACHE": str(tmp_path / "hub"),
        "HF_ENDPOINT": f"http://127.0.0.1:{port}",
        "SSDMOE_HOME": str(tmp_path),
    }
    r = _cli(["models", "fetch", REPO], env)
    assert r.returncode != 0
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    assert REPO in lines[0] and "unreachable" in lines[0]
    # `models fetch` is what failed: the way out is a copied folder, not `models fetch` again
    assert "models fetch" not in lines[0]
    assert "copy the model folder" in lines[0] and "ssdmoe --model /path/to/folder" in lines[0]


def test_incomplete_snapshot_offline_names_the_gap(tmp_path: Path, monkeypatch) -> None:
    src = tmp_path / "src"
    write_checkpoint(src, fake_config(), shards=2)
    cache = tmp_path / "hub"
    add_to_hub_cache(cache, REPO, src, skip=("model-00002-of-00002.safetensors",))
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(ModelError) as e:
        resolve_model(REPO, cache_dir=cache)
    msg = str(e.value)
    assert "only partly" in msg and "model-00002-of-00002.safetensors" in msg
    assert f"ssdmoe models fetch {REPO}" in msg


def test_unsupported_local_models_are_refused(tmp_path: Path) -> None:
    gguf = tmp_path / "model-Q4_K_M.gguf"
    gguf.write_bytes(b"GGUF")
    with pytest.raises(UnsupportedModelError, match="GGUF"):
        resolve_model(str(gguf))
    dense = tmp_path / "dense"
    dense.mkdir()
    (dense / "config.json").write_text(
        '{"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2}'
    )
    with pytest.raises(UnsupportedModelError, match="dense"):
        resolve_model(str(dense))
    raw = tmp_path / "raw"
    write_checkpoint(raw, fake_config(quantized=False))
    with pytest.raises(UnsupportedModelError, match="unquantized"):
        resolve_model(str(raw))
    assert resolve_model(str(raw), check=False) == raw


def test_bad_specs() -> None:
    with pytest.raises(ModelError, match="no such file or folder"):
        resolve_model("./does/not/exist")
    with pytest.raises(BadValueError, match="not a folder and not a Hub repo id"):
        parse_spec("not a repo!!")
    with pytest.raises(BadValueError, match="empty revision"):
        parse_spec("org/name@")
    spec = parse_spec("org/name@refs/pr/1")
    assert (spec.repo_id, spec.revision) == ("org/name", "refs/pr/1")


def test_empty_spec_is_the_demo_model() -> None:
    """None / "" mean the demo model: the `ensure_demo_model` folder (the shipped trained
    demo, copied on first use), checked."""
    from ssdmoe_tui.paths import demo_model_dir

    assert resolve_model(None) == demo_model_dir()
    assert resolve_model("") == demo_model_dir()

"""Bad input becomes one line naming the file, tensor or value: no traceback."""

from __future__ import annotations

import json
import shutil
import struct
import subprocess
from pathlib import Path

import pytest

from ssdmoe_tui.engine.experts.index import build_index
from tests.helpers import cli_runner


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return cli_runner.run_cli(args)


def assert_one_line_error(proc: subprocess.CompletedProcess, *needles: str) -> None:
    assert proc.returncode != 0
    err = proc.stderr.strip()
    assert "Traceback" not in err, err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1, err
    for n in needles:
        assert n in lines[0], (n, lines[0])


@pytest.fixture
def broken(checkpoints, tmp_path):
    def copy() -> Path:
        dst = tmp_path / "model"
        shutil.copytree(checkpoints("qwen3_moe"), dst)
        return dst

    return copy


def shard_with_experts(model: Path) -> Path:
    index = build_index(model)
    return model / index.layers[0].components[0].shard


def test_missing_shard(broken):
    m = broken()
    shard = shard_with_experts(m)
    shard.unlink()
    assert_one_line_error(
        run_cli("generate", "--model", str(m), "--prompt", "hi"), "missing", shard.name
    )


def test_truncated_shard(broken):
    m = broken()
    shard = shard_with_experts(m)
    with open(shard, "r+b") as f:
        f.truncate(shard.stat().st_size - 1000)
    assert_one_line_error(run_cli("index", "--model", str(m)), shard.name, "truncated")


def test_header_not_json(broken):
    m = broken()
    shard = shard_with_experts(m)
    data = bytearray(shard.read_bytes())
    (n,) = struct.unpack("<Q", data[:8])
    data[8:12] = b"{{{{"
    shard.write_bytes(bytes(data))
    assert_one_line_error(run_cli("index", "--model", str(m)), shard.name, "header")


def test_dtype_shape_mismatch(broken):
    m = broken()
    shard = shard_with_experts(m)
    data = shard.read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + n])
    name = next(k for k in header if "switch_mlp" in k and k.endswith(".scales"))
    header[name]["dtype"] = "F32"  # twice the bytes the offsets hold
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (n - len(blob))
    assert len(blob) == n
    shard.write_bytes(data[:8] + blob + data[8 + n :])
    assert_one_line_error(run_cli("index", "--model", str(m)), shard.name, name)


def test_unsupported_architecture(broken):
    m = broken()
    cfg = json.loads((m / "config.json").read_text())
    cfg["model_type"] = "llama"
    (m / "config.json").write_text(json.dumps(cfg))
    assert_one_line_error(
        run_cli("generate", "--model", str(m), "--prompt", "hi"), "llama", "supported"
    )


def test_dense_model_rejected(tmp_path):
    import mlx.core as mx

    m = tmp_path / "dense"
    m.mkdir()
    (m / "config.json").write_text(json.dumps({"model_type": "qwen3_moe"}))
    mx.save_safetensors(
        str(m / "model.safetensors"), {"model.embed_tokens.weight": mx.zeros((4, 4))}
    )
    assert_one_line_error(run_cli("index", "--model", str(m)), "dense")


@pytest.mark.parametrize(
    ("k", "needles"), [("0", ("--k", "at least 1, got 0")), ("17", ("K=17", "1..16"))]
)
def test_k_out_of_range(checkpoints, k, needles):
    m = checkpoints("qwen3_moe")
    assert_one_line_error(
        run_cli("generate", "--model", str(m), "--prompt", "hi", "--k", k), *needles
    )


def test_missing_model_folder(tmp_path):
    assert_one_line_error(
        run_cli("generate", "--model", str(tmp_path / "nope"), "--prompt", "hi"), "nope"
    )

"""Supported-model checks and the expert arithmetic, against real configs and real headers."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from ssdmoe_tui.errors import ModelError, UnsupportedModelError
from ssdmoe_tui.models import registry
from ssdmoe_tui.models.scan import measure_experts
from tests.helpers.fakes import fake_config, write_checkpoint
from tests.helpers.fixture_paths import MODELS

ROOT = Path(__file__).resolve().parents[2]
SHARED = MODELS
REAL_CONFIGS = {
    "qwen3.5-35b-a3b": SHARED / "qwen3.5-35b-a3b" / "config.reconstructed.json",
    "nemotron-3-nano-30b-a3b": SHARED / "nemotron-3-nano-30b-a3b" / "config.json",
    "qwen3-30b-a3b": SHARED / "qwen3-30b-a3b" / "config.json",
    "mixtral-8x7b-v0.1": SHARED / "mixtral-8x7b-v0.1" / "config.json",
    "gpt-oss-20b": SHARED / "gpt-oss-20b" / "config.json",
}


def _real(name: str) -> dict:
    return json.loads(REAL_CONFIGS[name].read_text())


def _one_line(exc: BaseException) -> str:
    text = str(exc)
    assert "\n" not in text and len(text) <= 300, text
    return text


# --------------------------------------------------------------------------- real shapes


def _sparse_checkpoint(folder: Path, config: dict, bits: int = 4, group: int = 64) -> None:
    """Every MoE layer's switch_mlp tensors at full real shape, in a sparse safetensors file.

    Shapes and dtypes come from `mx.quantize` of one real-size expert matrix, so this checks
    the arithmetic against MLX itself; the data section is a hole (zeros), which keeps a
    multi-GB checkpoint at a few KiB on disk.
    """
    import mlx.core as mx

    geo = registry.moe_geometry(config)
    assert geo is not None
    h, i = geo.hidden_size, geo.expert_intermediate
    parts = {}
    for proj in geo.projections:
        rows, cols = (h, i) if proj in ("down_proj", "fc2") else (i, h)
        wq, scales, biases = mx.quantize(
            mx.zeros((rows, cols), dtype=mx.bfloat16), group_size=group, bits=bits
        )
        parts[proj] = {"weight": wq, "scales": scales, "biases": biases}
    dt = {mx.uint32: ("U32", 4), mx.bfloat16: ("BF16", 2)}
    header, offset = {}, 0
    prefix = "backbone.layers" if geo.model_type == "nemotron_h" else "model.layers"
    block = "mixer" if geo.model_type == "nemotron_h" else "mlp"
    for layer in geo.moe_layers:
        for proj, arrays in parts.items():
            for part, arr in arrays.items():
                code, size = dt[arr.dtype]
                shape = [geo.num_experts, *arr.shape]
                n = size * geo.num_experts * arr.size
                name = f"{prefix}.{layer}.{block}.switch_mlp.{proj}.{part}"
                header[name] = {"dtype": code, "shape": shape, "data_offsets": [offset, offset + n]}
                offset += n
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    folder.mkdir(parents=True)
    path = folder / "model.safetensors"
    with open(path, "wb") as f:
        f.write(len(raw).to_bytes(8, "little") + raw)
        f.truncate(8 + len(raw) + offset)


@pytest.mark.parametrize("name", ["qwen3.5-35b-a3b", "nemotron-3-nano-30b-a3b", "qwen3-30b-a3b"])
def test_real_config_arithmetic_matches_mlx_quantized_headers(tmp_path: Path, name: str) -> None:
    config = _real(name)
    _sparse_checkpoint(tmp_path / name, config)
    measured = measure_experts(tmp_path / name)
    geo = registry.moe_geometry(config)
    assert measured.num_experts == geo.num_experts
    assert sorted(measured.layers) == list(geo.moe_layers)
    assert measured.bytes_per_expert == registry.expert_bytes_from_config(config)
    for k in (1, 2, 4, 8, geo.trained_k):
        assert measured.mib_per_token(k) == pytest.approx(registry.mib_per_token(config, k))


def test_docs_table_matches_config_arithmetic() -> None:
    """docs/models.md states bytes per expert and MiB/token; they must be the function's."""
    text = (ROOT / "docs" / "models.md").read_text()
    rows = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 9 and cells[0].startswith("`") and cells[0].endswith("`"):
            rows[cells[0].strip("`")] = cells
    assert set(rows) == set(REAL_CONFIGS)
    for name, cells in rows.items():
        config = _real(name)
        assert int(cells[5].replace(",", "")) == registry.expert_bytes_from_config(config), name
        ks = [int(k) for k in re.findall(r"K=(\d+)", text.split("| config |")[1].split("\n")[0])]
        for k, cell in zip(ks, cells[6 : 6 + len(ks)], strict=True):
            assert float(cell.replace(",", "")) == pytest.approx(
                registry.mib_per_token(config, k), abs=0.05
            ), (name, k)
        trained = float(cells[6 + len(ks)].replace(",", ""))
        assert trained == pytest.approx(registry.mib_per_token(config), abs=0.05)  # trained K


# --------------------------------------------------------------------------- check_supported


def test_supported_real_qwen35_flat_and_nested() -> None:
    flat = _real("qwen3.5-35b-a3b")
    info = registry.check_supported(flat)
    assert info.architecture == "qwen3_5_moe"
    assert (info.geometry.num_experts, info.geometry.trained_k) == (256, 8)
    assert len(info.geometry.moe_layers) == 40
    # The mlx-community checkpoint nests the language model under text_config.
    text = {k: v for k, v in flat.items() if not k.startswith("quantization")}
    nested = {
        "model_type": "qwen3_5_moe",
        "text_config": text | {"model_type": "qwen3_5_moe_text"},
        "vision_config": {"depth": 27},
        "quantization": flat["quantization"],
    }
    info2 = registry.check_supported(nested)
    assert info2.geometry == info.geometry
    assert info2.expert_bytes == info.expert_bytes == registry.expert_bytes_from_config(flat)


def test_supported_nemotron_pattern_gives_moe_layers() -> None:
    config = _real("nemotron-3-nano-30b-a3b") | {"quantization": {"bits": 4, "group_size": 64}}
    info = registry.check_supported(config)
    pattern = config["hybrid_override_pattern"]
    assert info.geometry.moe_layers == tuple(i for i, c in enumerate(pattern) if c == "E")
    assert info.geometry.projections == ("fc1", "fc2")
    assert info.geometry.trained_k == config["num_experts_per_tok"]


def test_dense_model_is_refused_with_closest_option() -> None:
    dense = {
        "model_type": "qwen3",
        "hidden_size": 1024,
        "num_hidden_layers": 28,
        "intermediate_size": 3072,
        "quantization": {"bits": 4, "group_size": 64},
    }
    with pytest.raises(UnsupportedModelError) as e:
        registry.check_supported(dense)
    msg = _one_line(e.value)
    assert "dense" in msg and "mlx-community/Qwen3-30B-A3B-4bit" in msg


def test_unquantized_original_checkpoint_is_refused() -> None:
    with pytest.raises(UnsupportedModelError) as e:
        registry.check_supported(_real("qwen3-30b-a3b"))
    msg = _one_line(e.value)
    assert "unquantized" in msg and "mlx-community/Qwen3-30B-A3B-4bit" in msg
    with pytest.raises(UnsupportedModelError) as e:
        registry.check_supported(_real("nemotron-3-nano-30b-a3b"))
    assert "mlx-community/NVIDIA-Nemotron-3-Nano-30B-A3B-4bit" in _one_line(e.value)


def test_other_moe_architectures_are_refused() -> None:
    gpt = registry.check_supported(_real("gpt-oss-20b"))  # its MXFP4 quantization_config
    assert gpt.architecture == "gpt_oss" and gpt.quantization.mode == "mxfp4"
    assert gpt.geometry.bias  # the experts' own biases count in its bytes
    unknown = {"model_type": "some_moe", "num_experts": 8, "num_experts_per_tok": 2,
               "hidden_size": 64, "num_hidden_layers": 2, "moe_intermediate_size": 32}  # fmt: skip
    with pytest.raises(UnsupportedModelError) as e:
        registry.check_supported(unknown)
    assert "some_moe" in _one_line(e.value) and "not supported" in str(e.value)
    mixtral = registry.check_supported(
        _real("mixtral-8x7b-v0.1") | {"quantization": {"bits": 4, "group_size": 64}}
    )
    assert mixtral is not None  # the engine streams Mixtral (tests/engine/test_engine_exact.py)


def test_gguf_folder_is_refused(tmp_path: Path) -> None:
    (tmp_path / "Qwen3-30B-A3B-Q4_K_M.gguf").write_bytes(b"GGUF\x03\x00\x00\x00")
    with pytest.raises(UnsupportedModelError) as e:
        registry.check_supported({"model_type": "qwen3_moe"}, tmp_path)
    msg = _one_line(e.value)
    assert "GGUF" in msg and "Qwen3-30B-A3B-Q4_K_M.gguf" in msg and "mlx-community/" in msg


def test_fake_checkpoint_supported_and_headers_checked(tmp_path: Path) -> None:
    for mt in ("qwen3_moe", "qwen3_5_moe", "nemotron_h"):
        config = fake_config(mt, layers=4)
        written = write_checkpoint(tmp_path / mt, config)
        info = registry.check_supported(config, tmp_path / mt)
        assert info.architecture == mt
        measured = measure_experts(tmp_path / mt)
        assert measured.bytes_per_expert == next(iter(written["bytes_per_expert"].values()))
        assert measured.bytes_per_expert == info.expert_bytes  # fp16 scales = bf16 size


def test_per_expert_hf_layout_is_refused(tmp_path: Path) -> None:
    """Original HF layout (one tensor per expert) with an MLX config: not streamable."""
    import numpy as np
    from safetensors.numpy import save_file

    config = fake_config()
    folder = tmp_path / "m"
    folder.mkdir()
    save_file(
        {"model.layers.0.mlp.experts.0.gate_proj.weight": np.zeros((32, 64), np.float16)},
        str(folder / "model.safetensors"),
    )
    with pytest.raises(UnsupportedModelError) as e:
        registry.check_supported(config, folder)
    assert "experts.0.gate_proj" in _one_line(e.value)


def test_expert_count_mismatch_is_an_error(tmp_path: Path) -> None:
    config = fake_config(experts=4)
    write_checkpoint(tmp_path / "m", config)
    config["num_experts"] = 8
    with pytest.raises(ModelError) as e:
        registry.check_supported(config, tmp_path / "m")
    assert "4 experts" in _one_line(e.value)


def test_corrupt_header_names_the_file(tmp_path: Path) -> None:
    config = fake_config()
    write_checkpoint(tmp_path / "m", config, shards=1)
    shard = next((tmp_path / "m").glob("*.safetensors"))
    shard.write_bytes(b"\xff" * 16)
    with pytest.raises(ModelError) as e:
        registry.check_supported(config, tmp_path / "m")
    assert shard.name in _one_line(e.value)


def test_only_the_main_layer_stack_is_measured(tmp_path: Path) -> None:
    """A multi-token-prediction head with its own switch_mlp layer does not count."""
    import numpy as np
    from safetensors.numpy import save_file

    folder = tmp_path / "m"
    written = write_checkpoint(folder, fake_config("qwen3_5_moe", layers=3, experts=4))
    before = measure_experts(folder)
    mtp = {
        f"language_model.mtp.layers.0.mlp.switch_mlp.{p}.{part}": np.zeros((4, 8, 8), np.uint32)
        for p in ("gate_proj", "up_proj", "down_proj")
        for part in ("weight", "scales", "biases")
    }
    save_file(mtp, str(folder / "model-mtp.safetensors"))
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    index["weight_map"] |= dict.fromkeys(mtp, "model-mtp.safetensors")
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    after = measure_experts(folder)
    assert sorted(after.layers) == sorted(before.layers) == [0, 1, 2]
    assert after.bytes_per_expert == before.bytes_per_expert == written["bytes_per_expert"][0]


def test_download_patterns_are_mlx_lms() -> None:
    """Same patterns as mlx-lm, so either tool's cache entry is complete for the other."""
    from mlx_lm.utils import DEFAULT_ALLOW_PATTERNS

    from ssdmoe_tui.models.resolve import ALLOW_PATTERNS

    assert ALLOW_PATTERNS == DEFAULT_ALLOW_PATTERNS

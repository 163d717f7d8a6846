"""Real model shapes: checkpoints built from the real config.json files in tests/fixtures/models.

Depth is cut to one MoE layer (plus one layer of each other kind the architecture
needs) and the vocabulary to 2048 (both only shrink the resident
part): every expert keeps its real width, count, quantization (4-bit, group 64, routers
at 8 bits), so the index and the streamed compute see real expert geometry.
"""

from __future__ import annotations

import json
from pathlib import Path

import mlx.core as mx
import pytest
from mlx_lm import load, stream_generate

from ssdmoe_tui.engine.experts.cache import slot_memory_bytes
from ssdmoe_tui.engine.experts.index import build_index
from ssdmoe_tui.engine.model.loader import cast_model, load_streamed
from ssdmoe_tui.engine.run.runner import Runner
from ssdmoe_tui.models.demo import write_checkpoint
from ssdmoe_tui.models.registry import expert_bytes_from_config
from tests.helpers.fixture_paths import MODELS

CASES = {
    "qwen3_moe": ("qwen3-30b-a3b/config.json", 128, 8),
    "qwen3_5_moe": ("qwen3.5-35b-a3b/config.reconstructed.json", 256, 8),
    "nemotron_h": ("nemotron-3-nano-30b-a3b/config.json", 128, 6),
}


def reduced(config: dict) -> dict:
    cfg = json.loads(json.dumps(config))
    cfg.pop("quantization", None)
    cfg.pop("quantization_config", None)
    text = cfg.get("text_config", cfg)
    text["vocab_size"] = 2048
    if "hybrid_override_pattern" in text:
        text["hybrid_override_pattern"] = "M*E"  # one Mamba, one attention, one MoE layer
        text["num_hidden_layers"] = 3
    elif "full_attention_interval" in text:  # one linear-attention + one full-attention layer
        text["num_hidden_layers"] = 2
        text["full_attention_interval"] = 2
        text["layer_types"] = ["linear_attention", "full_attention"]
    else:
        text["num_hidden_layers"] = 1
    return cfg


@pytest.fixture(scope="module")
def real_checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("real")
    built = {}

    def get(arch: str) -> tuple[Path, dict]:
        if arch not in built:
            rel, _, _ = CASES[arch]
            config = json.loads((MODELS / rel).read_text())
            out = root / arch
            write_checkpoint(reduced(config), out, group_size=64, max_shard_bytes=256 << 20)
            built[arch] = (out, config)
        return built[arch]

    return get


@pytest.mark.parametrize("arch", list(CASES))
def test_real_shape_index_and_exact_generation(real_checkpoints, arch):
    path, config = real_checkpoints(arch)
    _, experts, trained_k = CASES[arch]
    index = build_index(path)
    assert index.num_experts == experts
    assert index.expert_bytes == expert_bytes_from_config(config)
    qcfg = json.loads((path / "config.json").read_text())["quantization"]
    if arch != "nemotron_h":  # nemotron's router is a plain weight, never quantized by mlx-lm
        assert any(isinstance(v, dict) and v.get("bits") == 8 for v in qcfg.values()), (
            "router at 8 bits"
        )

    sm = load_streamed(path, expert_cache="1")
    assert sm.trained_k == trained_k
    runner = Runner(sm)
    prompt = list(range(5, 37))
    res = runner.generate(prompt, max_tokens=6)
    assert res.stats.requested_bytes == res.stats.misses * index.expert_bytes

    model, tok = load(str(path))
    cast_model(model, mx.float32)
    ref = [r.token for r in stream_generate(model, tok, mx.array(prompt), max_tokens=6)]
    assert res.tokens == ref


@pytest.mark.parametrize("arch", list(CASES))
@pytest.mark.parametrize("mode", ["full", "compact"])
def test_real_shape_pipelined_layer_is_exact(
    real_checkpoints, monkeypatch, tmp_path_factory, arch, mode
):
    """The pipelined layer (hits queued before the misses are read) at real expert
    widths, with both partial-call shapes, on K + 4 slots: layers have hits and misses
    together (nemotron_h's builder leaves its router zero: random here)."""
    from ssdmoe_tui.engine.model.streamed import PIPELINE_ENV
    from tests.engine.test_pipeline import _routed

    monkeypatch.setenv(PIPELINE_ENV, mode)
    path, _ = real_checkpoints(arch)
    if arch == "nemotron_h":
        path = _routed(path, tmp_path_factory.getbasetemp() / "real-nemotron_h-routed")
    index = build_index(path)
    # K + 4 slots: each token evicts some of the last ones' experts and keeps others
    slots = CASES[arch][2] + 4
    sm = load_streamed(path, expert_cache=str(slots * slot_memory_bytes(index, mx.float32)))
    runner = Runner(sm)
    prompt = list(range(5, 37))
    res = runner.generate(prompt, max_tokens=8)
    assert sm.times.pipelined_calls > 0, sm.cache.counters
    model, tok = load(str(path))
    cast_model(model, mx.float32)
    ref = [r.token for r in stream_generate(model, tok, mx.array(prompt), max_tokens=8)]
    assert res.tokens == ref
    sm.close()

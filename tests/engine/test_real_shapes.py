"""Real model shapes: checkpoints built from the real config.json files in tests/fixtures/models.

Depth is cut to one MoE layer (plus one layer of each other kind the architecture
needs) and the vocabulary to 2048 (both only shrink the resident
part): every expert keeps its real width, count, quantization (4-bit, group 64, routers
at 8 bits), so the index and the streamed compute see real expert geometry.
"""

from __future__ import annotations

import json

import mlx.core as mx
import pytest
from mlx_lm import load, stream_generate

from ssdmoe_tui.engine.experts.cache import slot_memory_bytes
from ssdmoe_tui.engine.experts.index import build_index
from ssdmoe_tui.engine.model.loader import cast_model, load_streamed
from ssdmoe_tui.engine.run.runner import Runner
from ssdmoe_tui.models.registry import expert_bytes_from_config
from tests.helpers.real_shapes import CASES, routed

# qwen3_moe's real shape runs in `make test`; the other two (a 256-expert and a hybrid
# checkpoint, the suite's two longest builds) in `make test-slow`.
ARCHS = [pytest.param(a, marks=pytest.mark.slow) if a != "qwen3_moe" else a for a in CASES]


@pytest.mark.parametrize("arch", ARCHS)
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


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("mode", ["full", "compact"])
def test_real_shape_pipelined_layer_is_exact(
    real_checkpoints, monkeypatch, tmp_path_factory, arch, mode
):
    """The pipelined layer (hits queued before the misses are read) at real expert
    widths, with both partial-call shapes, on K + 4 slots: layers have hits and misses
    together (nemotron_h's builder leaves its router zero: random here)."""
    from ssdmoe_tui.engine.model.streamed import PIPELINE_ENV

    monkeypatch.setenv(PIPELINE_ENV, mode)
    path, _ = real_checkpoints(arch)
    if arch == "nemotron_h":
        path = routed(path, tmp_path_factory.getbasetemp() / "real-nemotron_h-routed")
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

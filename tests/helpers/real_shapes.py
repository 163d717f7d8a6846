"""Real model shapes: checkpoints built from the real config.json files in
tests/fixtures/models, cut in depth (one MoE layer, plus one layer of each other kind the
architecture needs) and vocabulary (2048), with every expert at its real width, count and
quantization (4-bit, group 64, routers at 8 bits). Building one takes tens of seconds:
tests/conftest.py's `real_checkpoints` builds each once per session, for every module."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import mlx.core as mx

from ssdmoe_tui.models.demo import write_checkpoint
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


def build_real(arch: str, out: Path) -> tuple[Path, dict]:
    """`arch`'s reduced real-shape checkpoint in `out`, and the real config it came from."""
    rel, _, _ = CASES[arch]
    config = json.loads((MODELS / rel).read_text())
    write_checkpoint(reduced(config), out, group_size=64, max_shard_bytes=256 << 20)
    return out, config


def routed(path: Path, out: Path) -> Path:
    """`path` with random router weights where the builder left them zero (nemotron_h's
    `mixer.gate.weight`: every token then routes to the same experts, and no layer ever
    has hits and misses together). Both engines load the edited copy."""
    if out.exists():
        return out
    shutil.copytree(path, out)
    for f in sorted(out.glob("*.safetensors")):
        weights, meta = mx.load(str(f), return_metadata=True)
        gates = [k for k in weights if k.endswith("mixer.gate.weight")]
        for i, k in enumerate(gates):
            w = weights[k]
            weights[k] = (mx.random.normal(w.shape, key=mx.random.key(i)) * 0.5).astype(w.dtype)
        if gates:
            mx.save_safetensors(str(f), weights, metadata=meta)
    return out

#!/usr/bin/env python3
"""How big a KV checkpoint is, from a model's config.json (no weights needed): the
figures of docs/sessions.md "Sizes".

    python scripts/kv_sizes.py                    # the real configs in tests/fixtures/models
    python scripts/kv_sizes.py CONFIG.json ...

Attention layers store K and V for every token: 2 x kv_heads x head_dim x dtype bytes
per layer per token. Recurrent layers (Qwen3.5 gated-delta linear attention, Mamba-2)
hold a fixed state whatever the context length: a convolution window in the
activation dtype plus an SSM state that mlx-lm keeps in float32. Sliding-window
layers (gpt-oss) hold at most `sliding_window` tokens. The shapes follow mlx-lm's
cache code; tests/sessions/test_sessions_tiny.py checks the formula against real caches
of tiny models. (The program itself never needs it: a checkpoint's size is its file's.)
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

F32 = 4


@dataclass(frozen=True)
class KVFootprint:
    model_type: str
    attention_layers: int  # full attention: grow with the context
    recurrent_layers: int  # fixed-size state
    windowed_layers: int  # sliding window attention
    per_token_bytes: int  # all full-attention layers, one token
    fixed_bytes: int  # all recurrent state
    window: int  # tokens a windowed layer keeps
    window_per_token_bytes: int  # all windowed layers, one token

    def bytes_for(self, n_tokens: int) -> int:
        """Tensor bytes of a checkpoint covering `n_tokens` (the file adds a small header)."""
        windowed = self.window_per_token_bytes * min(n_tokens, self.window)
        return self.per_token_bytes * n_tokens + self.fixed_bytes + windowed

    @property
    def hybrid(self) -> bool:
        return self.recurrent_layers > 0


def _text_config(config: dict[str, Any]) -> dict[str, Any]:
    inner = config.get("text_config")
    return {**config, **inner} if isinstance(inner, dict) else config


def _kv_token_bytes(cfg: dict[str, Any], dtype_bytes: int) -> int:
    heads = cfg["num_attention_heads"]
    kv_heads = cfg.get("num_key_value_heads") or heads
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // heads
    return 2 * kv_heads * head_dim * dtype_bytes


def kv_footprint(config: dict[str, Any], dtype_bytes: int = 2) -> KVFootprint:
    """Checkpoint size parameters for a config; `dtype_bytes` is the activation dtype
    (2 for bfloat16/float16 on a GPU, 4 for float32 on CPU)."""
    cfg = _text_config(config)
    mtype = str(cfg.get("model_type", ""))
    layers = int(cfg["num_hidden_layers"])
    kv = _kv_token_bytes(cfg, dtype_bytes)

    if mtype.startswith(("qwen3_5", "qwen3_next")):
        interval = int(cfg.get("full_attention_interval", 4))
        full = sum(1 for i in range(layers) if (i + 1) % interval == 0)
        linear = layers - full
        hk, dk = cfg["linear_num_key_heads"], cfg["linear_key_head_dim"]
        hv, dv = cfg["linear_num_value_heads"], cfg["linear_value_head_dim"]
        conv_dim = 2 * hk * dk + hv * dv
        conv = (cfg["linear_conv_kernel_dim"] - 1) * conv_dim * dtype_bytes
        state = hv * dv * dk * F32
        return KVFootprint(mtype, full, linear, 0, full * kv, linear * (conv + state), 0, 0)

    if mtype == "nemotron_h":
        pattern = cfg["hybrid_override_pattern"]
        attn = sum(1 for c in pattern if c == "*")
        mamba = sum(1 for c in pattern if c == "M")
        heads, head_dim = cfg["mamba_num_heads"], cfg["mamba_head_dim"]
        conv_dim = heads * head_dim + 2 * cfg["n_groups"] * cfg["ssm_state_size"]
        conv = (cfg["conv_kernel"] - 1) * conv_dim * dtype_bytes
        state = heads * head_dim * cfg["ssm_state_size"] * F32
        return KVFootprint(mtype, attn, mamba, 0, attn * kv, mamba * (conv + state), 0, 0)

    types = cfg.get("layer_types")
    if mtype == "gpt_oss" and isinstance(types, list):
        windowed = sum(1 for t in types if t == "sliding_attention")
        full = len(types) - windowed
        window = int(cfg.get("sliding_window") or 128)
        return KVFootprint(mtype, full, 0, windowed, full * kv, 0, window, windowed * kv)

    return KVFootprint(mtype, layers, 0, 0, layers * kv, 0, 0, 0)


def _mib(n: float) -> str:
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


def main(argv: list[str]) -> int:
    """One row per config: layers, bytes per token, fixed state, a checkpoint at 1k/8k/32k
    tokens (1,000, 8,192, 32,768), in bfloat16 (the GPU's dtype; float32 on the CPU doubles the per-token part)."""
    configs = [Path(a) for a in argv] or sorted(
        (ROOT / "tests/fixtures/models").glob("*/config*.json")
    )
    print(
        "| config | type | attention | recurrent | windowed | per token | fixed | 1k | 8k | 32k |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for path in configs:
        fp = kv_footprint(json.loads(path.read_text()), dtype_bytes=2)
        sizes = " | ".join(_mib(fp.bytes_for(n)) for n in (1000, 8192, 32768))
        print(f"| {path.parent.name} | {fp.model_type} | {fp.attention_layers} | "
              f"{fp.recurrent_layers} | {fp.windowed_layers} | {fp.per_token_bytes / 1024:.0f} KiB | "
              f"{_mib(fp.fixed_bytes)} | {sizes} |")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""Tiny real mlx-lm models of each cache kind, for the session / KV tests.

Configs are mlx-lm's own unit-test configs (mlx-lm's tests/test_models.py):
qwen3_moe (KVCache only), qwen3_5_moe (ArraysCache + KVCache, linear attention),
nemotron_h (ArraysCache + KVCache, Mamba). Float32: MLX's CPU GatherMM is float32 only.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Sequence

import mlx.core as mx
from mlx_lm.models.cache import make_prompt_cache

TINY: dict[str, dict] = {
    # the qwen3_moe text_config of mlx-lm's qwen3_vl_moe test entry
    "qwen3_moe": {
        "model_type": "qwen3_moe",
        "hidden_size": 128,
        "num_hidden_layers": 4,
        "intermediate_size": 256,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "rms_norm_eps": 1e-5,
        "head_dim": 32,
        "vocab_size": 1000,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
        "num_experts_per_tok": 2,
        "num_experts": 4,
        "moe_intermediate_size": 128,
        "rope_theta": 1000,
        "max_position_embeddings": 1000,
        "tie_word_embeddings": False,
        "norm_topk_prob": True,
    },
    "qwen3_5_moe": {
        "model_type": "qwen3_5_moe",
        "hidden_size": 128,
        "num_hidden_layers": 4,
        "num_attention_heads": 8,
        "num_key_value_heads": 4,
        "vocab_size": 1000,
        "linear_num_value_heads": 4,
        "linear_num_key_heads": 4,
        "linear_key_head_dim": 32,
        "linear_value_head_dim": 32,
        "linear_conv_kernel_dim": 3,
        "num_experts": 4,
        "num_experts_per_tok": 2,
        "shared_expert_intermediate_size": 128,
        "moe_intermediate_size": 128,
        "rms_norm_eps": 1e-5,
        "head_dim": 64,
        "rope_theta": 1000.0,
        "partial_rotary_factor": 0.5,
        "max_position_embeddings": 1000,
    },
    "nemotron_h": {
        "model_type": "nemotron_h",
        "vocab_size": 1000,
        "hidden_size": 128,
        "intermediate_size": 128,
        "num_hidden_layers": 4,
        "max_position_embeddings": 1000,
        "num_attention_heads": 8,
        "num_key_value_heads": 4,
        "attention_bias": False,
        "mamba_num_heads": 8,
        "mamba_head_dim": 64,
        "mamba_proj_bias": False,
        "ssm_state_size": 128,
        "conv_kernel": 3,
        "n_groups": 4,
        "time_step_limit": [1.0, 2.0],
        "mlp_bias": False,
        "layer_norm_epsilon": 1e-4,
        "rms_norm_eps": 1e-5,
        "use_bias": True,
        "use_conv_bias": True,
        "residual_in_fp32": True,
        "hybrid_override_pattern": ["*", "M", "*", "M"],
    },
}
ARCHS = tuple(TINY)
HYBRID = {"qwen3_moe": False, "qwen3_5_moe": True, "nemotron_h": True}


@functools.cache
def tiny_model(arch: str):
    module = importlib.import_module(f"mlx_lm.models.{arch}")
    mx.random.seed(1234)
    model = module.Model(module.ModelArgs.from_dict(TINY[arch]))
    mx.eval(model.parameters())
    return model


def feed(arch: str, cache: list, tokens: Sequence[int]) -> mx.array:
    """Run `tokens` through the model, extending `cache`; returns the last logits."""
    logits = tiny_model(arch)(mx.array([list(tokens)]), cache=cache)[0, -1]
    mx.eval(logits, [c.state for c in cache])
    return logits


def filled_cache(arch: str, tokens: Sequence[int]) -> list:
    cache = make_prompt_cache(tiny_model(arch))
    feed(arch, cache, tokens)
    return cache

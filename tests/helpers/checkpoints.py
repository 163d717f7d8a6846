"""Small random-weight checkpoints in mlx-community layout, one per streamed family.

Built with mlx-lm's own classes and `quantize_model` (group size 32, the models' own
per-module overrides: routers at 8 bits), sharded, with a ChatML tokenizer. The four
first families have configs written here; every other family's tiny config is in
tests/fixtures/families/tiny_configs.json (mlx-lm's own unit-test configs, shrunk: its
`_source` says how).
"""

from __future__ import annotations

import json
from pathlib import Path

from ssdmoe_tui.models.demo import write_checkpoint

QWEN3_MOE = {
    "model_type": "qwen3_moe",
    "hidden_size": 128,
    "num_hidden_layers": 3,
    "intermediate_size": 256,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "rms_norm_eps": 1e-6,
    "vocab_size": 1024,
    "decoder_sparse_step": 1,
    "mlp_only_layers": [],
    "num_experts_per_tok": 4,
    "num_experts": 16,
    "moe_intermediate_size": 64,
    "norm_topk_prob": True,
    "rope_theta": 10000.0,
    "max_position_embeddings": 2048,
    "tie_word_embeddings": False,
}

QWEN3_5_MOE = {
    "model_type": "qwen3_5_moe",
    "hidden_size": 128,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 1024,
    "linear_num_value_heads": 4,
    "linear_num_key_heads": 4,
    "linear_key_head_dim": 32,
    "linear_value_head_dim": 32,
    "linear_conv_kernel_dim": 4,
    "full_attention_interval": 2,
    "num_experts": 16,
    "num_experts_per_tok": 4,
    "shared_expert_intermediate_size": 64,
    "moe_intermediate_size": 64,
    "rms_norm_eps": 1e-6,
    "head_dim": 32,
    "rope_theta": 10000.0,
    "partial_rotary_factor": 0.25,
    "max_position_embeddings": 2048,
    "tie_word_embeddings": False,
}

NEMOTRON_H = {
    "model_type": "nemotron_h",
    "vocab_size": 1024,
    "hidden_size": 128,
    "intermediate_size": 128,
    "num_hidden_layers": 4,
    "max_position_embeddings": 2048,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "attention_bias": False,
    "mamba_num_heads": 4,
    "mamba_head_dim": 32,
    "mamba_proj_bias": False,
    "ssm_state_size": 32,
    "conv_kernel": 4,
    "n_groups": 2,
    "time_step_limit": [0.0, float("inf")],
    "mlp_bias": False,
    "layer_norm_epsilon": 1e-5,
    "use_bias": False,
    "use_conv_bias": True,
    "hybrid_override_pattern": "MEME*E",
    "moe_intermediate_size": 64,
    "moe_shared_expert_intermediate_size": 128,
    "n_group": 1,
    "n_routed_experts": 16,
    "n_shared_experts": 1,
    "topk_group": 1,
    "num_experts_per_tok": 4,
    "norm_topk_prob": True,
    "routed_scaling_factor": 2.5,
}
NEMOTRON_H["num_hidden_layers"] = len(NEMOTRON_H["hybrid_override_pattern"])

MIXTRAL = {
    "model_type": "mixtral",
    "vocab_size": 1024,
    "hidden_size": 128,
    "intermediate_size": 64,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "num_local_experts": 8,
    "num_experts_per_tok": 2,
    "rms_norm_eps": 1e-5,
    "rope_theta": 1e6,
    "max_position_embeddings": 2048,
    "tie_word_embeddings": False,
}

TINY_CONFIGS = Path(__file__).resolve().parents[1] / "fixtures" / "families" / "tiny_configs.json"


def _family_configs() -> dict[str, dict]:
    """The tiny configs of the fixture file, without its bookkeeping keys (`_...`)."""
    table = json.loads(TINY_CONFIGS.read_text())
    return {
        mt: {k: v for k, v in c.items() if not k.startswith("_")}
        for mt, c in table.items()
        if not mt.startswith("_")
    }


ORIGINAL = ("qwen3_moe", "qwen3_5_moe", "nemotron_h", "mixtral")
CONFIGS = {
    **_family_configs(),
    "qwen3_moe": QWEN3_MOE,
    "qwen3_5_moe": QWEN3_5_MOE,
    "nemotron_h": NEMOTRON_H,
    "mixtral": MIXTRAL,
}


def build(arch: str, out: Path, seed: int = 3) -> Path:
    if (out / "config.json").exists():
        return out
    return write_checkpoint(
        CONFIGS[arch], out, seed=seed, group_size=32, max_shard_bytes=400_000,
        random_routers=arch not in ORIGINAL,  # the first four's checkpoints stay as they were
    )  # fmt: skip

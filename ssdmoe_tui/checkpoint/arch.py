"""The architecture table: which MoE models the engine streams, and what a config says.

One table (`ARCHITECTURES`) names the supported model types with their expert projections
and whether they are hybrid (recurrent state besides the KV cache); one function reads the
expert geometry (layers, experts, trained K, sizes) from a config.json; one function reads
its quantization, mlx-lm's own `quantization` block or the legacy `quantization_config`
forms that mlx-lm turns into MLX modes. `QUANT_MODES` are the MLX modes the engine streams.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from ssdmoe_tui.errors import ModelError


@dataclass(frozen=True)
class Architecture:
    model_type: str
    description: str
    projections: tuple[str, ...]  # SwitchGLU: gate/up/down; SwitchMLP: fc1/fc2
    hybrid: bool = False  # recurrent layers (ArraysCache) besides attention


#: Architectures whose experts the engine streams.
ARCHITECTURES: dict[str, Architecture] = {
    a.model_type: a
    for a in (
        Architecture(
            "qwen3_moe",
            "Qwen3 MoE (Qwen3-30B-A3B, Qwen3-235B-A22B, Qwen3-Coder-30B-A3B)",
            ("gate_proj", "up_proj", "down_proj"),
        ),
        Architecture(
            "qwen3_5_moe",
            "Qwen3.5 MoE (Qwen3.5-35B-A3B and larger); text tower of the VL checkpoint",
            ("gate_proj", "up_proj", "down_proj"),
            hybrid=True,
        ),
        Architecture(
            "nemotron_h",
            "NVIDIA Nemotron-H hybrid Mamba/attention with MoE layers (Nemotron 3 Nano)",
            ("fc1", "fc2"),
            hybrid=True,
        ),
        Architecture(
            "mixtral",
            "Mixtral (8 experts, top-2: Mixtral-8x7B, Mixtral-8x22B)",
            ("gate_proj", "up_proj", "down_proj"),
        ),
    )
}

#: MoE architectures with a known expert shape that the engine does not stream (listed
#: for arithmetic and comparison only).
OTHER_PROJECTIONS: dict[str, tuple[str, ...]] = {"gpt_oss": ("gate_proj", "up_proj", "down_proj")}

#: MLX quantization modes the engine streams (what mlx-lm's infer_quant_config can infer).
QUANT_MODES = ("affine", "mxfp4", "nvfp4", "mxfp8")
#: The one (bits, group size) each non-affine mode allows.
_MODE_SHAPES = {(4, 32): "mxfp4", (4, 16): "nvfp4", (8, 32): "mxfp8"}


def projections(model_type: str) -> tuple[str, ...]:
    if model_type in ARCHITECTURES:
        return ARCHITECTURES[model_type].projections
    return OTHER_PROJECTIONS.get(model_type, ("gate_proj", "up_proj", "down_proj"))


def is_hybrid(model_type: str) -> bool:
    arch = ARCHITECTURES.get(model_type)
    return arch is not None and arch.hybrid


# --------------------------------------------------------------------------- config reading


@dataclass(frozen=True)
class MoeGeometry:
    """The expert shape of a model, read from its config (text config for VL models)."""

    model_type: str
    num_layers: int
    moe_layers: tuple[int, ...]
    num_experts: int
    trained_k: int
    hidden_size: int
    expert_intermediate: int
    projections: tuple[str, ...]


@dataclass(frozen=True)
class Quantization:
    bits: int
    group_size: int
    mode: str = "affine"

    def as_mlx(self) -> dict:
        """The `quantization` block mlx-lm's load_model reads."""
        return {"group_size": self.group_size, "bits": self.bits, "mode": self.mode}


def text_config(config: Mapping) -> Mapping:
    """The language-model part of a config: `text_config` when nested (VL checkpoints)."""
    inner = config.get("text_config")
    return inner if isinstance(inner, Mapping) else config


def model_type(config: Mapping) -> str:
    """The architecture name; a flat Qwen3.5 text config says `qwen3_5_moe_text`."""
    mt = config.get("model_type") or text_config(config).get("model_type") or ""
    mt = str(mt)
    return mt[: -len("_text")] if mt.endswith("_text") else mt


def _int(cfg: Mapping, *keys: str, default: int | None = None) -> int | None:
    for key in keys:
        value = cfg.get(key)
        if value is None:
            continue
        if (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or value != value
            or value in (float("inf"), float("-inf"))
            or int(value) != value
        ):
            raise ModelError(f"config.json: {key} must be an integer, got {value!r}")
        return int(value)
    return default


# Config numbers the architectures divide or allocate by: each, when present, is a whole
# number in 1..its bound (a 0 was a ZeroDivisionError in mlx-lm's attention, 10**12 an
# allocation that never ends).
CONFIG_NUMBERS: dict[str, int] = {
    "hidden_size": 1 << 20,
    "num_hidden_layers": 1 << 12,
    "num_attention_heads": 1 << 12,
    "num_key_value_heads": 1 << 12,
    "head_dim": 1 << 14,
    "vocab_size": 1 << 24,
    "moe_intermediate_size": 1 << 20,
    "num_experts": 1 << 16,
    "n_routed_experts": 1 << 16,
    "num_local_experts": 1 << 16,
    "num_experts_per_tok": 1 << 16,
    "max_position_embeddings": 1 << 26,
}


def check_config_numbers(config: Mapping, source: str = "config.json") -> None:
    """The numbers an architecture needs, checked against what it can use (one line naming
    `source` and the key), before mlx-lm builds anything from them."""
    tc = text_config(config)
    where = f"{source}: " + ("text_config." if tc is not config else "")
    for key, hi in CONFIG_NUMBERS.items():
        value = tc.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= hi:
            shown = repr(value) if len(repr(value)) <= 40 else repr(value)[:37] + "..."
            raise ModelError(f"{where}{key} = {shown} must be a whole number in 1..{hi:,}")
    heads, kv = tc.get("num_attention_heads"), tc.get("num_key_value_heads")
    if isinstance(heads, int) and isinstance(kv, int) and heads % kv:
        raise ModelError(
            f"{where}num_attention_heads = {heads} is not a multiple of "
            f"num_key_value_heads = {kv} (each key/value head serves a whole group)"
        )
    n, k = num_experts(config), trained_k(config)
    if n and k > n:
        raise ModelError(
            f"{where}num_experts_per_tok = {k} is more than the {n} experts per layer "
            "(the config is inconsistent; this is not about --k)"
        )


def num_experts(config: Mapping) -> int:
    """Routed experts per MoE layer (0 for a dense model), whatever the config calls it."""
    tc = text_config(config)
    return _int(tc, "num_experts", "n_routed_experts", "num_local_experts", "moe_num_experts") or 0


def trained_k(config: Mapping) -> int:
    """Experts the model was trained to route per token (0 when the config does not say)."""
    tc = text_config(config)
    return _int(tc, "num_experts_per_tok", "experts_per_token", "moe_k", "top_k", default=0) or 0


def _nemotron_pattern(tc: Mapping) -> str:
    pattern = tc.get("hybrid_override_pattern")
    if pattern is None:
        types = tc.get("layers_block_type") or tc.get("layer_types")
        if not types:
            raise ModelError("config.json: nemotron_h needs hybrid_override_pattern")
        chars = {"moe": "E", "mlp": "-", "mamba": "M", "attention": "*"}
        chars |= {"full_attention": "*", "linear_attention": "M", "conv": "M"}
        pattern = "".join(chars.get(str(t), "?") for t in types)
    return "".join(pattern) if isinstance(pattern, list) else str(pattern)


def moe_geometry(config: Mapping) -> MoeGeometry | None:
    """Expert shape from a config, or None for a dense model."""
    mt = model_type(config)
    tc = text_config(config)
    n_exp = num_experts(config)
    if n_exp <= 0:
        return None
    k = trained_k(config)
    hidden = _int(tc, "hidden_size", default=0) or 0
    n_layers = _int(tc, "num_hidden_layers", default=0) or 0
    if mt == "nemotron_h":
        pattern = _nemotron_pattern(tc)
        n_layers = len(pattern)
        moe = tuple(i for i, c in enumerate(pattern) if c == "E")
        inter = _int(tc, "moe_intermediate_size", default=0) or 0
    elif mt in ("mixtral", "gpt_oss"):
        moe = tuple(range(n_layers))
        inter = _int(tc, "intermediate_size", default=0) or 0
    elif mt == "qwen3_5_moe":
        # mlx-lm gives every Qwen3.5 layer a sparse block when num_experts > 0.
        moe = tuple(range(n_layers))
        inter = _int(tc, "moe_intermediate_size", default=0) or 0
    else:
        step = _int(tc, "decoder_sparse_step", default=1) or 1
        dense = set(tc.get("mlp_only_layers") or ())
        first_dense = _int(tc, "first_k_dense_replace", default=0) or 0
        moe = tuple(
            i
            for i in range(n_layers)
            if i not in dense and i >= first_dense and (i + 1) % step == 0
        )
        inter = _int(tc, "moe_intermediate_size", "intermediate_size", default=0) or 0
    if n_layers <= 0 or hidden <= 0 or inter <= 0 or k <= 0:
        raise ModelError(
            f"config.json ({mt or 'unknown model_type'}): expert shape incomplete "
            f"(layers={n_layers}, hidden_size={hidden}, expert size={inter}, top-k={k})"
        )
    return MoeGeometry(
        model_type=mt,
        num_layers=n_layers,
        moe_layers=moe,
        num_experts=n_exp,
        trained_k=k,
        hidden_size=hidden,
        expert_intermediate=inter,
        projections=projections(mt),
    )


def legacy_quantization(qc: Mapping) -> Quantization | None:
    """An HF `quantization_config` that mlx-lm's load_model turns into an MLX mode
    (mxfp4, mxfp8, fp8 with ue8m0 32x32 blocks, ModelOpt NVFP4), else None."""
    method = str(qc.get("quant_method") or "")
    if method == "mxfp4":
        return Quantization(4, 32, "mxfp4")
    if method == "mxfp8":
        return Quantization(8, 32, "mxfp8")
    if (
        method == "fp8"
        and qc.get("scale_fmt") == "ue8m0"
        and list(qc.get("weight_block_size") or ()) == [32, 32]
    ):
        return Quantization(8, 32, "mxfp8")
    if method == "modelopt":
        settings = qc.get("quantization", qc)
        if isinstance(settings, Mapping) and settings.get("quant_algo") == "NVFP4":
            return Quantization(4, _int(settings, "group_size", default=16) or 16, "nvfp4")
    return None


def quantization(config: Mapping) -> Quantization | None:
    """The MLX quantization of the model: `quantization` (what mlx-lm writes), else an MLX
    block under `quantization_config`, else a legacy form mlx-lm converts; None if none."""
    q = config.get("quantization")
    if not isinstance(q, Mapping):
        q = config.get("quantization_config")
        if not isinstance(q, Mapping):
            q = text_config(config).get("quantization_config")
        if not isinstance(q, Mapping):
            return None
        if "bits" not in q or "group_size" not in q:
            return legacy_quantization(q)
    bits = _int(q, "bits")
    group = _int(q, "group_size")
    if not bits or not group:
        return None
    return Quantization(bits=bits, group_size=group, mode=str(q.get("mode") or "affine"))


def foreign_quantization(config: Mapping) -> str | None:
    """The quant_method of an HF quantization the engine cannot stream (gptq, awq, ...)."""
    q = config.get("quantization_config")
    if isinstance(q, Mapping) and "bits" not in q and legacy_quantization(q) is None:
        return str(q.get("quant_method") or "non-MLX")
    return None


def infer_mode(bits: int, group_size: int, scales_dtype: str) -> str:
    """The MLX mode of packed weights, as mlx-lm's infer_quant_config decides it: only
    affine keeps its scales in a float dtype; each other mode has one (bits, group)."""
    if scales_dtype in ("BF16", "F16", "F32"):
        return "affine"
    mode = _MODE_SHAPES.get((bits, group_size))
    if mode is None:
        raise ModelError(
            f"cannot infer the quantization mode of {bits}-bit weights with group size "
            f"{group_size} and {scales_dtype} scales"
        )
    return mode

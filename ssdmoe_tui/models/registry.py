"""Which checkpoints ssdmoe can stream, and the expert arithmetic that follows from a config.

The engine streams the stacked `switch_mlp` expert tensors of MLX-quantized checkpoints
(the layout `mlx_lm.convert -q` and mlx-community write). This module knows, from a
`config.json` alone, whether a model is such a checkpoint of an architecture the engine
handles, and how big one expert is; `scan.py` measures the same from the safetensors
headers. Everything that refuses a model raises `UnsupportedModelError` with one line
that names the closest checkpoint known to work.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from ssdmoe_tui.errors import ModelError, UnsupportedModelError

MIB = 1 << 20

#: Architectures whose experts the engine streams today.
SUPPORTED_ARCHITECTURES: dict[str, str] = {
    "qwen3_moe": "Qwen3 MoE (Qwen3-30B-A3B, Qwen3-235B-A22B, Qwen3-Coder-30B-A3B)",
    "qwen3_5_moe": "Qwen3.5 MoE (Qwen3.5-35B-A3B and larger); text tower of the VL checkpoint",
    "nemotron_h": "NVIDIA Nemotron-H hybrid Mamba/attention with MoE layers (Nemotron 3 Nano)",
    "mixtral": "Mixtral (8 experts, top-2: Mixtral-8x7B, Mixtral-8x22B)",
}

#: Architectures with the same switch_mlp layout that the engine does not load yet.
PLANNED_ARCHITECTURES: dict[str, str] = {}

#: Projections of one expert, per architecture (SwitchGLU: gate/up/down; SwitchMLP: fc1/fc2).
EXPERT_PROJECTIONS: dict[str, tuple[str, ...]] = {
    "qwen3_moe": ("gate_proj", "up_proj", "down_proj"),
    "qwen3_5_moe": ("gate_proj", "up_proj", "down_proj"),
    "nemotron_h": ("fc1", "fc2"),
    "mixtral": ("gate_proj", "up_proj", "down_proj"),
    "gpt_oss": ("gate_proj", "up_proj", "down_proj"),
}

#: MLX quantization modes the engine streams (affine: per-group scales + biases).
SUPPORTED_QUANT_MODES = ("affine",)


@dataclass(frozen=True)
class KnownCheckpoint:
    repo_id: str
    architecture: str
    note: str


#: Real Hub checkpoints known to work (the first one of a family is its suggestion).
KNOWN_CHECKPOINTS: tuple[KnownCheckpoint, ...] = (
    KnownCheckpoint(
        "mlx-community/Qwen3.5-35B-A3B-4bit",
        "qwen3_5_moe",
        "40 MoE layers x 256 experts, K=8; ~1.69 MiB per expert",
    ),
    KnownCheckpoint(
        "mlx-community/NVIDIA-Nemotron-3-Nano-30B-A3B-4bit",
        "nemotron_h",
        "23 MoE layers x 128 experts, K=6; ~5.35 MiB per expert",
    ),
    KnownCheckpoint(
        "mlx-community/Qwen3-30B-A3B-4bit",
        "qwen3_moe",
        "48 MoE layers x 128 experts, K=8; ~2.53 MiB per expert",
    ),
)

DEFAULT_SUGGESTION = "mlx-community/Qwen3-30B-A3B-4bit"


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

    @property
    def matrix_elements(self) -> int:
        """Weight elements of one expert (all projections; each is hidden x intermediate)."""
        return len(self.projections) * self.hidden_size * self.expert_intermediate


@dataclass(frozen=True)
class Quantization:
    bits: int
    group_size: int
    mode: str = "affine"


@dataclass(frozen=True)
class SupportInfo:
    """What `check_supported` learned; `expert_bytes` is config arithmetic, headers may refine it."""

    architecture: str
    description: str
    geometry: MoeGeometry
    quantization: Quantization
    expert_bytes: int

    def mib_per_token(self, k: int | None = None) -> float:
        k = self.geometry.trained_k if k is None else k
        return self.expert_bytes * k * len(self.geometry.moe_layers) / MIB


# --------------------------------------------------------------------------- config reading


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
        if isinstance(value, bool) or not isinstance(value, int | float) or int(value) != value:
            raise ModelError(f"config.json: {key} must be an integer, got {value!r}")
        return int(value)
    return default


def num_experts(config: Mapping) -> int:
    """Routed experts per MoE layer (0 for a dense model), whatever the config calls it."""
    tc = text_config(config)
    return _int(tc, "num_experts", "n_routed_experts", "num_local_experts", "moe_num_experts") or 0


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
    k = _int(tc, "num_experts_per_tok", "experts_per_token", "moe_k", "top_k", default=0) or 0
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
        projections=EXPERT_PROJECTIONS.get(mt, ("gate_proj", "up_proj", "down_proj")),
    )


def quantization(config: Mapping) -> Quantization | None:
    """The MLX quantization of the experts (mlx-lm writes `quantization`), or None."""
    q = config.get("quantization")
    if not isinstance(q, Mapping):
        q = config.get("quantization_config")
        # Only MLX's own block has bits + group_size; HF's (mxfp4, fp8, gptq, ...) does not.
        if not isinstance(q, Mapping) or "bits" not in q or "group_size" not in q:
            return None
    bits = _int(q, "bits")
    group = _int(q, "group_size")
    if not bits or not group:
        return None
    return Quantization(bits=bits, group_size=group, mode=str(q.get("mode") or "affine"))


def _foreign_quantization(config: Mapping) -> str | None:
    q = config.get("quantization_config")
    if isinstance(q, Mapping) and "bits" not in q:
        return str(q.get("quant_method") or "non-MLX")
    return None


# --------------------------------------------------------------------------- arithmetic


def quantized_matrix_bytes(
    rows: int, cols: int, bits: int = 4, group_size: int = 64, mode: str = "affine"
) -> int:
    """Bytes of one MLX-quantized matrix: packed weights + scales (+ biases for affine).

    Affine keeps bf16 scales and biases per group of `group_size` inputs; the mx*/nv* float
    modes keep one 8-bit scale per group and no biases.
    """
    if cols % group_size:
        raise ModelError(f"input size {cols} is not a multiple of group size {group_size}")
    weight = rows * cols * bits // 8
    groups = rows * (cols // group_size)
    per_group = 4 if mode == "affine" else 1
    return weight + groups * per_group


def expert_bytes_from_config(
    config: Mapping, bits: int = 4, group_size: int = 64, mode: str = "affine"
) -> int:
    """Bytes of one routed expert of a real-shape config, quantized as given.

    Each projection is hidden_size x expert_intermediate (up: inter x hidden; down:
    hidden x inter), so the total does not depend on which way round each one is stored
    as long as both sizes are multiples of the group size.
    """
    geo = moe_geometry(config)
    if geo is None:
        raise UnsupportedModelError(f"{model_type(config) or 'model'} is dense: no experts")
    h, i = geo.hidden_size, geo.expert_intermediate
    total = 0
    for proj in geo.projections:
        # down_proj / fc2 read the intermediate vector; the others read the hidden vector.
        rows, cols = (h, i) if proj in ("down_proj", "fc2") else (i, h)
        total += quantized_matrix_bytes(rows, cols, bits, group_size, mode)
    return total


def mib_per_token(config: Mapping, k: int | None = None, **quant) -> float:
    """MiB of experts one decoded token reads at top-K (every MoE layer, K experts each)."""
    geo = moe_geometry(config)
    if geo is None:
        return 0.0
    k = geo.trained_k if k is None else k
    return expert_bytes_from_config(config, **quant) * k * len(geo.moe_layers) / MIB


# --------------------------------------------------------------------------- support


def closest_supported(config_or_type: Mapping | str) -> str:
    """The known-good checkpoint nearest to a model (same family first)."""
    mt = config_or_type if isinstance(config_or_type, str) else model_type(config_or_type)
    mt = mt.lower()
    for ck in KNOWN_CHECKPOINTS:
        if ck.architecture == mt:
            return ck.repo_id
    if mt.startswith("qwen3_5") or mt.startswith("qwen3_next"):
        return "mlx-community/Qwen3.5-35B-A3B-4bit"
    if "nemotron" in mt:
        return "mlx-community/NVIDIA-Nemotron-3-Nano-30B-A3B-4bit"
    return DEFAULT_SUGGESTION


def _name(folder: Path | None, config: Mapping) -> str:
    if folder is not None:
        return str(folder)
    return model_type(config) or "this model"


def _gguf_files(folder: Path | None) -> list[Path]:
    if folder is None or not folder.is_dir():
        return []
    return sorted(folder.glob("*.gguf"))


def refuse_gguf(path: Path, config: Mapping | None = None) -> UnsupportedModelError:
    hint = closest_supported(config) if config else DEFAULT_SUGGESTION
    return UnsupportedModelError(
        f"{path} is GGUF (llama.cpp format); ssdmoe streams MLX safetensors checkpoints: try {hint}"
    )


def check_supported(config: Mapping, folder: Path | str | None = None) -> SupportInfo:
    """Accept an MLX-quantized MoE checkpoint of a supported architecture, or explain why not.

    With a `folder`, also look at its files: GGUF-only folders are refused and the
    safetensors headers must hold quantized `switch_mlp` expert stacks.
    """
    folder = Path(folder) if folder is not None else None
    name = _name(folder, config)
    if folder is not None and not any(folder.glob("*.safetensors")):
        ggufs = _gguf_files(folder)
        if ggufs:
            raise refuse_gguf(ggufs[0], config)
    mt = model_type(config)
    hint = closest_supported(config)
    if not mt:
        raise UnsupportedModelError(f"{name}: config.json has no model_type; try {hint}")
    geo = moe_geometry(config)
    if geo is None:
        raise UnsupportedModelError(
            f"{name} is a dense {mt} model (no experts to stream); "
            f"ssdmoe runs Mixture-of-Experts checkpoints: try {hint}"
        )
    if mt not in SUPPORTED_ARCHITECTURES:
        status = "planned" if mt in PLANNED_ARCHITECTURES else "not supported"
        raise UnsupportedModelError(
            f"{name}: MoE architecture {mt} is {status} (supported: "
            f"{', '.join(SUPPORTED_ARCHITECTURES)}); try {hint}"
        )
    quant = quantization(config)
    if quant is None:
        foreign = _foreign_quantization(config)
        what = f"{foreign}-quantized" if foreign else "unquantized"
        raise UnsupportedModelError(
            f"{name}: experts are {what}, not MLX-quantized; ssdmoe streams 4-bit MLX "
            f"checkpoints: try {hint} (or `mlx_lm.convert -q --hf-path ...`)"
        )
    if quant.mode not in SUPPORTED_QUANT_MODES:
        raise UnsupportedModelError(
            f"{name}: quantization mode {quant.mode} is not streamed yet (supported: "
            f"{', '.join(SUPPORTED_QUANT_MODES)}); try {hint}"
        )
    if folder is not None and any(folder.glob("*.safetensors")):
        from ssdmoe_tui.models.scan import measure_experts

        measured = measure_experts(folder)
        if not measured.layers:
            sample = (
                f" (found e.g. {measured.sample_expert_tensor})"
                if measured.sample_expert_tensor
                else ""
            )
            raise UnsupportedModelError(
                f"{name}: no quantized switch_mlp expert tensors in the safetensors{sample}; "
                f"this expert layout is not streamed: try {hint}"
            )
        if not measured.quantized:
            raise UnsupportedModelError(
                f"{name}: switch_mlp experts are unquantized (no .scales); ssdmoe streams "
                f"MLX-quantized experts: try {hint}"
            )
        if measured.num_experts != geo.num_experts:
            raise ModelError(
                f"{name}: safetensors hold {measured.num_experts} experts per layer, "
                f"config.json says {geo.num_experts}"
            )
    return SupportInfo(
        architecture=mt,
        description=SUPPORTED_ARCHITECTURES[mt],
        geometry=geo,
        quantization=quant,
        expert_bytes=expert_bytes_from_config(config, quant.bits, quant.group_size, quant.mode),
    )

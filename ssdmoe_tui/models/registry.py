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

from ssdmoe_tui.checkpoint import layout
from ssdmoe_tui.checkpoint.arch import (
    ARCHITECTURES,
    QUANT_MODES,
    STREAMED,
    MoeGeometry,
    Quantization,
    check_config_numbers,
    family,
    foreign_quantization,
    model_type,
    moe_geometry,
    quantization,
    text_config,
)
from ssdmoe_tui.checkpoint.layout import measure_experts
from ssdmoe_tui.errors import ModelError, UnsupportedModelError

# Config reading is checkpoint.arch's; these names stay importable from here for callers.
__all__ = [
    "MoeGeometry",
    "Quantization",
    "model_type",
    "moe_geometry",
    "quantization",
    "ARCHITECTURES",
    "text_config",
    "UnsupportedModelError",
]

#: Architectures whose experts the engine streams (the table lives in checkpoint.arch).
SUPPORTED_ARCHITECTURES: dict[str, str] = {a.model_type: a.description for a in STREAMED.values()}

#: Architectures with the same switch_mlp layout that the engine does not load yet.
PLANNED_ARCHITECTURES: dict[str, str] = {}


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
class VerifiedShape:
    """A release whose genuine config.json the tests stream with RANDOM weights: its
    shape is verified, its weights were never run here. `model` names the release (the
    Hub repository the config comes from), `note` its expert geometry (`shape_note`)."""

    model: str
    architecture: str
    note: str


def shape_note(config: Mapping, bits: int = 4, group_size: int = 64, mode: str = "affine") -> str:
    """`VerifiedShape.note` of a config: MoE layers x experts, K, bytes per expert."""
    geo = moe_geometry(config)
    if geo is None:
        raise UnsupportedModelError(f"{model_type(config) or 'model'} is dense: no experts")
    mib = expert_bytes_from_config(config, bits, group_size, mode) / 2**20
    fmt = "MXFP4" if mode == "mxfp4" else f"{bits}-bit"
    return (
        f"{len(geo.moe_layers)} MoE layers x {geo.num_experts} experts, K={geo.trained_k}; "
        f"{mib:.2f} MiB per {fmt} expert"
    )


#: Shapes verified with random weights (tests/engine/test_real_shapes.py): the release's
#: config.json cut to one or two MoE layers (plus a layer of each other kind it needs)
#: and a 2048-token vocabulary, every expert at its real count, width and quantization:
#: greedy tokens equal mlx-lm's at the trained K and one lower, K changed live, a KV
#: checkpoint resumed. They say the engine handles the shape, not that the release's
#: weights were run (they were not). The tests hold each note to the config's arithmetic.
VERIFIED_SHAPES: tuple[VerifiedShape, ...] = (
    VerifiedShape("openai/gpt-oss-120b", "gpt_oss",
                  "36 MoE layers x 128 experts, K=4; 12.62 MiB per MXFP4 expert"),
    VerifiedShape("openai/gpt-oss-20b", "gpt_oss",
                  "24 MoE layers x 32 experts, K=4; 12.62 MiB per MXFP4 expert"),
    VerifiedShape("deepseek-ai/DeepSeek-V3", "deepseek_v3",
                  "58 MoE layers x 256 experts, K=8; 23.62 MiB per 4-bit expert"),
    VerifiedShape("deepseek-ai/DeepSeek-R1", "deepseek_v3",
                  "58 MoE layers x 256 experts, K=8; 23.62 MiB per 4-bit expert"),
    VerifiedShape("moonshotai/Kimi-K2-Instruct", "deepseek_v3",
                  "60 MoE layers x 384 experts, K=8; 23.62 MiB per 4-bit expert"),
    VerifiedShape("Qwen/Qwen3-Next-80B-A3B-Thinking", "qwen3_next",
                  "48 MoE layers x 512 experts, K=10; 1.69 MiB per 4-bit expert"),
    VerifiedShape("Qwen/Qwen3-235B-A22B", "qwen3_moe",
                  "94 MoE layers x 128 experts, K=8; 10.12 MiB per 4-bit expert"),
    VerifiedShape("Qwen/Qwen3.5-35B-A3B", "qwen3_5_moe",
                  "40 MoE layers x 256 experts, K=8; 1.69 MiB per 4-bit expert"),
    VerifiedShape("zai-org/GLM-4.5-Air", "glm4_moe",
                  "45 MoE layers x 128 experts, K=8; 9.28 MiB per 4-bit expert"),
    VerifiedShape("google/gemma-4-26B-A4B", "gemma4_text",
                  "30 MoE layers x 128 experts, K=8; 3.19 MiB per 4-bit expert"),
)  # fmt: skip


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
        return layout.mib_per_token(self.expert_bytes, k, len(self.geometry.moe_layers))


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
    overrides = (
        config.get("quantization") if isinstance(config.get("quantization"), Mapping) else {}
    )
    total = 0
    for proj in geo.projections:
        # down_proj / fc2 read the intermediate vector; the others read the hidden vector.
        rows, cols = (h, i) if proj in ("down_proj", "fc2") else (i, h)
        own = overrides.get(f"{geo.switch_path}.{proj}") if geo.switch_path else None
        if isinstance(own, Mapping):  # a mixed recipe: this projection at its own bits
            total += quantized_matrix_bytes(
                rows, cols, own.get("bits", bits), own.get("group_size", group_size),
                own.get("mode", mode),
            )  # fmt: skip
            continue
        total += quantized_matrix_bytes(rows, cols, bits, group_size, mode)
        if geo.bias:  # the projection's own bf16 bias per expert (gpt-oss)
            total += rows * 2
    return total


def mib_per_token(config: Mapping, k: int | None = None, **quant) -> float:
    """MiB of experts one decoded token reads at top-K (every MoE layer, K experts each)."""
    geo = moe_geometry(config)
    if geo is None:
        return 0.0
    k = geo.trained_k if k is None else k
    return layout.mib_per_token(expert_bytes_from_config(config, **quant), k, len(geo.moe_layers))


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
    fam = family(config)
    if fam is not None:
        mt = fam.model_type
    geo = moe_geometry(config)
    if geo is None:
        raise UnsupportedModelError(
            f"{name} is a dense {mt} model (no experts to stream); "
            f"ssdmoe runs Mixture-of-Experts checkpoints: try {hint}"
        )
    if fam is not None and fam.refused:
        raise UnsupportedModelError(f"{name}: MoE architecture {mt} is not streamed: {fam.refused}")
    if mt not in SUPPORTED_ARCHITECTURES:
        status = "planned" if mt in PLANNED_ARCHITECTURES else "not supported"
        raise UnsupportedModelError(
            f"{name}: MoE architecture {mt} is {status}: its experts are not in an mlx-lm "
            f"SwitchGLU/SwitchMLP (`ssdmoe models supported` lists the {len(SUPPORTED_ARCHITECTURES)} "
            f"families streamed); try {hint}"
        )
    check_config_numbers(config, str(folder / "config.json") if folder is not None else name)
    quant = quantization(config)
    if quant is None:
        foreign = foreign_quantization(config)
        what = f"{foreign}-quantized" if foreign else "unquantized"
        raise UnsupportedModelError(
            f"{name}: experts are {what}, not MLX-quantized; ssdmoe streams 4-bit MLX "
            f"checkpoints: try {hint} (or `mlx_lm.convert -q --hf-path ...`)"
        )
    if quant.mode not in QUANT_MODES:
        raise UnsupportedModelError(
            f"{name}: quantization mode {quant.mode} is not streamed yet (supported: "
            f"{', '.join(QUANT_MODES)}); try {hint}"
        )
    if folder is not None and any(folder.glob("*.safetensors")):
        _check_expert_tensors(folder, name, geo.num_experts, hint)
    return SupportInfo(
        architecture=mt,
        description=SUPPORTED_ARCHITECTURES[mt],
        geometry=geo,
        quantization=quant,
        expert_bytes=expert_bytes_from_config(config, quant.bits, quant.group_size, quant.mode),
    )


def _check_expert_tensors(folder: Path, name: str, num_experts: int, hint: str) -> None:
    """The safetensors headers hold quantized switch_mlp stacks of `num_experts` experts."""
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
    if measured.num_experts != num_experts:
        raise ModelError(
            f"{name}: safetensors hold {measured.num_experts} experts per layer, "
            f"config.json says {num_experts}"
        )

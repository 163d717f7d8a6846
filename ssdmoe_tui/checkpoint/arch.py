"""The architecture table: every MoE model type of the pinned mlx-lm, and what a config says.

One table (`ARCHITECTURES`) has one entry per mlx-lm model type whose experts sit in a
`SwitchGLU` / `SwitchMLP`. An entry states everything the engine needs that mlx-lm's
module tree does not already say: where the routing block keeps its experts (`switch`,
`up`), its router (`router`), the attributes it reads K from (`k_paths`, set live), the
routing function the router-mass figure follows (`routing`), whether its caches hold
state that cannot be trimmed (`hybrid`), and, for a family that is not streamed, why
(`refused`). Nothing outside this module branches on a model type.

What mlx-lm's classes decide is read from them, not restated: which layers are MoE, the
expert count and width, the trained K (a class default included) come from the model
built lazily from the config (`moe_geometry`: no weight is allocated, ~20 ms for a
48-layer model). The tests hold every entry against the module tree it describes
(tests/engine/test_families.py). One function reads the quantization, mlx-lm's own
`quantization` block or the legacy `quantization_config` forms that mlx-lm turns into
MLX modes. `QUANT_MODES` are the MLX modes the engine streams.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass

from ssdmoe_tui.errors import ModelError

#: Router-mass functions (engine/model/routing_mass.py computes each):
#: softmax  - probabilities are a softmax over every expert's router logit; top-K of
#:            those (a softmax over only the top-K logits selects the same experts);
#: sigmoid  - an independent sigmoid per expert, selection by sigmoid + a per-expert
#:            correction bias, possibly within the top groups (DeepSeek-V3's scheme);
#: none     - not measured for this family (its panel shows no router mass).
ROUTINGS = ("softmax", "sigmoid", "none")


@dataclass(frozen=True)
class Architecture:
    """One mlx-lm MoE model type, as the engine streams it.

    `switch`: the attribute that holds the SwitchGLU/SwitchMLP in the module that holds
    it; the safetensors keys are `<that module>.<switch>.<proj>.<part>`. `up`: how many
    levels above that module the routing block is (0: the same module; 1: Gemma 4, whose
    decoder layer routes and hands indices to an `experts` module). `router`: the block's
    router attribute (its gate), whose probabilities the router mass reads. `k_paths`:
    dotted attributes of the block that hold K, every one set when K changes live (the
    first is read for the trained K). `hybrid`: some of its caches are not trimmable
    (recurrent or linear-attention state, a rotating window), so a KV checkpoint is
    reused only at an exact prefix."""

    model_type: str
    description: str
    switch: str = "switch_mlp"
    up: int = 0
    router: str = "gate"
    k_paths: tuple[str, ...] = ("top_k",)
    routing: str = "softmax"
    hybrid: bool = False
    projections: tuple[str, ...] = ("gate_proj", "up_proj", "down_proj")  # SwitchMLP: fc1, fc2
    # tokens that end a reply whatever generation_config.json lists (gpt-oss's first one
    # stops on <|return|> alone, so a tool call, which ends in <|call|>, ran on)
    stop_tokens: tuple[str, ...] = ()
    refused: str = ""  # non-empty: not streamed, and this is why (one line)

    @property
    def streamed(self) -> bool:
        return not self.refused


def _a(model_type: str, description: str, **kw) -> Architecture:
    return Architecture(model_type, description, **kw)


_DEEPSEEK_K = ("gate.top_k", "num_experts_per_tok")  # MoEGate selects; the block mirrors it

#: Every MoE model type of mlx-lm 0.32.2 (`SwitchGLU`/`SwitchMLP` users), streamed or not.
ARCHITECTURES: dict[str, Architecture] = {
    a.model_type: a
    for a in (
        _a("qwen3_moe", "Qwen3 MoE (Qwen3-30B-A3B, Qwen3-235B-A22B, Qwen3-Coder-30B-A3B)"),
        _a(
            "qwen3_5_moe",
            "Qwen3.5 MoE (Qwen3.5-35B-A3B and larger); text tower of the VL checkpoint",
            hybrid=True,
        ),
        _a(
            "nemotron_h",
            "NVIDIA Nemotron-H hybrid Mamba/attention with MoE layers (Nemotron 3 Nano)",
            k_paths=("gate.top_k",),
            routing="sigmoid",
            hybrid=True,
            projections=("fc1", "fc2"),
        ),
        _a(
            "mixtral",
            "Mixtral (8 experts, top-2: Mixtral-8x7B, Mixtral-8x22B)",
            k_paths=("num_experts_per_tok",),
        ),
        _a(
            "gpt_oss",
            "OpenAI gpt-oss (gpt-oss-120b, gpt-oss-20b; MXFP4 experts with biases)",
            switch="experts",
            router="router",
            k_paths=("num_experts_per_tok",),
            hybrid=True,
            stop_tokens=("<|return|>", "<|call|>"),
        ),
        _a(
            "deepseek_v3",
            "DeepSeek-V3/V3.1/R1 and Kimi K2 (MLA, 256-384 experts, grouped sigmoid routing)",
            k_paths=_DEEPSEEK_K,
            routing="sigmoid",
        ),
        _a(
            "glm4_moe",
            "GLM-4.5 / 4.6 / 4.7 (GLM-4.5-Air, GLM-4.6)",
            k_paths=_DEEPSEEK_K,
            routing="sigmoid",
        ),
        _a(
            "qwen3_next", "Qwen3-Next (Qwen3-Next-80B-A3B; gated DeltaNet + attention)", hybrid=True
        ),
        _a(
            "llama4",
            "Llama 4 (Scout 17B-16E, Maverick 17B-128E)",
            switch="experts",
            router="router",
            routing="none",
            hybrid=True,
        ),
        _a("minimax", "MiniMax-M2 / M2.1", k_paths=("num_experts_per_tok",), routing="none"),
        _a(
            "gemma4_text",
            "Gemma 4 MoE text tower (Gemma-4-26B-A4B)",
            switch="switch_glu",
            up=1,
            router="router",
            k_paths=("router.config.top_k_experts",),
            routing="none",
            hybrid=True,
        ),
        _a("deepseek_v2", "DeepSeek-V2 / V2.5 / V2-Lite", k_paths=_DEEPSEEK_K, routing="none"),
        _a("deepseek", "DeepSeek-MoE 16B", k_paths=("gate.top_k",), routing="none"),
        _a("qwen2_moe", "Qwen1.5-MoE / Qwen2-57B-A14B"),
        _a("olmoe", "OLMoE (OLMoE-1B-7B)"),
        _a(
            "granitemoe",
            "IBM Granite 3.x MoE",
            router="router",
            k_paths=("router.top_k",),
            routing="none",
        ),
        _a("ernie4_5_moe", "Baidu ERNIE 4.5 MoE", k_paths=("k",), routing="none"),
        _a(
            "dots1",
            "rednote dots.llm1",
            switch="experts",
            k_paths=_DEEPSEEK_K,
            routing="none",
        ),
        _a("hunyuan", "Tencent Hunyuan MoE (Hunyuan-A13B)", routing="none"),
        _a(
            "bailing_moe",
            "inclusionAI Ling / Ring (Bailing MoE)",
            refused=(
                "mlx-lm's own forward segfaults at K=1 (MLX shapeless-compiles its"
                " aggregate_expert_outputs, a sum over the size-1 expert axis); exact at K>=2 here"
            ),
            k_paths=("gate.top_k", "num_experts_per_tok"),
            routing="none",
        ),
        _a("phimoe", "Phi-3.5-MoE", routing="none"),
        _a(
            "jamba",
            "AI21 Jamba (Mamba + attention + MoE)",
            router="router",
            k_paths=("num_experts_per_tok",),
            hybrid=True,
        ),
        _a("lfm2_moe", "Liquid LFM2 MoE (LFM2-8B-A1B)", routing="none", hybrid=True),
        _a(
            "granitemoehybrid",
            "IBM Granite 4.0 hybrid MoE",
            router="router",
            k_paths=("router.top_k",),
            routing="none",
            hybrid=True,
        ),
        _a(
            "kimi_linear",
            "Moonshot Kimi Linear (KDA linear attention + MLA)",
            k_paths=("args.num_experts_per_token",),
            routing="none",
            hybrid=True,
        ),
        _a(
            "deepseek_v32",
            "DeepSeek-V3.2 (sparse attention)",
            k_paths=_DEEPSEEK_K,
            routing="sigmoid",
            hybrid=True,
        ),
        _a("glm4_moe_lite", "GLM-4.7-Flash (GLM-4 MoE Lite)", k_paths=_DEEPSEEK_K, routing="none"),
        _a(
            "mistral4",
            "Mistral 4 MoE",
            k_paths=("num_experts_per_tok",),
            routing="none",
        ),
        _a("Klear", "Kwai Klear MoE", switch="experts", routing="none"),
        _a(
            "afmoe",
            "Arcee AFMoE (Trinity)",
            switch="experts",
            router="router",
            k_paths=("num_experts_per_tok",),
            routing="none",
            hybrid=True,
        ),
        _a(
            "bailing_hybrid",
            "inclusionAI Ring-flash-linear hybrid",
            k_paths=("gate.top_k", "num_experts_per_tok"),
            routing="none",
            hybrid=True,
        ),
        _a(
            "bailing_moe_linear",
            "inclusionAI Ling linear-attention MoE",
            k_paths=("gate.top_k", "num_experts_per_tok"),
            routing="none",
            hybrid=True,
        ),
        _a(
            "bailing_moe_v3",
            "inclusionAI Ling 3 MoE",
            k_paths=("gate.top_k",),
            routing="none",
            hybrid=True,
        ),
        _a(
            "deepseek_v41",
            "DeepSeek-V4.1 (compressed attention)",
            refused=(
                "greedy tokens equal mlx-lm's here, but a KV checkpoint cannot resume: mlx-lm's"
                " load_prompt_cache cannot rebuild its LayerCache (no from_state, window unsaved)"
            ),
            up=1,
            k_paths=("gate.top_k",),
            routing="none",
            hybrid=True,
        ),
        _a("exaone_moe", "LG EXAONE MoE", k_paths=("gate.top_k",), routing="none", hybrid=True),
        _a(
            "kimi_k3",
            "Moonshot Kimi K3",
            k_paths=("args.num_experts_per_token",),
            routing="none",
            hybrid=True,
        ),
        _a("laguna", "Laguna MoE", k_paths=("gate.top_k",), routing="none", hybrid=True),
        _a(
            "longcat_flash",
            "Meituan LongCat-Flash (zero experts)",
            router="router",
            k_paths=("router.top_k",),
            routing="none",
            hybrid=True,
        ),
        _a("mellum", "JetBrains Mellum MoE", hybrid=True),
        _a(
            "mimo_v2_flash",
            "Xiaomi MiMo-V2-Flash",
            k_paths=_DEEPSEEK_K,
            routing="none",
            hybrid=True,
        ),
        _a(
            "minimax_m3_vl",
            "MiniMax-M3 VL text tower",
            k_paths=("num_experts_per_tok",),
            routing="none",
            hybrid=True,
        ),
        _a(
            "muse_spark",
            "Muse Spark MoE",
            refused=(
                "mlx-lm runs it only with Metal kernels (qk_norm_rope): not held against mlx-lm"
                " here; its recipe also keeps the first/last layers' experts unquantized (the"
                " index needs one layout)"
            ),
            switch="experts",
            routing="none",
            hybrid=True,
        ),
        _a(
            "phixtral",
            "Phixtral (Phi-2 experts)",
            k_paths=("num_experts_per_tok",),
            projections=("fc1", "fc2"),
        ),
        _a("step3p5", "StepFun Step-3.5", k_paths=("gate.top_k",), routing="none", hybrid=True),
    )
}

#: The attributes MoE blocks keep their SwitchGLU/SwitchMLP under (checkpoint.layout's
#: tensor-name pattern accepts these).
SWITCH_ATTRS: tuple[str, ...] = tuple(dict.fromkeys(a.switch for a in ARCHITECTURES.values()))

#: MLX quantization modes the engine streams (what mlx-lm's infer_quant_config can infer).
QUANT_MODES = ("affine", "mxfp4", "nvfp4", "mxfp8")
#: The one (bits, group size) each non-affine mode allows.
_MODE_SHAPES = {(4, 32): "mxfp4", (4, 16): "nvfp4", (8, 32): "mxfp8"}

#: MoE model types whose experts the engine streams.
STREAMED: dict[str, Architecture] = {k: a for k, a in ARCHITECTURES.items() if a.streamed}


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
    bias: bool = False  # each projection has its own bias per expert (gpt-oss)
    switch_path: str = ""  # the first MoE layer's SwitchGLU path (quantization overrides)


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
    n, k = num_experts(config), config_k(config)
    if n and k > n:
        raise ModelError(
            f"{where}num_experts_per_tok = {k} is more than the {n} experts per layer "
            "(the config is inconsistent; this is not about --k)"
        )


def num_experts(config: Mapping) -> int:
    """Routed experts per MoE layer named by the config keys (0 when none is), for what
    runs before a model is built; `moe_geometry` reads the built model."""
    tc = text_config(config)
    return _int(tc, "num_experts", "n_routed_experts", "num_local_experts", "moe_num_experts") or 0


_K_KEYS = ("num_experts_per_tok", "experts_per_token", "num_experts_per_token", "moe_k",
           "moe_topk", "moe_top_k", "top_k_experts", "top_k")  # fmt: skip


def config_k(config: Mapping) -> int:
    """The trained K a config names under any of its families' keys (0: none), for what
    runs before (or without) a built model."""
    return _int(text_config(config), *_K_KEYS, default=0) or 0


def trained_k(config: Mapping) -> int:
    """Experts the model was trained to route per token (0 when it cannot be told): the
    K the family's block holds once built (a class default included), else a config key."""
    try:
        geo = moe_geometry(config)
    except ModelError:
        geo = None
    return geo.trained_k if geo is not None else config_k(config)


def block_k(block, arch: Architecture | None) -> int:
    """The K a built routing block holds (the family's first `k_paths` entry; 0 when the
    family is unknown or the block has no such attribute)."""
    if arch is None:
        return 0
    try:
        return int(get_path(block, arch.k_paths[0]))
    except (AttributeError, KeyError, TypeError, ValueError):
        return 0


def routing_block_path(holder_path: str, arch: Architecture | None) -> str:
    """The routing block's module path: `arch.up` levels above the module that holds the
    SwitchGLU/SwitchMLP (the holder itself for every family but Gemma 4's)."""
    up = arch.up if arch is not None else 0
    return holder_path.rsplit(".", up)[0] if up else holder_path


#: Decoder layers sit in a list named `layers`, or `h` in the GPT-2 naming (Phixtral).
_LAYER_RE = re.compile(r"(?:^|\.)(?:layers|h)\.(\d+)(?=\.|$)")


def layer_number(prefix: str) -> int | None:
    """The decoder layer a module path belongs to (`model.layers.7.mlp` -> 7,
    `transformer.h.2.moe` -> 2)."""
    found = _LAYER_RE.findall(prefix)
    return int(found[-1]) if found else None


def family(config: Mapping) -> Architecture | None:
    """The table's entry for a config: its model_type, else its text tower's (a VL
    checkpoint such as Gemma 4's `gemma4` whose text config says `gemma4_text`)."""
    tc = text_config(config)
    names = (model_type(config), str(tc.get("model_type") or ""), model_type(tc))
    for mt in names:
        if mt in ARCHITECTURES:
            return ARCHITECTURES[mt]
    # a name mlx-lm builds as another model type (Kimi K2's config says kimi_k2, which
    # mlx-lm builds as deepseek_v3): its remapping, not a copy of it
    from mlx_lm.utils import MODEL_REMAPPING

    for mt in names:
        if MODEL_REMAPPING.get(mt) in ARCHITECTURES:
            return ARCHITECTURES[MODEL_REMAPPING[mt]]
    return None


def lazy_model(config: Mapping):  # -> nn.Module | None
    """mlx-lm's model for `config`, built without allocating a weight (MLX arrays are
    lazy until evaluated), or None when mlx-lm has no class for its model_type. The
    numbers it allocates by are checked first (`check_config_numbers`)."""
    from mlx_lm.utils import _get_classes  # no public equivalent: load_model takes it as a default

    check_config_numbers(config)
    cfg = json.loads(json.dumps(config))  # mlx-lm may keep and edit what it is given
    try:
        model_class, args_class = _get_classes(cfg)
    except ValueError:
        return None
    try:
        return model_class(args_class.from_dict(cfg))
    except Exception as e:  # noqa: BLE001 - a config mlx-lm's class rejects, in one line
        first = (str(e).splitlines() or [type(e).__name__])[0][:200]
        raise ConfigNotBuilt(
            f"config.json ({model_type(config)}): mlx-lm cannot build it: {first}"
        ) from None


class ConfigNotBuilt(ModelError):
    """A config mlx-lm's class rejects (a partial or inconsistent config.json): it cannot
    be loaded, and what it says is read from its keys alone (`moe_geometry`)."""


@dataclass(frozen=True)
class SwitchSite:
    """One MoE layer of a built model: the path of the module holding its SwitchGLU /
    SwitchMLP, the attribute it sits under, and the routing block (`Architecture.up`)."""

    path: str
    attr: str
    switch: object  # mlx_lm SwitchGLU | SwitchMLP
    block: object  # the module that routes (reads K, holds the router)
    block_path: str


def switch_sites(model, arch: Architecture | None = None) -> list[SwitchSite]:
    """Every SwitchGLU/SwitchMLP of `model` in layer order (MTP heads aside, as mlx-lm
    drops them), with its routing block `arch.up` levels above its holder."""
    from mlx_lm.models.switch_layers import SwitchGLU, SwitchMLP

    modules = dict(model.named_modules())
    sites = []
    for path, mod in modules.items():
        for attr, child in mod.children().items():
            if isinstance(child, SwitchGLU | SwitchMLP) and "mtp" not in path.split("."):
                block_path = routing_block_path(path, arch)
                sites.append(SwitchSite(path, attr, child, modules[block_path], block_path))
    return sorted(
        sites, key=lambda s: [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", s.path)]
    )


def get_path(obj, path: str):
    """`obj.a.b` for "a.b"; each step an attribute or a dict key (mlx modules are dicts)."""
    for part in path.split("."):
        obj = obj[part] if isinstance(obj, dict) and part in obj else getattr(obj, part)
    return obj


def set_path(obj, path: str, value) -> None:
    head, _, last = path.rpartition(".")
    target = get_path(obj, head) if head else obj
    if isinstance(target, dict) and last in target:
        target[last] = value
    else:
        setattr(target, last, value)


def _legacy_geometry(config: Mapping) -> MoeGeometry | None:
    """Expert shape from config keys alone, for a model_type mlx-lm cannot build (listed
    by `ssdmoe models`, never loaded): every layer is taken as MoE."""
    tc = text_config(config)
    n_exp = num_experts(config)
    if n_exp <= 0:
        return None
    k = config_k(config)
    hidden = _int(tc, "hidden_size", default=0) or 0
    n_layers = _int(tc, "num_hidden_layers", default=0) or 0
    inter = _int(tc, "moe_intermediate_size", "intermediate_size", default=0) or 0
    moe = tuple(range(n_layers))
    pattern = tc.get("hybrid_override_pattern")  # a layer pattern: E marks the MoE layers
    if isinstance(pattern, str | list) and pattern:
        pattern = "".join(pattern)
        n_layers, moe = len(pattern), tuple(i for i, c in enumerate(pattern) if c == "E")
    _check_complete(model_type(config), n_layers, hidden, inter, k)
    return MoeGeometry(
        model_type=model_type(config),
        num_layers=n_layers,
        moe_layers=moe,
        num_experts=n_exp,
        trained_k=k,
        hidden_size=hidden,
        expert_intermediate=inter,
        projections=fam.projections
        if (fam := family(config))
        else ("gate_proj", "up_proj", "down_proj"),
    )


def _check_complete(mt: str, n_layers: int, hidden: int, inter: int, k: int) -> None:
    if n_layers <= 0 or hidden <= 0 or inter <= 0 or k <= 0:
        raise ModelError(
            f"config.json ({mt or 'unknown model_type'}): expert shape incomplete "
            f"(layers={n_layers}, hidden_size={hidden}, expert size={inter}, top-k={k})"
        )


def moe_geometry(config: Mapping) -> MoeGeometry | None:
    """Expert shape of a model, or None for a dense one: mlx-lm's own model built lazily
    from the config says which layers are MoE and the experts' count, width, projections
    and biases; the family's first `k_paths` entry, on a routing block, the trained K."""
    mt = model_type(config)
    arch = family(config)
    if not num_experts(config) and arch is None:
        return None  # no MoE key and no MoE family: dense, without building anything
    try:
        model = lazy_model(config)
    except ConfigNotBuilt:
        model = None
    if model is None:
        return _legacy_geometry(config)
    sites = switch_sites(model, arch)
    if not sites:
        return None
    first = sites[0]
    projs = (
        ("gate_proj", "up_proj", "down_proj")
        if hasattr(first.switch, "gate_proj")
        else ("fc1", "fc2")
    )
    lin = getattr(first.switch, projs[0])
    k = block_k(first.block, arch) or config_k(config)
    layers = [layer_number(s.path) for s in sites]
    n_layers = _int(text_config(config), "num_hidden_layers", default=0) or 0
    n_layers = max(n_layers, max((n for n in layers if n is not None), default=-1) + 1)
    geo = MoeGeometry(
        model_type=arch.model_type if arch is not None else mt,
        num_layers=n_layers,
        moe_layers=tuple(n if n is not None else i for i, n in enumerate(layers)),
        num_experts=int(lin.weight.shape[0]),
        trained_k=k,
        hidden_size=int(lin.weight.shape[-1]),
        expert_intermediate=int(lin.weight.shape[1]),
        projections=projs,
        bias="bias" in lin,
        switch_path=f"{first.path}.{first.attr}",
    )
    _check_complete(mt, geo.num_layers, geo.hidden_size, geo.expert_intermediate, geo.trained_k)
    return geo


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

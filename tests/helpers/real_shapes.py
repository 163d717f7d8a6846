"""Real model shapes: checkpoints built from the real config.json files in
tests/fixtures/models, cut in depth and vocabulary (2048), with every expert at its real
width, count and quantization.

Two builders:
- `build_real` (qwen3_moe, qwen3_5_moe, nemotron_h: `CASES`): one MoE layer plus one layer
  of each other kind the architecture needs, 4-bit group 64, routers at 8 bits, every
  weight drawn and quantized by mlx-lm (tens of seconds each).
- `build_shape` (the giant models: `SHAPES`): the same cut, but the experts' packed codes
  are drawn directly (uniform random codes, one scale per group at the magnitude mlx's
  own init would quantize to) instead of drawing floats and quantizing them: a DeepSeek-V3
  MoE layer is 6.3 GB of experts, which mlx-lm's quantizer takes minutes to produce on two
  cores. Everything else (attention, dense layers, routers, norms, embeddings) is mlx-lm's
  own init, quantized by mlx-lm's `quantize_model` with the model's own predicate; routers
  mlx-lm initialises to zero (DeepSeek-V3's, GLM's gates) are drawn at random, as
  `write_checkpoint(random_routers=True)` does, so tokens route to different experts.
  gpt-oss keeps the release's format: MXFP4 experts (group 32, e8m0 scales) with bf16
  projection biases; its other matrices are 8-bit affine.
- `write_headers_only`: every tensor of a config's FULL shape, as safetensors headers over
  sparse files (holes) of the real sizes: what the index and the trace-driven engine read
  (the weights are zeros), without writing the 60+ GB.

tests/conftest.py's `real_checkpoints` builds each `CASES` entry once per session;
tests/engine/test_real_shapes.py builds each `SHAPES` entry once per session and removes it
at the end (they are large).
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import shutil
import struct
from dataclasses import dataclass, field
from pathlib import Path

import mlx.core as mx

from ssdmoe_tui.models.demo import _router_param, save_quantized, write_checkpoint, write_tokenizer
from tests.helpers.fixture_paths import MODELS

CASES = {
    "qwen3_moe": ("qwen3-30b-a3b/config.json", 128, 8),
    "qwen3_5_moe": ("qwen3.5-35b-a3b/config.reconstructed.json", 256, 8),
    "nemotron_h": ("nemotron-3-nano-30b-a3b/config.json", 128, 6),
}

VOCAB = 2048


def reduced(config: dict) -> dict:
    cfg = json.loads(json.dumps(config))
    cfg.pop("quantization", None)
    cfg.pop("quantization_config", None)
    text = cfg.get("text_config", cfg)
    text["vocab_size"] = VOCAB
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


# --------------------------------------------------------------------------- the giants

#: The MLX quantization of gpt-oss's experts in the release (the HF checkpoint's own
#: MXFP4 blocks, which mlx-lm keeps packed).
MXFP4 = {"group_size": 32, "bits": 4, "mode": "mxfp4"}


@dataclass(frozen=True)
class Shape:
    """One real config and how its reduced checkpoint is cut. `edits`: text-config keys
    set after the vocabulary cut (the layer count, and the keys that say which layer is
    of which kind); `quant`: "affine" (4-bit group 64, what mlx-community's 4-bit
    conversions use) or "mxfp4" (gpt-oss). `slow`: in `make test-slow` only.
    `embed_scale` shrinks the random embedding: Gemma multiplies its input embedding by
    sqrt(hidden) and ties it to the output, so at mlx's init the residual stays the input
    token's own row and a random model repeats the prompt's last token forever (a test of
    exactness on one repeated token proves little)."""

    name: str
    model: str  # the release the config is of (its Hub repository)
    config: str
    edits: dict = field(default_factory=dict)
    quant: str = "affine"
    slow: bool = True
    note: str = ""
    embed_scale: float = 1.0  # < 1 where a random model would echo its input (tied, scaled)

    def real_config(self) -> dict:
        return json.loads((MODELS / self.config).read_text())


def _sliding_full(config: dict) -> dict:
    """The first layer of each attention kind of `layer_types` (one sliding, one full)."""
    kinds = list(dict.fromkeys(config.get("text_config", config)["layer_types"]))
    return {"num_hidden_layers": len(kinds), "layer_types": kinds}


SHAPES: dict[str, Shape] = {
    s.name: s
    for s in (
        # every gpt-oss layer is MoE; one sliding-window layer and one full one (mlx-lm's
        # gpt-oss needs one of each)
        Shape("gpt-oss-20b", "openai/gpt-oss-20b", "gpt-oss-20b/config.json", quant="mxfp4",
              slow=False),
        Shape("gpt-oss-120b", "openai/gpt-oss-120b", "gpt-oss-120b/config.json", quant="mxfp4"),
        # one dense layer (first_k_dense_replace) and one MoE layer
        Shape("deepseek-v3", "deepseek-ai/DeepSeek-V3", "deepseek-v3/config.json",
              {"num_hidden_layers": 2, "first_k_dense_replace": 1}),
        # written as deepseek_v3, the model type mlx-lm builds kimi_k2 as: transformers 5.25
        # does not know kimi_k2, so the test checkpoint's own tokenizer would not load (the
        # release ships tokenizer code instead); test_each_real_config_is_accepted_as_its_family
        # holds the genuine kimi_k2 config to the deepseek_v3 entry
        Shape("kimi-k2", "moonshotai/Kimi-K2-Instruct", "kimi-k2/config.json",
              {"num_hidden_layers": 2, "model_type": "deepseek_v3"}),
        Shape("glm-4.5-air", "zai-org/GLM-4.5-Air", "glm-4.5-air/config.json", {"num_hidden_layers": 2}),
        # gated DeltaNet + full attention, both MoE
        Shape("qwen3-next-80b-a3b", "Qwen/Qwen3-Next-80B-A3B-Thinking",
              "qwen3-next-80b-a3b/config.json",
              {"num_hidden_layers": 2, "full_attention_interval": 2}),
        Shape("qwen3-235b-a22b", "Qwen/Qwen3-235B-A22B", "qwen3-235b-a22b/config.json", {"num_hidden_layers": 1}),
        Shape("gemma-4-26b-a4b", "google/gemma-4-26B-A4B", "gemma-4-26b-a4b/config.json",
              embed_scale=0.05),
        Shape("qwen3.5-35b-a3b", "Qwen/Qwen3.5-35B-A3B", "qwen3.5-35b-a3b/config.json",
              {"num_hidden_layers": 2, "full_attention_interval": 2,
               "layer_types": ["linear_attention", "full_attention"]}),
        Shape("llama-4-scout", "meta-llama/Llama-4-Scout-17B-16E",
              "llama-4-scout/derived-not-genuine/trimmed-config.json",
              {"num_hidden_layers": 4},  # mlx-lm's llama4 needs its first global layer (4th)
              note="a config derived from Llama-4-Scout's, not the genuine file (SOURCES.md)"),
    )
}  # fmt: skip

#: Configs whose reduced shape is another entry's: DeepSeek-R1 is DeepSeek-V3's
#: architecture with other weights (the test checks that every key mlx-lm reads agrees).
SAME_SHAPE = {"deepseek-ai/DeepSeek-R1": ("deepseek-r1/config.json", "deepseek-v3")}


def reduced_shape(shape: Shape) -> dict:
    """The real config cut to a few layers and a 2048-token vocabulary (nothing else changes:
    experts keep their count and width, attention its heads and sizes)."""
    cfg = shape.real_config()
    cfg.pop("quantization", None)
    cfg.pop("quantization_config", None)
    # the release's Python files it names (Kimi K2: kimi_k2 is no transformers type, so its
    # tokenizer would ask to run them): the test checkpoint ships none, and its own tokenizer
    cfg.pop("auto_map", None)
    text = cfg.get("text_config", cfg)
    text["vocab_size"] = VOCAB
    if text is not cfg:  # mlx-lm's gemma4 copies its own (default 262144) into the text's
        cfg["vocab_size"] = VOCAB
    if "vocab_size_per_layer_input" in text:
        text["vocab_size_per_layer_input"] = VOCAB
    text.update(_sliding_full(cfg) if "layer_types" in text and not shape.edits else shape.edits)
    return cfg


def _predicate(model, quant: str):  # noqa: ANN202 - mlx-lm's quant_predicate signature
    """The model's own predicate (routers at 8 bits), and for "mxfp4" the experts in MXFP4."""
    own = getattr(model, "quant_predicate", None)

    def pick(path: str, module):  # noqa: ANN001, ANN202
        if quant == "mxfp4" and ".experts." in f"{path}.":
            return dict(MXFP4)
        return own(path, module) if own is not None else True

    return pick


def lazy_quantized(
    config: dict, quant: str, seed: int = 0, embed_scale: float = 1.0
):  # -> (nn.Module, dict)
    """mlx-lm's model of `config`, initialised as `write_checkpoint` does (x4 matrices,
    bfloat16; embeddings x `embed_scale`) and quantized by mlx-lm, all lazily: nothing is
    computed until saved."""
    from mlx.utils import tree_map_with_path
    from mlx_lm.utils import _get_classes, quantize_model

    mx.random.seed(seed)
    model_class, args_class = _get_classes(config)
    model = model_class(args_class.from_dict(json.loads(json.dumps(config))))
    cast = getattr(model, "cast_predicate", lambda _: True)

    def init(p: str, v):  # noqa: ANN001, ANN202
        if not mx.issubdtype(v.dtype, mx.floating):
            return v
        if _router_param(p) and not mx.any(v).item():  # as write_checkpoint(random_routers=)
            v = mx.random.normal(v.shape) * (0.5 if v.ndim == 1 else v.shape[-1] ** -0.5)
        if p.endswith("weight") and v.ndim >= 2:
            v = v * (embed_scale if "embed" in p else 4.0)
        return v.astype(mx.bfloat16) if cast(p) else v

    model.update(tree_map_with_path(init, model.parameters()))
    bits = 8 if quant == "mxfp4" else 4
    with contextlib.redirect_stdout(io.StringIO()):  # mlx-lm prints its bits per weight
        model, qconfig = quantize_model(
            model, config, 64, bits, quant_predicate=_predicate(model, quant)
        )
    return model, qconfig


def _random_codes(shape: tuple[int, ...]) -> mx.array:
    """Random packed codes for a stack of experts: one uniform random matrix, each expert's
    rows XORed with their own random word (so every expert's matrix differs: each of its
    rows is the base row with its 4-bit codes remapped by another mask). Drawing every
    word would cost 4x the time for no more coverage: the test needs distinct experts."""
    experts, rows, words = shape
    base = mx.random.randint(0, 256, (rows, words * 4), dtype=mx.uint8).view(mx.uint32)
    keys = mx.random.randint(0, 256, (experts, rows, 4), dtype=mx.uint8).view(mx.uint32)
    return base[None] ^ keys


def draw_experts(model, family) -> None:  # noqa: ANN001
    """Replace every expert projection's packed weights with uniform random codes and its
    scales with the magnitude mlx's init (uniform in +-a, a = 4/sqrt(inputs)) quantizes
    to: affine, scale 2a/15 and bias -a per group; MXFP4, the power of two that gives the
    e2m1 codes that spread. Projection biases (gpt-oss) are drawn uniform in +-a/4."""
    from ssdmoe_tui.checkpoint.arch import switch_sites

    for site in switch_sites(model, family):
        for proj in family.projections:
            lin = getattr(site.switch, proj)
            inputs = lin.weight.shape[-1] * 32 // lin.bits
            a = 4.0 / math.sqrt(inputs)
            lin.weight = _random_codes(lin.weight.shape)
            if lin.mode == "affine":
                step = 2 * a / ((1 << lin.bits) - 1)
                lin.scales = mx.full(lin.scales.shape, step, dtype=lin.scales.dtype)
                lin.biases = mx.full(lin.biases.shape, -a, dtype=lin.biases.dtype)
            else:  # e8m0: 2**(s - 127); uniform e2m1 codes have an rms of 2.93
                e = round(math.log2(a / math.sqrt(3) / 2.93))
                lin.scales = mx.full(lin.scales.shape, 127 + e, dtype=mx.uint8)
            if "bias" in lin:
                lin.bias = mx.random.uniform(-a / 4, a / 4, lin.bias.shape).astype(mx.bfloat16)


def build_shape(name: str, out: Path) -> Path:
    """`SHAPES[name]`'s reduced checkpoint in `out` (built once: an existing one is kept)."""
    from ssdmoe_tui.checkpoint.arch import family

    if (out / "config.json").exists():
        return out
    shape = SHAPES[name]
    config = reduced_shape(shape)
    model, qconfig = lazy_quantized(config, shape.quant, embed_scale=shape.embed_scale)
    draw_experts(model, family(config))
    out.mkdir(parents=True, exist_ok=True)
    write_tokenizer(out, vocab_size=1024)
    save_quantized(model, qconfig, out, max_shard_bytes=2 << 30)
    return out


# --------------------------------------------------------------------------- headers only

_DTYPES = {
    mx.uint32: "U32", mx.uint8: "U8", mx.bfloat16: "BF16", mx.float16: "F16",
    mx.float32: "F32", mx.int32: "I32",
}  # fmt: skip


def write_headers_only(config: dict, out: Path, quant: str, shard_bytes: int = 5 << 30) -> int:
    """Every tensor of `config`'s shape (mlx-lm's model, quantized as `build_shape` does),
    written as safetensors headers over sparse data of the real sizes: the files read as
    zeros and take no disk. Nothing is computed (the shapes come from the lazy model).
    Returns the bytes the data would take."""
    from mlx.utils import tree_flatten
    from mlx_lm.utils import save_config

    model, qconfig = lazy_quantized(config, quant)
    tensors = dict(tree_flatten(model.parameters()))
    out.mkdir(parents=True, exist_ok=True)
    shards: list[list[str]] = [[]]
    size = 0
    for k, v in tensors.items():
        if shards[-1] and size + v.nbytes > shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append(k)
        size += v.nbytes
    n, total, weight_map = len(shards), 0, {}
    for i, names in enumerate(shards):
        fname = f"model-{i + 1:05d}-of-{n:05d}.safetensors"
        header: dict = {"__metadata__": {"format": "mlx"}}
        offset = 0
        for k in names:
            v = tensors[k]
            header[k] = {
                "dtype": _DTYPES[v.dtype],
                "shape": list(v.shape),
                "data_offsets": [offset, offset + v.nbytes],
            }
            offset += v.nbytes
            weight_map[k] = fname
        raw = json.dumps(header, separators=(",", ":")).encode()
        raw += b" " * (-len(raw) % 8)
        with open(out / fname, "wb") as f:
            f.write(struct.pack("<Q", len(raw)) + raw)
            f.truncate(8 + len(raw) + offset)  # a hole: reads as zeros, takes no blocks
        total += offset
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=4))
    save_config(qconfig, out / "config.json")
    write_tokenizer(out, vocab_size=1024)
    return total


def allocated_bytes(folder: Path) -> int:
    """Disk blocks the folder's files take (a sparse file: far below its size)."""
    return sum(os.stat(f).st_blocks * 512 for f in folder.iterdir() if f.is_file())

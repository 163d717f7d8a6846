"""The embedded demo model, and random-weight MoE checkpoints in the mlx-community layout.

The embedded default model (`ssdmoe demo-model`) is a tiny qwen3_moe trained here by
`scripts/train_demo.py`; it ships in the package (`demo_trained/`) and is copied to the
data folder on first use. Random-weight checkpoints serve the tests (`write_random_demo`,
the old demo's shape) and full-size synthetic checkpoints of real configs (`--config`). The model is built
with mlx-lm's own classes, cast to bfloat16, quantized with mlx-lm's
`quantize_model` (the model's own predicate, so routers stay at 8 bits where
mlx-community keeps them there) and written shard by shard: arrays are lazy, so
only one shard's tensors are ever materialised, which keeps memory bounded for
multi-GB checkpoints.
"""

from __future__ import annotations

import contextlib
import io
import json
import shutil
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from ssdmoe_tui.errors import ModelError
from ssdmoe_tui.paths import demo_model_dir
from ssdmoe_tui.units import human_bytes

DEMO_VERSION = 7

#: Where the trained demo ships inside the package.
TRAINED_DIR = Path(__file__).resolve().parent / "demo_trained"

#: The tests' random-weight demo: a small qwen3_moe (the Qwen3-30B-A3B architecture).
DEMO_CONFIG: dict = {
    "model_type": "qwen3_moe",
    "architectures": ["Qwen3MoeForCausalLM"],
    "hidden_size": 256,
    "num_hidden_layers": 6,
    "intermediate_size": 512,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "rms_norm_eps": 1e-6,
    "vocab_size": 1024,
    "decoder_sparse_step": 1,
    "mlp_only_layers": [],
    "num_experts_per_tok": 4,
    "num_experts": 32,
    "moe_intermediate_size": 256,
    "norm_topk_prob": True,
    "rope_theta": 1000000.0,
    "max_position_embeddings": 4096,
    "tie_word_embeddings": False,
    "bos_token_id": None,
    "eos_token_id": 2,
}

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

#: The trained demo's template: ChatML with Qwen3's tool format, less its thinking. The
#: tools go into the system turn as JSON lines inside <tools>, a call comes back as
#: <tool_call>{"name", "arguments"}</tool_call> (mlx-lm infers its `json_tools` parser
#: from `<tool_call>` and `tool_call.name` here), results go in as a user turn of
#: <tool_response> blocks. The demo was trained on dialogues rendered by this very text
#: (scripts/demo_dialogues.py), so what the app sends is what it learned.
DEMO_TEMPLATE = (
    "{%- if tools %}{{- '<|im_start|>system\\n' }}"
    "{%- if messages[0].role == 'system' %}{{- messages[0].content + '\\n\\n' }}{%- endif %}"
    "{{- '# Tools\\n\\nYou may call functions to answer. Their signatures are in <tools>:\\n"
    "<tools>' }}"
    "{%- for tool in tools %}{{- '\\n' }}{{- tool | tojson }}{%- endfor %}"
    '{{- \'\\n</tools>\\n\\nTo call one, write <tool_call>\\n{"name": <function-name>, '
    '"arguments": <args-json-object>}\\n</tool_call><|im_end|>\\n\' }}'
    "{%- elif messages[0].role == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'user' or (message.role == 'system' and not loop.first) %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- elif message.role == 'assistant' %}"
    "{{- '<|im_start|>assistant\\n' + (message.content or '') }}"
    "{%- for tool_call in (message.tool_calls or []) %}"
    "{%- if (loop.first and message.content) or not loop.first %}{{- '\\n' }}{%- endif %}"
    "{%- if tool_call.function %}{%- set tool_call = tool_call.function %}{%- endif %}"
    '{{- \'<tool_call>\\n{"name": "\' + tool_call.name + \'", "arguments": \' }}'
    "{%- if tool_call.arguments is string %}{{- tool_call.arguments }}"
    "{%- else %}{{- tool_call.arguments | tojson }}{%- endif %}"
    "{{- '}\\n</tool_call>' }}"
    "{%- endfor %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- elif message.role == 'tool' %}"
    "{%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}"
    "{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' + message.content + '\\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}"
    "{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

_CORPUS = """
The quick brown fox jumps over the lazy dog. A mixture of experts routes each token
to a few experts out of many. Streaming experts from a solid state drive lets a
laptop run a model larger than its memory. Hello! How are you today? I am fine,
thank you. What is the capital of France? Paris is the capital of France.
def main():\n    print("hello world")\n    return 0\n
Markdown has **bold**, *italics*, `code`, lists:\n- one\n- two\n1. first\n2. second
Numbers: 0 1 2 3 4 5 6 7 8 9 10 100 1000. Questions, answers, and conversations.
"""

#: Everyday words, so the trained BPE merges whole words and a random model's output
#: reads as word salad rather than byte soup.
_WORDS = """the of and to in is that it for as with was on be by this are from at or an have not
which but all they one can has more will their there been would when so if about out what some
them into other than then now only its also after two new first way could because these may use
any over such time most very even well where through back much before must right still own good
memory model expert experts token tokens layer layers cache disk drive stream streaming read reads
fast faster slow speed weight weights router route routes routing attention state hidden vector
matrix compute answer question hello world python code function value list table text chat reply
think simple small large larger many few each every bytes file files open close load loaded run
learn learning data train trained source terminal window screen panel key keys light dark theme
color number numbers count rate hit miss page system prompt user assistant message session save
resume history context Paris France London Tokyo river mountain ocean forest city garden music
poem story book letter happy calm bright quiet gentle curious clever kind brave honest warm cool
green blue red yellow morning evening night today tomorrow always never often sometimes together"""


def _corpus() -> list[str]:
    import random

    rng = random.Random(1)
    words = _WORDS.split()
    lines = [_CORPUS]
    for _ in range(600):
        sent = " ".join(rng.choice(words) for _ in range(rng.randint(5, 14)))
        lines.append(sent.capitalize() + rng.choice(".,.?!."))
    return lines


ProgressFn = Callable[[str], None]


def _noop(_: str) -> None:
    pass


def write_tokenizer(
    out: Path,
    vocab_size: int,
    chat_template: str = CHATML_TEMPLATE,
    extra_special: tuple[str, ...] = (),
) -> int:
    """Train a small byte-level BPE on an embedded corpus and save it HF-style.

    Returns the tokenizer's vocabulary size (special tokens included). The ids of
    the special tokens are 0, 1, 2 (`<|endoftext|>`, `<|im_start|>`, `<|im_end|>`),
    then `extra_special` (e.g. `<think>`, `</think>` for a thinking template's tests).
    """
    specials = SPECIAL_TOKENS + list(extra_special)
    tok = train_bpe(_corpus(), vocab_size, specials)
    save_tokenizer(tok, out, specials, chat_template)
    return tok.get_vocab_size()


def train_bpe(texts: Iterable[str], vocab_size: int, specials: list[str]):  # -> Tokenizer
    """A byte-level BPE trained on `texts`, `specials` first (ids 0, 1, ...): the demo's
    and `scripts/train_demo.py`'s tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return tok


def save_tokenizer(tok, out: Path, specials: list[str], chat_template: str) -> None:  # noqa: ANN001
    """`tok` saved the way mlx-lm and transformers load it (a ChatML chat template)."""
    out.mkdir(parents=True, exist_ok=True)
    tok.save(str(out / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "unk_token": None,
        "model_max_length": 4096,
        "clean_up_tokenization_spaces": False,
        "chat_template": chat_template,
        "added_tokens_decoder": {
            str(i): {
                "content": t,
                "special": True,
                "lstrip": False,
                "rstrip": False,
                "normalized": False,
                "single_word": False,
            }
            for i, t in enumerate(specials)
        },
    }
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2))
    (out / "special_tokens_map.json").write_text(
        json.dumps({"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}, indent=2)
    )
    (out / "chat_template.jinja").write_text(chat_template)


def _shard_plan(weights: dict, max_shard_bytes: int) -> list[list[str]]:
    shards: list[list[str]] = []
    size = 0
    for name, arr in weights.items():
        if not shards or size + arr.nbytes > max_shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append(name)
        size += arr.nbytes
    return shards


def write_checkpoint(
    config: dict,
    out: Path,
    *,
    seed: int = 0,
    group_size: int = 64,
    bits: int = 4,
    mode: str = "affine",
    max_shard_bytes: int = 5 << 30,
    tokenizer_from: Path | None = None,
    progress: ProgressFn = _noop,
    readme: str | None = None,
    weight_scale: float = 4.0,
    readable: bool = False,
    random_routers: bool = False,
) -> Path:
    """Write a random-weight, quantized checkpoint of `config` into `out`.

    `tokenizer_from`: copy tokenizer files from this folder; otherwise a small
    ChatML BPE tokenizer is trained and written. `weight_scale` multiplies the
    default init of every matrix but embeddings: at mlx's default scale a random
    model repeats one token forever, at 4x it produces varied tokens, which makes
    exactness tests meaningful and the demo livelier. `random_routers`: router weights and
    correction biases that mlx-lm initialises to zero (DeepSeek-V3's, GLM's, MiniMax's
    gates) get random values instead, so the router picks different experts per token
    rather than breaking an all-way tie the same way every time.
    """
    import mlx.core as mx
    from mlx.utils import tree_map_with_path
    from mlx_lm.utils import _get_classes, quantize_model

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    config = json.loads(json.dumps(config))  # deep copy, plain JSON types
    mx.random.seed(seed)

    if tokenizer_from is not None:
        copy_tokenizer(Path(tokenizer_from), out)
    else:
        write_tokenizer(out, vocab_size=min(int(_text_config(config)["vocab_size"]), 1024))

    model_class, args_class = _get_classes(config)
    model = model_class(args_class.from_dict(config))
    cast_predicate = getattr(model, "cast_predicate", lambda _: True)

    def init(p: str, v):
        if not mx.issubdtype(v.dtype, mx.floating):
            return v
        if random_routers and _router_param(p) and not mx.any(v).item():
            v = mx.random.normal(v.shape) * (0.5 if v.ndim == 1 else v.shape[-1] ** -0.5)
        if weight_scale != 1.0 and p.endswith("weight") and v.ndim >= 2 and "embed" not in p:
            v = v * weight_scale
        return v.astype(mx.bfloat16) if cast_predicate(p) else v

    model.update(tree_map_with_path(init, model.parameters()))
    if readable:
        _quiet_rows(model, unreadable_token_ids(out, int(_text_config(config)["vocab_size"])))
    config.pop("quantization", None)
    config.pop("quantization_config", None)
    with contextlib.redirect_stdout(io.StringIO()):  # mlx-lm prints "[INFO] Quantized model ..."
        model, qconfig = quantize_model(model, config, group_size, bits, mode=mode)
    save_quantized(model, qconfig, out, max_shard_bytes=max_shard_bytes, progress=progress)
    if readme:
        (out / "README.md").write_text(readme)
    return out


def _router_param(path: str) -> bool:
    """A router's weight or per-expert correction bias (`...gate.weight`, `...router.weight`,
    `...e_score_correction_bias`, `...expert_bias`)."""
    last = path.rsplit(".", 2)
    return path.endswith(("e_score_correction_bias", "expert_bias")) or (
        len(last) == 3 and last[-2] in ("gate", "router") and last[-1] == "weight"
    )


def copy_tokenizer(source: Path, out: Path) -> None:
    """Copy a checkpoint's tokenizer and template files (not its config or weights)."""
    for f in Path(source).iterdir():
        if (
            f.is_file()
            and f.suffix in (".json", ".txt", ".jinja", ".model")
            and f.name != "config.json"
            and not f.name.startswith("model")
        ):
            shutil.copy(f, out / f.name)


def save_quantized(
    model, qconfig: dict, out: Path, *, max_shard_bytes: int, progress: ProgressFn = _noop
) -> int:
    """Write a quantized mlx-lm model into `out` in the mlx-community layout: sharded
    safetensors, their index and config.json (with its "quantization" block). Shard by
    shard: lazy arrays are materialised one shard at a time, so memory stays bounded.
    Returns the weights' bytes."""
    import mlx.core as mx
    from mlx.utils import tree_flatten
    from mlx_lm.utils import save_config

    from ssdmoe_tui.atomic import DiskFullError, free_bytes, is_disk_full

    weights = dict(tree_flatten(model.parameters()))
    needed = sum(a.nbytes for a in weights.values())  # shapes are known before any eval
    free = free_bytes(out)
    if free is not None and free < needed:
        raise DiskFullError(out / "model.safetensors", needed)
    plan = _shard_plan(weights, max_shard_bytes)
    n = len(plan)
    fmt = "model-{:05d}-of-{:05d}.safetensors" if n > 1 else "model.safetensors"
    weight_map: dict[str, str] = {}
    total = 0
    t0 = time.monotonic()
    for i, names in enumerate(plan):
        shard = {k: weights.pop(k) for k in names}
        fname = fmt.format(i + 1, n)
        try:
            mx.save_safetensors(str(out / fname), shard, metadata={"format": "mlx"})
        except Exception as e:  # MLX hides ENOSPC in a RuntimeError
            if is_disk_full(e, out, needed - total):
                raise DiskFullError(out / fname, needed - total) from None
            raise
        for k in names:
            weight_map[k] = fname
            total += shard[k].nbytes
        del shard
        mx.clear_cache()
        progress(
            f"wrote {fname} ({i + 1}/{n}, {human_bytes(total)}, {time.monotonic() - t0:.0f} s)"
        )
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=4))
    save_config(qconfig, out / "config.json")
    return total


def _quiet_rows(model, token_ids: list[int]) -> None:
    """Zero these tokens' output-embedding rows: their logit is 0 while readable tokens
    reach well above it, so a random model rarely emits them."""
    import mlx.core as mx

    head = getattr(model, "lm_head", None)
    if head is None or not hasattr(head, "weight"):
        return
    mask = mx.ones((head.weight.shape[0], 1), dtype=head.weight.dtype)
    ids = mx.array([i for i in token_ids if i < head.weight.shape[0]])
    mask[ids] = 0
    head.weight = head.weight * mask


def unreadable_token_ids(model_dir: Path, vocab_size: int) -> list[int]:
    """Ids a chat demo should not emit: all but whole words (" word"), a little
    punctuation and the end-of-turn token, so random output reads as word salad."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(Path(model_dir) / "tokenizer.json"))
    eot = tok.token_to_id("<|im_end|>")
    keep_punct = {".", ",", "?", "!", "\n"}
    bad = []
    for i in range(vocab_size):
        if i == eot:
            continue
        text = tok.decode([i]) if tok.id_to_token(i) is not None else ""
        word = text.startswith(" ") and text[1:].isalpha()
        if not (word or text in keep_punct):
            bad.append(i)
    return bad


def _text_config(config: dict) -> dict:
    return config.get("text_config", config)


RANDOM_README = """# ssdmoe random-weight demo checkpoint

A tiny **random-weight** Mixture-of-Experts checkpoint (`qwen3_moe`: {layers} layers,
{experts} experts, {k} per token) at toy width, in the exact mlx-community layout (4-bit,
stacked `switch_mlp` experts, sharded safetensors, a ChatML tokenizer). Its replies are word
salad: it exists for tests. The embedded demo (`ssdmoe demo-model`) is the trained one.
"""

DEMO_README = """# ssdmoe demo model

A tiny Mixture-of-Experts model **trained by this project** (`scripts/train_demo.py`,
{steps} steps on {device}): a `qwen3_moe` (the Qwen3-30B-A3B architecture) with {layers}
layers, {experts} experts, {k} per token, {params:.1f} M parameters and a {vocab}-token BPE
vocabulary, trained on {tokens:.0f} M tokens (about {epochs:.0f} passes) of English
documentation that ships with Linux distributions (manual pages, GNU manuals, Vim's help,
package documentation, Python's docstrings; licences in docs/quality.md) and a few
thousand tool-use dialogues, 4-bit in the mlx-community layout.

It is tiny and often wrong, but it has learned: on English prose it never saw its
perplexity is far below a random model's, its routing has the locality the expert cache
lives on, and given MCP tools it calls them in its template's format (see
docs/quality.md). It exists so the app, the streaming engine and the tests run on any
machine without a download. Point `ssdmoe --model` at a real checkpoint (e.g.
`mlx-community/Qwen3-30B-A3B-4bit`) to chat. Version {version}.
"""


def write_random_demo(out: Path, progress: ProgressFn = _noop) -> Path:
    """The random-weight checkpoint of DEMO_CONFIG (the demo before it was trained): a
    model that never stops on its own, which the app's long-generation tests need."""
    cfg = DEMO_CONFIG
    return write_checkpoint(
        cfg,
        Path(out),
        seed=7,
        group_size=32,
        max_shard_bytes=3 << 20,
        readable=True,
        progress=progress,
        readme=RANDOM_README.format(
            layers=cfg["num_hidden_layers"], experts=cfg["num_experts"],
            k=cfg["num_experts_per_tok"],
        ),
    )  # fmt: skip


def _demo_readme() -> str:
    cfg = json.loads((TRAINED_DIR / "config.json").read_text())
    info = json.loads((TRAINED_DIR / "training.json").read_text())
    train = info["training"]
    # a fine-tune follows its base (and the fine-tunes between)
    runs = [r for r in (info.get("pretraining"), *info.get("finetunes", []), train) if r]
    steps = sum(r["kept_step"] for r in runs)
    tokens = sum(r["kept_step"] * r["batch"] * r["seq"] for r in runs)
    return DEMO_README.format(
        layers=cfg["num_hidden_layers"],
        experts=cfg["num_experts"],
        k=cfg["num_experts_per_tok"],
        params=train["parameters"] / 1e6,
        vocab=cfg["vocab_size"],
        steps=steps,
        device=train["device"],
        tokens=tokens / 1e6,
        epochs=tokens / info["corpus"]["train_tokens"],
        version=DEMO_VERSION,
    )


def ensure_demo_model(
    out: Path | None = None, progress: ProgressFn = _noop, *, force: bool = False
) -> Path:
    """Return the demo model folder, copying the shipped trained model there first if it
    is missing, stale or `force`d.

    The folder is replaced whole, so only an empty folder or one this function wrote (it
    has the `.ssdmoe-demo` stamp) is ever replaced: `--out ~/work` must not delete work."""
    out = Path(out) if out is not None else demo_model_dir()
    stamp = out / ".ssdmoe-demo"
    if stamp.is_file() and stamp.read_text().strip() == str(DEMO_VERSION) and not force:
        return out
    if out.exists() and not stamp.is_file() and (not out.is_dir() or any(out.iterdir())):
        raise ModelError(
            f"{out} exists and is not a demo model folder: nothing written (choose another folder)"
        )
    if not (TRAINED_DIR / "model.safetensors").is_file():
        raise ModelError(f"the packaged demo model is missing ({TRAINED_DIR}): reinstall ssdmoe")
    progress(f"creating the demo model in {out} (first run only)")
    from ssdmoe_tui.atomic import atomic_folder

    files = sorted(f for f in TRAINED_DIR.iterdir() if f.is_file() and f.suffix != ".py")
    with atomic_folder(out, replace=True) as tmp:
        for i, f in enumerate(files):
            shutil.copyfile(f, tmp / f.name)
            progress(f"wrote {f.name} ({i + 1}/{len(files)}, {human_bytes(f.stat().st_size)})")
        (tmp / "README.md").write_text(_demo_readme())
        (tmp / ".ssdmoe-demo").write_text(str(DEMO_VERSION))
    progress(f"demo model ready: {out}")
    return out

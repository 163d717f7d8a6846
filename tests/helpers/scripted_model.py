"""A real checkpoint whose greedy decoding is a script: it emits a fixed tool call, and,
once a tool's result is in its context, a fixed answer.

Qwen3's MoE architecture (mlx-lm's own classes, quantized like every test checkpoint,
4 bits, group 32), the genuine Qwen3 tokenizer and chat template from tests/fixtures,
and weights set by hand rather than at random:

* every MoE expert and every attention output but one is zero, so the residual stream
  at a position is its token's embedding: a one-hot on the token's own dimension (only
  the tokens of the script have one; the rest embed to zero);
* the LM head maps each script token's dimension to the next token of the script
  (a bigram: the script is tokenized so that no token occurs twice);
* one attention head of layer 0 tells the two replies apart: the query of the reply's
  first position (the `\\n` after `assistant`) matches only the key of
  `<tool_response>` (RoPE's slowest pair, so distance barely matters), and its value
  writes a flag dimension the LM head reads to pick the answer instead of the call.

Every matrix holds at most two values per quantization group (0 and one other), which
4-bit affine quantization stores exactly. Nothing of the engine is changed: the app
and the server run it as any other checkpoint."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

from tests.helpers.fixture_paths import MODELS

QWEN3 = MODELS / "qwen3-30b-a3b"
CALL = '{"name":"get_weather","arguments":{"city":"Paris"}}'  # compact: fewer quote pieces
ANSWER = "It is 21 C and sunny in Paris."
CONFIG = {
    "model_type": "qwen3_moe",
    "hidden_size": 128,
    "num_hidden_layers": 2,
    "intermediate_size": 64,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "rms_norm_eps": 1e-6,
    "vocab_size": 151936,
    "decoder_sparse_step": 1,
    "mlp_only_layers": [],
    "num_experts_per_tok": 2,
    "num_experts": 8,
    "moe_intermediate_size": 32,
    "norm_topk_prob": True,
    "rope_theta": 1000000.0,
    "max_position_embeddings": 4096,
    "tie_word_embeddings": False,
    "eos_token_id": 151645,
}


def _byte_chars() -> dict[int, str]:
    """GPT-2's byte -> printable character map (byte-level BPE vocabularies)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(161, 173)) + list(range(174, 256))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs, strict=True)}


def unique_tokens(vocab: dict[str, int], text: str, used: set[int]) -> list[int]:
    """Token ids spelling `text` in which no id is in `used` or occurs twice (longest
    pieces first, backtracking); adds them to `used`."""
    chars = _byte_chars()
    coded = "".join(chars[b] for b in text.encode())

    def search(at: int) -> list[int] | None:
        if at == len(coded):
            return []
        for end in range(min(len(coded), at + 16), at, -1):
            tid = vocab.get(coded[at:end])
            if tid is None or tid in used:
                continue
            used.add(tid)
            rest = search(end)
            if rest is not None:
                return [tid, *rest]
            used.discard(tid)
        return None

    found = search(0)
    if found is None:
        raise ValueError(f"no tokenization of {text!r} without a repeated token")
    return found


def script_tokens(
    vocab: dict[str, int], added: dict[str, int], text: str, used: set[int]
) -> list[int]:
    """`text` as token ids: its added tokens (`added`, e.g. GLM's `<arg_key>`) whole, the
    text between them spelt by `unique_tokens` (no id twice in the whole script)."""
    names = sorted(added, key=len, reverse=True)
    pattern = "(" + "|".join(re.escape(n) for n in names) + ")"
    ids: list[int] = []
    for part in re.split(pattern, text):
        if part in added:
            if added[part] in used:
                raise ValueError(f"{part} occurs twice in the script")
            used.add(added[part])
            ids.append(added[part])
        elif part:
            ids += unique_tokens(vocab, part, used)
    return ids


def write_tool_model(
    out: Path,
    call: str = CALL,
    answer: str = ANSWER,
    *,
    template: str | None = None,
    new_tokens: tuple[str, ...] = (),
    starts: tuple[str, ...] = (),
    thought: str = "",
    wrap: tuple[str, str] = ("<tool_call>", "</tool_call>"),
    marker: str = "<tool_response>",
) -> Path:
    """Write the scripted checkpoint into `out` (tokenizer, template, config, weights).

    Qwen3's by default. Another family's format: `template` (its chat template),
    `new_tokens` (its special tokens Qwen3's vocabulary lacks, added after it, as the
    family's own tokenizer has them whole), `starts` (the token(s) that end its
    generation prompt), `thought` (reasoning in <think> before the call), `wrap` (the
    tokens around a call) and `marker` (the token only a tool's result brings)."""
    from ssdmoe_tui.models.demo import copy_tokenizer

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    copy_tokenizer(QWEN3, out)
    tok_config = json.loads((QWEN3 / "tokenizer_config.json").read_text())
    tok_config["chat_template"] = template or (QWEN3 / "chat_template.jinja").read_text()
    decoder = tok_config["added_tokens_decoder"]
    for name in new_tokens:
        decoder[str(max(map(int, decoder)) + 1)] = {
            "content": name, "lstrip": False, "normalized": False, "rstrip": False,
            "single_word": False, "special": False,
        }  # fmt: skip
    (out / "tokenizer_config.json").write_text(json.dumps(tok_config))
    (out / "chat_template.jinja").unlink(missing_ok=True)
    vocab = json.loads((QWEN3 / "vocab.json").read_text())
    added = {v["content"]: int(k) for k, v in decoder.items()}

    end, marker_id = added["<|im_end|>"], added[marker]
    # "\n" after "assistant", "\n\n" after an empty think (Qwen3's generation prompts)
    starts_ids = [added[t] for t in starts] or [vocab["Ċ"], vocab["ĊĊ"]]
    used = set(starts_ids) | {end, marker_id}
    think = (
        [added["<think>"], *script_tokens(vocab, added, thought, used), added["</think>"]]
        if thought
        else []
    )
    call_ids = [*think, *script_tokens(vocab, added, wrap[0] + call + wrap[1], used)]
    answer_ids = script_tokens(vocab, added, answer, used)
    script = starts_ids + [marker_id] + call_ids + answer_ids
    hidden = CONFIG["hidden_size"]
    flag = hidden - 1
    if len(script) > flag:
        raise ValueError(f"the script needs {len(script)} dimensions, the model has {flag}")
    dim = {t: i for i, t in enumerate(script)}

    import numpy as np

    model, a = blank_model(CONFIG, dim)
    head = a["lm_head.weight"]
    # The bigram: each token's dimension votes for its successor.
    chains = [call_ids + [end], answer_ids + [end]]
    for chain in chains:
        for cur, nxt in zip(chain, chain[1:], strict=False):
            head[nxt, dim[cur]] = 1.0
    for s in starts_ids:
        head[call_ids[0], dim[s]] = 1.0  # no tool result in context: the call
    head[answer_ids[0], flag] = 2.0  # a tool result in context: the answer
    # Layer 0, head 0 (kv head 0): the reply's first position looks for <tool_response>.
    slow = CONFIG["head_dim"] // 2 - 1  # RoPE's slowest pair
    att = "model.layers.0.self_attn."
    for s in starts_ids:
        a[att + "q_proj.weight"][slow, dim[s]] = 1.0
    a[att + "k_proj.weight"][slow, dim[marker_id]] = 1.0
    a[att + "q_norm.weight"][:] = 4.0
    a[att + "k_norm.weight"][:] = 4.0
    a[att + "v_proj.weight"][0, dim[marker_id]] = 1.0 / np.sqrt(hidden)
    a[att + "o_proj.weight"][flag, 0] = 1.0
    save_scripted(model, a, CONFIG, out)
    (out / "SCRIPT.json").write_text(
        json.dumps({"call": call, "answer": answer, "call_ids": call_ids, "answer_ids": answer_ids})
    )
    return out


def blank_model(config: dict, dim: dict[int, int]) -> tuple[Any, dict[str, Any]]:
    """mlx-lm's model for `config` and its weights as numpy arrays by name, all 0 (norms
    1) but the embedding: each script token one-hot on its own dimension (`dim`)."""
    import numpy as np
    from mlx.utils import tree_flatten
    from mlx_lm.utils import _get_classes

    model_class, args_class = _get_classes(config)
    model = model_class(args_class.from_dict(config))
    params = dict(tree_flatten(model.parameters()))
    a = {k: np.zeros(v.shape, np.float32) if "norm" not in k else np.ones(v.shape, np.float32)
         for k, v in params.items()}  # fmt: skip
    for t, i in dim.items():
        a["model.embed_tokens.weight"][t, i] = 1.0
    return model, a


def save_scripted(model: Any, arrays: dict[str, Any], config: dict, out: Path) -> None:
    """Load `arrays` into `model`, quantize it (4 bits, groups of 32) and save it to `out`."""
    import mlx.core as mx
    from mlx.utils import tree_flatten, tree_unflatten
    from mlx_lm.utils import quantize_model

    from ssdmoe_tui.models.demo import save_quantized

    dtypes = {k: v.dtype for k, v in tree_flatten(model.parameters())}
    weights = {k: mx.array(v).astype(dtypes[k]) for k, v in arrays.items()}
    model.update(tree_unflatten(list(weights.items())))
    model, qconfig = quantize_model(model, dict(config), 32, 4)
    save_quantized(model, qconfig, out, max_shard_bytes=8 << 20)


def copy_model(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst

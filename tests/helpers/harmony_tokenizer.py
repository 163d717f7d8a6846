"""A small tokenizer that speaks harmony: gpt-oss's genuine chat template and special
tokens over a byte-level vocabulary of 256 bytes (o200k_harmony, 27 MB, is not in
tests/fixtures). Text encodes byte by byte; the special tokens (and any `added` word)
encode whole, as in the real tokenizer; `words` are vocabulary entries that only a
model emits (a scripted model's reply), decoded like any other token."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from tests.helpers.fixture_paths import MODELS
from tests.helpers.scripted_model import _byte_chars

GPT_OSS = MODELS / "gpt-oss-20b"
SPECIALS = (
    "<|startoftext|>", "<|endoftext|>", "<|return|>", "<|constrain|>", "<|channel|>",
    "<|start|>", "<|end|>", "<|message|>", "<|call|>",
)  # fmt: skip


def write_harmony_tokenizer(
    out: Path, words: Sequence[str] = (), added: Sequence[str] = ()
) -> dict[str, int]:
    """Write tokenizer.json, tokenizer_config.json (with the template),
    special_tokens_map.json and generation_config.json into `out`; return the vocabulary
    (token text -> id; a word's text as written, not byte-mapped)."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    chars = _byte_chars()
    vocab = {chars[b]: b for b in range(256)}
    mapped = {w: "".join(chars[b] for b in w.encode()) for w in words}
    for w in words:
        if mapped[w] not in vocab:
            vocab[mapped[w]] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=dict(vocab), merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_tokens([AddedToken(a, special=False, normalized=False) for a in added])
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in SPECIALS])
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<|startoftext|>",
        eos_token="<|return|>",
        pad_token="<|endoftext|>",
    )
    fast.chat_template = (GPT_OSS / "chat_template.jinja").read_text()
    fast.save_pretrained(str(out))
    ids = {s: fast.convert_tokens_to_ids(s) for s in (*SPECIALS, *added)}
    # generation_config.json as openai/gpt-oss-20b's current one: <|call|> ends a reply too
    (out / "generation_config.json").write_text(
        json.dumps({"eos_token_id": [ids["<|return|>"], ids["<|endoftext|>"], ids["<|call|>"]]})
    )
    return {**{w: vocab[mapped[w]] for w in words}, **ids}

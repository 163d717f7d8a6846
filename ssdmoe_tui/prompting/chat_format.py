"""Exact-history chat prompts: each turn's prompt extends the previous turn's tokens.

A multi-turn prompt is *not* a re-render of the whole chat through the template.
It is the previous turn's full token sequence (prompt + generated ids, end-of-turn
token included) followed by the templated text of the new user turn. That keeps the
KV cache a true prefix of the next prompt, so a turn prefills only its new message,
and it sidesteps templates that render a past turn differently from how it was
generated (Qwen3 drops `<think>...</think>` from earlier assistant turns; the
generation prompt's empty think block with `enable_thinking=False` also disappears).

The choice, where the template would render history differently: keep what the
model actually saw and produced (thinking included). The cost is context length
(think blocks stay in context); the gain is a cache that is always a prefix, which
hybrid models (recurrent state, untrimmable) need to reuse anything at all.

The templated delta is worked out generically, for any template: render the history
with a sentinel as the last assistant message, then render it again followed by the
new user message with the generation prompt; the text after the sentinel is the
end-of-turn text (e.g. `<|im_end|>\\n`) plus the new user turn plus the assistant
header. The end-of-turn token the model already generated is not repeated.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

Messages = Sequence[Mapping[str, Any]]


class ChatFormatError(ValueError):
    """The chat template cannot produce an exact-history delta for these messages."""


def hf_tokenizer(tokenizer: Any) -> Any:
    """The Hugging Face tokenizer behind an mlx-lm `TokenizerWrapper` (or the object itself)."""
    return getattr(tokenizer, "_tokenizer", tokenizer)


def render(
    tokenizer: Any, messages: Messages, *, add_generation_prompt: bool, **template_kwargs: Any
) -> str:
    """The chat template's text for `messages` (no tokenization)."""
    tok = hf_tokenizer(tokenizer)
    if getattr(tok, "chat_template", None) is None:
        raise ChatFormatError("the tokenizer has no chat template")
    text = tok.apply_chat_template(
        [dict(m) for m in messages],
        tokenize=False,
        add_generation_prompt=add_generation_prompt,
        **template_kwargs,
    )
    if not isinstance(text, str):  # some versions return a list for batched input
        raise ChatFormatError(f"chat template returned {type(text).__name__}, not text")
    return text


def encode(tokenizer: Any, text: str) -> list[int]:
    """Token ids of template text. Special tokens in the text (BOS, `<|im_start|>`) are
    parsed from it; none are added, as `apply_chat_template(tokenize=True)` does."""
    return list(hf_tokenizer(tokenizer).encode(text, add_special_tokens=False))


def stop_token_ids(tokenizer: Any) -> set[int]:
    """Ids that end a generated turn (mlx-lm's `eos_token_ids`, else the HF `eos_token_id`)."""
    ids = getattr(tokenizer, "eos_token_ids", None)
    if ids:
        return {int(i) for i in ids}
    eos = getattr(hf_tokenizer(tokenizer), "eos_token_id", None)
    if eos is None:
        return set()
    return {int(i) for i in eos} if isinstance(eos, Iterable) else {int(eos)}


def special_token_ids(tokenizer: Any) -> set[int]:
    tok = hf_tokenizer(tokenizer)
    ids = set(getattr(tok, "all_special_ids", []) or [])
    decoder = getattr(tok, "added_tokens_decoder", None) or {}
    ids.update(int(i) for i, t in decoder.items() if getattr(t, "special", True))
    return ids


def first_turn_tokens(tokenizer: Any, messages: Messages, **template_kwargs: Any) -> list[int]:
    """The first prompt: the whole templated chat with the generation prompt."""
    return encode(
        tokenizer, render(tokenizer, messages, add_generation_prompt=True, **template_kwargs)
    )


def user_turn_delta(
    tokenizer: Any,
    history_tokens: Sequence[int],
    history_messages: Messages,
    new_user_text: str,
    **template_kwargs: Any,
) -> list[int]:
    """Tokens to append to `history_tokens` for a new user turn.

    `history_messages` ends with the assistant turn whose generated ids end
    `history_tokens`. If that turn ended with a stop token, the template's own
    end-of-turn token is not repeated (when it differs, e.g. gpt-oss's `<|return|>`
    vs `<|end|>`, the generated one stands in for it: history stays exact). If the
    turn was cut short (stopped by the user, or max tokens), the template's
    end-of-turn text is appended to close it.
    """
    return turn_delta(
        tokenizer,
        history_tokens,
        history_messages,
        [{"role": "user", "content": new_user_text}],
        **template_kwargs,
    )


def turn_delta(
    tokenizer: Any,
    history_tokens: Sequence[int],
    history_messages: Messages,
    new_messages: Messages,
    **template_kwargs: Any,
) -> list[int]:
    """Tokens to append to `history_tokens` for any new messages after the assistant turn
    that ends it (a user turn, tool results, ...), up to the generation prompt. The last
    assistant message is rendered as a sentinel without its tool calls: what the model
    generated for it (text and calls) is already in `history_tokens`; only the text the
    template puts after it is new. Rules as in `user_turn_delta`."""
    if not history_messages or history_messages[-1].get("role") != "assistant":
        raise ChatFormatError("history must end with an assistant turn")
    if not new_messages:
        raise ChatFormatError("no new message after the assistant turn")
    sentinel = f"SSDMOE{secrets.token_hex(8)}SENTINEL"
    msgs = [dict(m) for m in history_messages]
    msgs[-1] = {"role": "assistant", "content": sentinel}
    with_new = msgs + [dict(m) for m in new_messages]
    text = render(tokenizer, with_new, add_generation_prompt=True, **template_kwargs)
    at = text.rfind(sentinel)
    if at < 0:
        raise ChatFormatError("the chat template dropped the last assistant message")
    delta = encode(tokenizer, text[at + len(sentinel) :])
    if not delta:
        raise ChatFormatError("the chat template produced no text for the new turn")
    last = history_tokens[-1] if len(history_tokens) else None
    if last is not None and last in stop_token_ids(tokenizer):
        # The token that closes an assistant turn in the template, if any: the first
        # token after the assistant's content when the history is rendered alone.
        alone = render(tokenizer, msgs, add_generation_prompt=False, **template_kwargs)
        cut = alone.rfind(sentinel)
        closing = encode(tokenizer, alone[cut + len(sentinel) :])[:1] if cut >= 0 else []
        if closing and delta[0] == closing[0]:
            if delta[0] == last or delta[0] in special_token_ids(tokenizer):
                delta = delta[1:]
    return delta


def next_turn_tokens(
    tokenizer: Any,
    history_tokens: Sequence[int],
    history_messages: Messages,
    new_user_text: str,
    **template_kwargs: Any,
) -> list[int]:
    """The next prompt: `history_tokens` unchanged, then the templated new user turn."""
    delta = user_turn_delta(
        tokenizer, history_tokens, history_messages, new_user_text, **template_kwargs
    )
    return list(history_tokens) + delta


def prompt_tokens(tokenizer: Any, messages: Messages, *, raw: bool = False) -> list[int]:
    """One prompt from `messages`: the chat template with the generation prompt when the
    tokenizer has one (and not `raw`), else the contents joined by newlines, tokenized
    as plain text. The same for `generate`, the chat service and the server."""
    from ssdmoe_tui.options import check_text

    msgs = [{"role": m["role"], "content": check_text(m["content"])} for m in messages]
    if not raw and getattr(tokenizer, "chat_template", None):
        return list(tokenizer.apply_chat_template(msgs, add_generation_prompt=True))
    return list(tokenizer.encode("\n".join(m["content"] for m in msgs)))

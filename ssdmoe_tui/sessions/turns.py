"""One chat turn against a stored conversation: the exact-history prompt, then the record.

    prompt, delta = build_prompt(tokenizer, conv, text)
    service.submit(Generate(rid, prompt_tokens=tuple(prompt), session_id=conv.id, ...))
    ... GenerationDone ...   (the app records the turn with AppSessions.record)

`tokenizer` is the model's (mlx-lm TokenizerWrapper or a Hugging Face tokenizer); no
MLX is used here.
"""

from __future__ import annotations

import hashlib
from typing import Any

from ssdmoe_tui.prompting.chat_format import (
    encode,
    first_turn_tokens,
    hf_tokenizer,
    user_turn_delta,
)
from ssdmoe_tui.sessions.store import Conversation

_IDS: dict[int, tuple[Any, str]] = {}


def tokenizer_id(tokenizer: Any) -> str:
    """Identifies a tokenizer and its chat template: stored token ids are only meaningful
    to the tokenizer that made them (another model's vocabulary maps them to other text)."""
    hit = _IDS.get(id(tokenizer))
    if hit is not None and hit[0] is tokenizer:
        return hit[1]
    hf = hf_tokenizer(tokenizer)
    h = hashlib.sha256()
    h.update(str(getattr(hf, "chat_template", "") or "").encode())
    for piece, i in sorted(hf.get_vocab().items(), key=lambda kv: kv[1]):
        h.update(f"{i}:{piece}\n".encode())
    value = h.hexdigest()[:24]
    _IDS[id(tokenizer)] = (tokenizer, value)
    return value


def retokenize(tokenizer: Any, conv: Conversation, **template_kwargs: Any) -> None:
    """Rebuild every turn's token ids with `tokenizer` (after a switch to a model with
    another tokenizer), as the template renders the history. Replies lose nothing but
    their original token boundaries; the caller saves the conversation."""
    turns = conv.turns
    conv.turns = []
    history: list[int] = []
    for turn in turns:
        if turn.role == "user":
            if not conv.turns:
                msgs = conv.messages() + [{"role": "user", "content": turn.text}]
                ids = first_turn_tokens(tokenizer, msgs, **template_kwargs)
            else:
                ids = user_turn_delta(
                    tokenizer, history, conv.messages(), turn.text, **template_kwargs
                )
        else:  # no stop token: the next user turn's delta closes the reply as the template does
            ids = encode(tokenizer, turn.text)
        turn.token_ids = ids
        history.extend(ids)
        conv.turns.append(turn)
    conv.tokenizer_id = tokenizer_id(tokenizer)


def build_prompt(
    tokenizer: Any, conv: Conversation, user_text: str, **template_kwargs: Any
) -> tuple[list[int], list[int]]:
    """(prompt tokens, delta): the conversation's exact token history plus the templated
    new user turn (`delta`, what the user turn records); the whole template on turn one.
    If the conversation's ids came from another tokenizer (or under another system
    prompt: `tokenizer_id` cleared), they are rebuilt first."""
    current = tokenizer_id(tokenizer)
    # A turn without ids: its ids were never split per turn (a conversation re-based on
    # one prompt by an older `AppSessions.record`); rebuilt, the history stays whole.
    if conv.turns and (conv.tokenizer_id != current or not all(t.token_ids for t in conv.turns)):
        retokenize(tokenizer, conv, **template_kwargs)
    conv.tokenizer_id = current
    history = conv.history_tokens()
    if not conv.turns:
        msgs = conv.messages() + [{"role": "user", "content": user_text}]
        prompt = first_turn_tokens(tokenizer, msgs, **template_kwargs)
        return prompt, list(prompt)
    delta = user_turn_delta(tokenizer, history, conv.messages(), user_text, **template_kwargs)
    return history + delta, delta

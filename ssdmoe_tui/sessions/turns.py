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
    turn_delta,
)
from ssdmoe_tui.sessions.store import Conversation, Turn, turn_message

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


def runs(turns: list[Turn]) -> list[list[Turn]]:
    """The turns in groups the template renders together: each assistant turn alone, and
    each run of messages between replies (a user message; a reply's tool results)."""
    out: list[list[Turn]] = []
    for t in turns:
        if t.role != "assistant" and out and out[-1][-1].role != "assistant":
            out[-1].append(t)
        else:
            out.append([t])
    return out


def ids_complete(conv: Conversation) -> bool:
    """Every group carries its ids (on its first turn: a run's delta is one piece)."""
    return all(group[0].token_ids for group in runs(conv.turns))


def _delta(tokenizer: Any, conv: Conversation, new: list[dict], **kw: Any) -> list[int]:
    """The ids the new messages add after the conversation's turns (all of it, first)."""
    if not conv.turns:
        return first_turn_tokens(tokenizer, conv.messages() + new, **kw)
    return turn_delta(tokenizer, conv.history_tokens(), conv.messages(), new, **kw)


def retokenize(tokenizer: Any, conv: Conversation, **template_kwargs: Any) -> None:
    """Rebuild every turn's token ids with `tokenizer` (after a switch to a model with
    another tokenizer), as the template renders the history. Replies lose nothing but
    their original token boundaries; the caller saves the conversation."""
    groups = runs(conv.turns)
    conv.turns = []
    for group in groups:
        if group[0].role == "assistant":
            # no stop token: the next turn's delta closes the reply as the template does
            ids = encode(tokenizer, group[0].text)
        else:
            ids = _delta(tokenizer, conv, [turn_message(t) for t in group], **template_kwargs)
        for i, turn in enumerate(group):
            turn.token_ids = ids if i == 0 else []
        conv.turns.extend(group)
    conv.tokenizer_id = tokenizer_id(tokenizer)


def build_prompt(
    tokenizer: Any, conv: Conversation, new: str | list[dict], **template_kwargs: Any
) -> tuple[list[int], list[int]]:
    """(prompt tokens, delta): the conversation's exact token history plus the templated
    new messages (`new`: a user's text, or messages such as a reply's tool results;
    `delta`, what the first of them records); the whole template on turn one. If the
    conversation's ids came from another tokenizer (or under another system prompt:
    `tokenizer_id` cleared), they are rebuilt first."""
    msgs = [{"role": "user", "content": new}] if isinstance(new, str) else list(new)
    current = tokenizer_id(tokenizer)
    # A turn without ids: its ids were never split per turn (a conversation re-based on
    # one prompt by an older `AppSessions.record`); rebuilt, the history stays whole.
    if conv.turns and (conv.tokenizer_id != current or not ids_complete(conv)):
        retokenize(tokenizer, conv, **template_kwargs)
    conv.tokenizer_id = current
    delta = _delta(tokenizer, conv, msgs, **template_kwargs)
    return conv.history_tokens() + delta, delta

"""One chat turn against a stored conversation: the exact-history prompt, then the record.

    prompt, delta = build_prompt(tokenizer, conv, text)
    service.submit(Generate(rid, prompt_tokens=tuple(prompt), session_id=conv.id, ...))
    ... GenerationDone ...
    record_exchange(store, conv, text, delta, done)

`tokenizer` is the model's (mlx-lm TokenizerWrapper or a Hugging Face tokenizer); no
MLX is used here.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

from ssdmoe_tui.engine.chat_format import first_turn_tokens, user_turn_delta
from ssdmoe_tui.sessions.store import Conversation, SessionStore, Turn


def build_prompt(
    tokenizer: Any, conv: Conversation, user_text: str, **template_kwargs: Any
) -> tuple[list[int], list[int]]:
    """(prompt tokens, delta): the conversation's exact token history plus the templated
    new user turn (`delta`, what the user turn records); the whole template on turn one."""
    history = conv.history_tokens()
    if not conv.turns:
        msgs = conv.messages() + [{"role": "user", "content": user_text}]
        prompt = first_turn_tokens(tokenizer, msgs, **template_kwargs)
        return prompt, list(prompt)
    delta = user_turn_delta(tokenizer, history, conv.messages(), user_text, **template_kwargs)
    return history + delta, delta


def record_exchange(
    store: SessionStore,
    conv: Conversation,
    user_text: str,
    delta: Sequence[int],
    reply_text: str,
    reply_tokens: Sequence[int],
    finish_reason: str,
    k_per_token: Sequence[int] = (),
) -> bool:
    """Append the user turn and the reply, and save. A failed generation ("error") records
    nothing (the history must stay what the model saw) and returns False."""
    if finish_reason == "error":
        return False
    k = Counter(k_per_token).most_common(1)[0][0] if k_per_token else None
    conv.turns.append(Turn("user", user_text, list(delta)))
    conv.turns.append(
        Turn(
            "assistant",
            reply_text,
            list(reply_tokens),
            k=k,
            stopped=finish_reason == "cancelled",
        )
    )
    store.save(conv)
    return True

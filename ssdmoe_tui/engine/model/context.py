"""The context-length check: a prompt that does not fit the model's context is refused,
with the numbers, before any prefill (a 80,000-token prompt against a 4,096 context
would otherwise run for many minutes and then produce garbage).

Refuse rather than truncate: the engine cannot know which part of a prompt the user can
spare, and a conversation's stored token history is exact (docs/sessions.md): the user
starts a new conversation or shortens the message.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ssdmoe_tui.errors import BadValueError


class ContextTooLong(BadValueError):
    """The prompt needs more positions than the model was trained for."""

    def __init__(self, n_prompt: int, context: int) -> None:
        self.n_prompt = n_prompt
        self.context = context
        super().__init__(
            f"the prompt is {n_prompt:,} tokens but the model's context is {context:,} "
            "tokens: shorten it or start a new conversation"
        )


def max_context(config: Mapping[str, Any]) -> int:
    """The trained context (`max_position_embeddings`, also under `text_config`); 0 when
    the config does not say (then nothing is refused)."""
    for cfg in (config.get("text_config"), config):
        if isinstance(cfg, Mapping):
            value = cfg.get("max_position_embeddings")
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                return value
    return 0


def check_context(n_prompt: int, context: int) -> None:
    """Raise ContextTooLong unless a prompt of `n_prompt` tokens leaves room for at least
    one generated token in `context` (0: unknown, accepted)."""
    if context > 0 and n_prompt >= context:
        raise ContextTooLong(n_prompt, context)

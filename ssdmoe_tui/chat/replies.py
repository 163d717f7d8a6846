"""What a reply's header shows, live or restored from a saved conversation."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


def k_range(k_per_token: Sequence[int]) -> tuple[int | None, int | None]:
    """(lowest, highest) K a reply's tokens used; (None, None) for no token."""
    return (min(k_per_token), max(k_per_token)) if k_per_token else (None, None)


def k_label(k_min: int | None, k_max: int | None) -> str:
    """ "K 4", or "K 4–6" for a reply during which K was changed."""
    if k_min is None:
        return ""
    if k_max is None or k_max == k_min:
        return f"K {k_min}"
    return f"K {k_min}–{k_max}"


@dataclass(frozen=True)
class ReplyStats:
    """The facts on a reply's header line: model, length, speed, K used."""

    model: str = ""
    tokens: int = 0
    decode_tok_s: float | None = None
    k_min: int | None = None
    k_max: int | None = None
    kv_hit_rate: float | None = None  # share of the prompt served from the KV cache
    thinking_tokens: int = 0  # of `tokens`, the reasoning's (templates that think)

    @classmethod
    def from_done(cls, done: Any, model: str) -> ReplyStats:
        stats = done.stats or {}
        rate, kv = stats.get("decode_tok_s"), stats.get("kv_hit_rate")
        k_min, k_max = k_range(done.k_per_token)
        counted = stats.get("generated_tokens")  # a server's reply carries no ids
        return cls(
            model=model,
            tokens=len(done.token_ids) or (counted if isinstance(counted, int) else 0),
            decode_tok_s=float(rate) if isinstance(rate, (int, float)) else None,
            k_min=k_min,
            k_max=k_max,
            kv_hit_rate=float(kv) if isinstance(kv, (int, float)) else None,
        )

    def detail(self) -> str:
        """ "42 tokens · 5.1 tok/s · K 4" (parts that are unknown are left out)."""
        parts = [f"{self.tokens} tokens"] if self.tokens else []
        if parts and self.thinking_tokens:
            parts[0] += f" ({self.thinking_tokens} thinking)"
        if self.decode_tok_s is not None and self.tokens:  # no token: no rate (not 0.0)
            parts.append(f"{self.decode_tok_s:.1f} tok/s")
        if k := k_label(self.k_min, self.k_max):
            parts.append(k)
        if self.kv_hit_rate:
            parts.append(f"KV hit {self.kv_hit_rate * 100:.0f}%")
        return " · ".join(parts)


@dataclass(frozen=True)
class ShownTurn:
    """One message of a conversation as the transcript shows it."""

    role: str  # "user", "assistant" or "tool" (a tool's result)
    content: str
    reply: ReplyStats | None = None  # assistant turns
    stopped: bool = False
    finish: str = ""  # "stop", "length" (shown "[hit max tokens]"), "cancelled"
    name: str = ""  # a tool result: the tool's name
    call_id: str = ""  # a tool result: the call it answers
    tool_calls: tuple[dict[str, str], ...] = ()  # a server's reply: the calls it returned

"""A reply's reasoning, told apart from its answer (templates that think: Qwen3,
Qwen3.5, Nemotron-3 write `<think> ... </think>` before the answer).

The reply text keeps the block as generated (the exact history needs it); the app
shows it as its own collapsible part and counts its tokens. Some templates open the
block in the generation prompt (Qwen3.5: `<|im_start|>assistant\\n<think>\\n`): the
reply then starts inside it, and only `</think>` is generated. `enable_thinking`
(the per-conversation setting) is the templates' own switch: off, Qwen3 puts an empty
block in the prompt and the model answers at once.

gpt-oss writes harmony messages instead (`prompting/harmony.py`): its analysis channel
is the reasoning, its final channel (and commentary preambles) the answer; its tool
calls are shown as tool-call blocks. Such a reply is told by its text, which starts
with a channel header (the tokenizer's reply format is not at hand where a saved
conversation is shown: it opens before its model has loaded).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ssdmoe_tui.prompting import harmony

OPEN, CLOSE = "<think>", "</think>"


@dataclass(frozen=True)
class Split:
    thinking: str  # the reasoning ("" when the reply has none)
    answer: str
    open: bool = False  # the block has not closed yet (still thinking)
    has_thinking: bool = False


def starts_inside(text: str) -> bool:
    """A reply whose block the prompt opened: it closes one it never opened."""
    close = text.find(CLOSE)
    return close >= 0 and OPEN not in text[:close]


def split_thinking(text: str, inside: bool | None = None) -> Split:
    """`inside`: the prompt opened the block (None: infer it from the text, for a
    reply already complete). A text that may still become `<think>` is held back."""
    if harmony.is_harmony_text(text) or (text and harmony.CHANNEL.startswith(text)):
        return _split_harmony(text)
    if inside is None:
        inside = starts_inside(text)
    start = 0
    if not inside:
        head = text.lstrip()
        if head.startswith(OPEN):
            start = len(text) - len(head) + len(OPEN)
        elif head and OPEN.startswith(head):
            return Split("", "", open=True)  # "<thi": wait for the rest of the tag
        else:
            return Split("", text)
    close = text.find(CLOSE, start)
    if close < 0:
        body = text[start:]
        for n in range(len(CLOSE) - 1, 0, -1):  # a "</thi" still arriving is not reasoning
            if body.endswith(CLOSE[:n]):
                body = body[:-n]
                break
        return Split(body.strip("\n"), "", open=True, has_thinking=True)
    thinking = text[start:close].strip("\n")
    return Split(thinking, text[close + len(CLOSE) :].lstrip("\n"), has_thinking=True)


def _split_harmony(text: str) -> Split:
    """A harmony reply, whole or still streaming: a marker cut short is held back, so
    the answer only ever grows as tokens arrive."""
    parsed = harmony.parse_reply(text, final=False)
    return Split(
        parsed.reasoning.strip("\n"),
        parsed.content,
        open=parsed.open_reasoning,
        has_thinking=bool(parsed.reasoning) or parsed.open_reasoning,
    )


def _ids(tokenizer: Any, tag: str) -> list[int]:
    hf = getattr(tokenizer, "_tokenizer", tokenizer)
    return list(hf.encode(tag, add_special_tokens=False))


def thinking_tokens(
    token_ids: Sequence[int], tokenizer: Any, text: str, inside: bool | None = None
) -> int:
    """How many of a reply's generated tokens are its reasoning (tags included)."""
    if tokenizer is None or not split_thinking(text, inside).has_thinking:
        return 0
    if harmony.is_harmony_text(text):
        return harmony.reasoning_tokens(token_ids, tokenizer)
    close = _ids(tokenizer, CLOSE)
    ids = list(token_ids)
    for i in range(len(ids) - len(close) + 1):
        if ids[i : i + len(close)] == close:
            return i + len(close)
    return len(ids)  # cut while thinking (stopped, max tokens): all of it


def prompt_opens_thinking(prompt_ids: Sequence[int], tokenizer: Any) -> bool:
    """The prompt ends inside an open block (the reply starts in its reasoning)."""
    if tokenizer is None or not prompt_ids:
        return False
    try:
        hf = getattr(tokenizer, "_tokenizer", tokenizer)
        tail = hf.decode(list(prompt_ids[-8:]))
    except Exception:  # noqa: BLE001 - a tokenizer without decode: no block
        return False
    return tail.rstrip().endswith(OPEN)


def template_kwargs(thinking: bool) -> dict[str, Any]:
    """The chat template's switch, as `apply_chat_template` takes it."""
    return {"enable_thinking": thinking}

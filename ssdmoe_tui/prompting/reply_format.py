"""The one place that decides how a model's replies are laid out, from its tokenizer.

Every reader of a reply (the server's `serving_*` modules, the app's tool loop and its
reasoning display, the prompt's history) asks `reply_format_for(tokenizer)` rather
than looking at the model type. The choice follows what the chat template emits:

* `<|channel|>` and `<|message|>` in the template: gpt-oss's harmony messages
  (`prompting/harmony.py`): reasoning, answer and tool calls are channels;
* `<｜tool▁calls▁begin｜>`: DeepSeek-V3/R1's tool-call block (`deepseek_tools.py`;
  mlx-lm 0.32.2 has no parser for it);
* otherwise the tool parser mlx-lm inferred from the template when it loaded the
  tokenizer (Qwen3's `json_tools`, the `qwen3_coder` XML of Qwen3.5 and Nemotron-3,
  GLM-4.5/4.6's `<arg_key>` form `glm47`, Kimi's, MiniMax's, ...), with the think
  markers mlx-lm found in the vocabulary (`<think>`: Qwen3, DeepSeek-R1, GLM).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ssdmoe_tui.prompting import deepseek_tools, harmony
from ssdmoe_tui.prompting.output import (
    OutputFilter,
    ThinkFormat,
    ToolFormat,
    starts_in_think,
    think_format_for,
    tool_format_for,
)

DEEPSEEK = ToolFormat(
    deepseek_tools.tool_call_start,
    deepseek_tools.tool_call_end,
    deepseek_tools.parse_tool_call,
    "deepseek_v3",
)


@dataclass(frozen=True)
class ReplyFormat:
    """How replies are laid out: harmony channels, or think markers and tool-call blocks
    in the text (either may be absent)."""

    name: str  # "harmony", the tool parser's ("json_tools", "deepseek_v3", ...), or "plain"
    harmony: bool = False
    think: ThinkFormat | None = None
    tool: ToolFormat | None = None

    @property
    def thinks(self) -> bool:
        return self.harmony or self.think is not None

    @property
    def calls_tools(self) -> bool:
        return self.harmony or self.tool is not None

    def output_filter(
        self,
        stops: Sequence[str] = (),
        tools: Sequence[dict] | None = None,
        in_think: bool = False,
    ) -> OutputFilter:
        """A reply's filter: stop strings, reasoning apart, tool calls (when `tools`)."""
        if self.harmony:
            return OutputFilter(stops, None, tools, harmony=True)
        return OutputFilter(stops, self.tool, tools, self.think, in_think and bool(self.think))

    @property
    def end_tokens(self) -> tuple[str, ...]:
        """Tokens that end a reply in this format whatever generation_config.json lists:
        harmony's `<|call|>` (a call waits for its result) and `<|return|>`. gpt-oss-20b's
        first generation_config.json stops on `<|return|>` and `<|endoftext|>` only."""
        return (harmony.RETURN, harmony.CALL) if self.harmony else ()

    def end_token_ids(self, tokenizer: Any) -> set[int]:
        """`end_tokens` as ids of `tokenizer` (those it has), for its stop set."""
        hf = getattr(tokenizer, "_tokenizer", tokenizer)
        vocab = hf.get_vocab()
        return {vocab[t] for t in self.end_tokens if t in vocab}

    def starts_in_think(self, tokenizer: Any, prompt: Sequence[int]) -> bool:
        """The generation prompt opens a think block (Qwen3.5's `<think>\\n`); a harmony
        prompt ends at `<|start|>assistant`, before any channel."""
        return self.think is not None and starts_in_think(tokenizer, prompt)


PLAIN = ReplyFormat("plain")
HARMONY = ReplyFormat("harmony", harmony=True)


def template_text(tokenizer: Any) -> str:
    """The chat template as text ("" when there is none); a template dict (named
    templates) counts all of them."""
    for obj in (tokenizer, getattr(tokenizer, "_tokenizer", None)):
        template = getattr(obj, "chat_template", None)
        if isinstance(template, str):
            return template
        if isinstance(template, dict):
            return "\n".join(str(v) for v in template.values())
        if isinstance(template, list):  # [{"name":..., "template":...}]
            return "\n".join(str(t.get("template", "")) for t in template if isinstance(t, dict))
    return ""


def is_harmony_template(template: str) -> bool:
    """The template writes harmony messages (gpt-oss's)."""
    return harmony.CHANNEL in template and harmony.MESSAGE in template


def template_kind(template: str) -> str:
    """What the template's text says about the messages it takes: "harmony" (gpt-oss's),
    "deepseek" (DeepSeek's tool-call block), or "" (the usual OpenAI fields)."""
    if is_harmony_template(template):
        return "harmony"
    if deepseek_tools.tool_call_start in template:
        return "deepseek"
    return ""


def reply_format_for(tokenizer: Any) -> ReplyFormat:
    """This tokenizer's reply format (PLAIN for none: the text is all content)."""
    if tokenizer is None:
        return PLAIN
    kind = template_kind(template_text(tokenizer))
    if kind == "harmony":
        return HARMONY
    tool = DEEPSEEK if kind == "deepseek" else tool_format_for(tokenizer)
    think = think_format_for(tokenizer)
    if tool is None and think is None:
        return PLAIN
    return ReplyFormat(tool.name if tool else "think", think=think, tool=tool)


def is_harmony(tokenizer: Any) -> bool:
    return reply_format_for(tokenizer).harmony

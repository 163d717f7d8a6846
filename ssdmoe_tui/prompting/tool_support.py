"""Whether a model can use tools at all, and the words that say it cannot: one owner for
the server (its reply warning, `server/prompts.py`) and the app (its notice when MCP
servers are configured, `chat/controller.py`).

A model uses tools when its chat template shows them to it (rendering a probe chat with
one tool differs from rendering it without) and its replies have a tool-call format the
reply parser reads (`reply_format_for(tok).calls_tools`). A template with neither drops
the tools without a word: the server and the app say so instead."""

from __future__ import annotations

from typing import Any

from ssdmoe_tui.prompting.chat_format import render
from ssdmoe_tui.prompting.reply_format import reply_format_for

NOT_SHOWN = "the model's chat template cannot show tools"
NOT_READ = "the model's chat template has no tool-call format ssdmoe reads"
PROBE_TOOL = {
    "type": "function",
    "function": {"name": "ssdmoe_probe_tool", "description": "probe", "parameters": {"type": "object"}},
}  # fmt: skip


def shows_tools(tokenizer: Any) -> bool:
    """The template renders a probe chat differently with one tool than without (a
    template that fails the probe is taken to show them: nothing is said then)."""
    probe = [{"role": "user", "content": "probe"}]
    try:
        bare = render(tokenizer, probe, add_generation_prompt=True)
        with_tool = render(tokenizer, probe, add_generation_prompt=True, tools=[PROBE_TOOL])
    except Exception:  # noqa: BLE001 - a template that fails the probe: assume it shows them
        return True
    return bare != with_tool


def why_no_tools(tokenizer: Any) -> str | None:
    """Why a model with this tokenizer cannot use tools (NOT_SHOWN or NOT_READ), or None
    when it can."""
    if not shows_tools(tokenizer):
        return NOT_SHOWN
    if not reply_format_for(tokenizer).calls_tools:
        return NOT_READ
    return None


def tools_not_given(count: int) -> str:
    """The server's warning for a request whose `count` tools the template dropped."""
    return f"{NOT_SHOWN}: the {count} tools sent were not given to the model"

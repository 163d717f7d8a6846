"""The tool calls in a finished reply, found by the parser the server uses.

The model writes a call in its template's format (Qwen3's JSON inside `<tool_call>`,
the XML `<function=..>` form of Qwen3.5 and Nemotron 3, GLM's `<arg_key>` pairs,
DeepSeek's `<｜tool▁calls▁begin｜>` block, gpt-oss's harmony message to
`functions.NAME`); `prompting.reply_format` decides which from the chat template, and
its `OutputFilter` pulls the calls out of the text. The app uses the same filter on the
whole reply, so a call the server would return to an agent is the call the app shows
and runs."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ssdmoe_tui.errors import SsdmoeError, printable
from ssdmoe_tui.prompting.output import Call, Content, OutputFilter
from ssdmoe_tui.prompting.reply_format import reply_format_for


class BadArguments(SsdmoeError, ValueError):
    """A call's arguments are no JSON object a tool server can be sent (one line: the
    model gets it as the call's error result, the user as its note)."""


_KINDS = {list: "a list", str: "a string", int: "a number", float: "a number",
          bool: "true or false", type(None): "null"}  # fmt: skip


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _finite(text: str) -> float:
    value = float(text)
    if math.isinf(value):  # 1e400: Python reads it as inf, which JSON has no way to send
        raise ValueError(f"{text[:20]} is out of range")
    return value


def parse_arguments(text: str) -> dict[str, Any]:
    """The one reader of a tool call's arguments as the model (or an attached server)
    wrote them: a JSON object of strict JSON ({} for none), or BadArguments. Strict, as
    what is parsed is sent on to an MCP server: NaN and Infinity (which Python's reader
    takes), a number past a float's range (1e400) and a lone surrogate (`"\\ud800"`: no UTF-8 encodes it) are refused here, so a
    hostile reply cannot break the server's connection (issue 45)."""
    if not text.strip():
        return {}
    try:
        value = json.loads(text, parse_constant=_no_constant, parse_float=_finite)
    except RecursionError:
        raise BadArguments("the arguments are nested too deeply") from None
    except ValueError as e:  # not JSON, a number of 5,000 digits, NaN
        raise BadArguments(f"the arguments are not JSON ({printable(str(e), 120)})") from None
    if not isinstance(value, dict):
        kind = _KINDS.get(type(value), type(value).__name__)
        raise BadArguments(f"the arguments are {kind}, not a JSON object")
    try:
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        raise BadArguments("the arguments hold a lone surrogate, which is not text") from None
    except RecursionError:
        raise BadArguments("the arguments are nested too deeply") from None
    return value


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: str  # JSON text, as the model wrote it (normalized by the parser)

    def args(self) -> dict[str, Any]:
        """The arguments as an object ({} for none); BadArguments when they are not one."""
        return parse_arguments(self.arguments)

    def as_dict(self) -> dict[str, str]:
        return {"id": self.id, "name": self.name, "arguments": self.arguments}

    def shown_arguments(self, width: int = 80) -> str:
        """One line of the arguments (the block's title)."""
        text = " ".join(self.arguments.split())
        return text if len(text) <= width else text[: width - 1] + "…"


@dataclass(frozen=True)
class SplitReply:
    content: str  # the reply without its call blocks (a think block stays)
    calls: tuple[ToolCall, ...]


def split_reply(text: str, tokenizer: Any, tools: Sequence[dict]) -> SplitReply:
    """The reply's text and its tool calls (none when the tokenizer has no tool format:
    then nothing is taken out of the text). `tools` may be empty (a saved conversation
    shown before its servers run): the blocks are still found. A harmony reply keeps its
    text whole: its channels are told apart where it is shown (chat/thinking.py), which
    leaves the call messages out."""
    fmt = reply_format_for(tokenizer)
    if not fmt.harmony and (fmt.tool is None or fmt.tool.start not in text):
        return SplitReply(text, ())
    offered = list(tools) or [{"type": "function", "function": {"name": ""}}]
    # the think block stays in the content (the display splits it off)
    filt = OutputFilter((), fmt.tool, offered, harmony=fmt.harmony)
    pieces = filt.feed(text) + filt.finish()
    if fmt.harmony:
        calls = tuple(ToolCall(c.id, c.name, c.arguments) for c in filt.calls)
        return SplitReply(text, calls)
    content = "".join(p.text for p in pieces if isinstance(p, Content))
    calls = tuple(
        ToolCall(p.call.id, p.call.name, p.call.arguments) for p in pieces if isinstance(p, Call)
    )
    return SplitReply(content.strip() if calls else text, calls)


def from_dicts(calls: Sequence[dict[str, str]]) -> tuple[ToolCall, ...]:
    """A server's reply's calls ({"id", "name", "arguments"}, as the remote engine
    collected them from the API's stream)."""
    return tuple(ToolCall(c["id"], c["name"], c["arguments"]) for c in calls)

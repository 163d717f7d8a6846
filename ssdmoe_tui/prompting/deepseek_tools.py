"""DeepSeek-V3's and R1's tool-call block, which mlx-lm 0.32.2 has no parser for.

Shaped like mlx-lm's own parsers (`mlx_lm/tool_parsers/*.py`: `tool_call_start`,
`tool_call_end`, `parse_tool_call(text, tools)`), so `prompting.output` treats it as
one of them. The block holds one or more calls, in either of the two layouts DeepSeek's
templates render (and so its models write):

    V3, R1:  <｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\\n```json\\nARGS\\n```<｜tool▁call▁end｜>
    V3.1:    <｜tool▁call▁begin｜>NAME<｜tool▁sep｜>ARGS<｜tool▁call▁end｜>

inside `<｜tool▁calls▁begin｜> ... <｜tool▁calls▁end｜>` (the markers' bars and
underscores are the full-width `｜` and `▁` of DeepSeek's vocabulary).
"""

from __future__ import annotations

import json
import re
from typing import Any

tool_call_start = "<｜tool▁calls▁begin｜>"
tool_call_end = "<｜tool▁calls▁end｜>"
CALL_BEGIN, CALL_END, SEP = "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", "<｜tool▁sep｜>"
_FENCE = re.compile(r"^```(?:json)?\s*\n?(.*?)\n?```\s*$", re.DOTALL)


def _one(text: str) -> dict[str, Any]:
    left, sep, right = text.partition(SEP)
    if not sep:
        raise ValueError("no <｜tool▁sep｜> in the call")
    if left.strip() == "function":  # V3/R1: the type, then the name on its own line
        name, _, args = right.partition("\n")
    else:  # V3.1: the name, then the arguments
        name, args = left, right
    args = args.strip()
    fenced = _FENCE.match(args)
    if fenced:
        args = fenced.group(1).strip()
    value = json.loads(args) if args else {}
    if not isinstance(value, dict) or not name.strip():
        raise ValueError("a call needs a name and a JSON object of arguments")
    return {"name": name.strip(), "arguments": value}


def parse_tool_call(text: str, tools: Any = None) -> list[dict[str, Any]]:
    """Every call in the block's body (ValueError when one does not parse: the block
    is then passed on as text). A call the reply ended inside is parsed as it stands."""
    calls = []
    for part in text.split(CALL_BEGIN)[1:]:
        body = part.split(CALL_END, 1)[0]
        calls.append(_one(body))
    if not calls:
        raise ValueError("no call in the block")
    return calls

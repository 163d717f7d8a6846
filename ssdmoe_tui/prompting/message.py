"""One chat message as the app holds it, before it becomes token ids."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal


@dataclass(frozen=True)
class Message:
    role: Literal["system", "user", "assistant", "tool"]
    content: str
    name: str = ""  # a tool result: the tool's name
    tool_call_id: str = ""  # a tool result: the call it answers
    # An assistant turn's calls as {"id", "name", "arguments" (JSON text)} (a server's
    # reply: its content has no call markup; a local reply keeps the model's own text)
    tool_calls: tuple[dict[str, str], ...] = ()

    def for_template(self) -> dict[str, Any]:
        """The message as chat templates (and OpenAI's API) take it."""
        msg: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.role == "tool":
            if self.name:
                msg["name"] = self.name
            if self.tool_call_id:
                msg["tool_call_id"] = self.tool_call_id
        if self.tool_calls:
            msg["tool_calls"] = [
                {"id": c["id"], "type": "function",
                 "function": {"name": c["name"], "arguments": c["arguments"]}}
                for c in self.tool_calls
            ]  # fmt: skip
        return msg

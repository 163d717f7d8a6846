"""Which of the configured MCP servers and tools one conversation leaves off (F10).

Everything configured is on by default, so a server added to config.toml later is on in
every conversation; the choice records only what the user turned off. It is saved with
the conversation (`sessions.store.Conversation.tool_choice`, its one owner on disk) and
read back when the conversation is resumed; the chat controller holds the open
conversation's copy. A tool that is off is neither offered to the model nor run: a call
to it is answered "not enabled" without asking the user (`tools.loop`)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any


@dataclass(frozen=True)
class ToolChoice:
    servers_off: frozenset[str] = field(default_factory=frozenset)
    tools_off: frozenset[tuple[str, str]] = field(default_factory=frozenset)  # (server, tool)

    def allows(self, server: str, tool: str) -> bool:
        return server not in self.servers_off and (server, tool) not in self.tools_off

    def server_on(self, server: str) -> bool:
        return server not in self.servers_off

    def with_server(self, server: str, on: bool) -> ToolChoice:
        off = self.servers_off - {server} if on else self.servers_off | {server}
        return replace(self, servers_off=frozenset(off))

    def with_tool(self, server: str, tool: str, on: bool) -> ToolChoice:
        key = (server, tool)
        off = self.tools_off - {key} if on else self.tools_off | {key}
        return replace(self, tools_off=frozenset(off))

    def as_dict(self) -> dict[str, Any]:
        """As conversation.json keeps it (sorted: the same choice, the same text)."""
        return {
            "servers_off": sorted(self.servers_off),
            "tools_off": [list(pair) for pair in sorted(self.tools_off)],
        }

    @classmethod
    def from_dict(cls, value: Any) -> ToolChoice:
        """What `as_dict` wrote; ValueError says what is wrong (a hand-edited file)."""
        if not isinstance(value, dict):
            raise ValueError("tool_choice must be a table")
        servers = value.get("servers_off", [])
        tools = value.get("tools_off", [])
        if not isinstance(servers, list) or not all(isinstance(s, str) for s in servers):
            raise ValueError("tool_choice.servers_off must be a list of server names")
        pairs = isinstance(tools, list) and all(
            isinstance(p, list) and len(p) == 2 and all(isinstance(s, str) for s in p)
            for p in tools
        )
        if not pairs:
            raise ValueError("tool_choice.tools_off must be a list of [server, tool] pairs")
        return cls(frozenset(servers), frozenset((s, t) for s, t in tools))

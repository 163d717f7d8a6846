"""`[mcp_servers.NAME]` tables of config.toml, in the shape Codex CLI users already write.

    [mcp_servers.files]                  # stdio: the app starts the command
    command = "npx"
    args = ["-y", "@modelcontextprotocol/server-filesystem", "/home/me/notes"]
    env = { "LOG_LEVEL" = "warn" }
    enabled_tools = ["read_file", "list_directory"]   # optional allow-list

    [mcp_servers.search]                 # streamable HTTP: a server already running
    url = "http://127.0.0.1:8931/mcp"
    timeout = 30                         # seconds a tool call may take

Checked once here (`check_mcp_servers`, the config schema's check for the key); the
tools package (`ssdmoe_tui.tools`) only reads the typed `McpServer` values. Codex's
own key names are accepted as well (`tool_timeout_sec`, `startup_timeout_sec`,
`disabled_tools`), so a table copied from ~/.codex/config.toml works unchanged.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
TIMEOUT_MAX = 24 * 3600.0
DEFAULT_TOOL_TIMEOUT = 60.0  # Codex's default for tool_timeout_sec
DEFAULT_STARTUP_TIMEOUT = 10.0  # Codex's default for startup_timeout_sec

_KEYS = {
    "command", "args", "env", "cwd", "url", "enabled", "timeout", "tool_timeout_sec",
    "startup_timeout_sec", "enabled_tools", "disabled_tools", "start_at_launch",
}  # fmt: skip


@dataclass(frozen=True)
class McpServer:
    """One configured MCP server: a command to start (stdio) or a URL (streamable HTTP)."""

    name: str
    command: str = ""
    args: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    cwd: str = ""
    url: str = ""
    enabled: bool = True
    timeout: float = DEFAULT_TOOL_TIMEOUT  # one tool call
    startup_timeout: float = DEFAULT_STARTUP_TIMEOUT  # start, handshake and tool list
    enabled_tools: tuple[str, ...] | None = None  # None: every tool the server lists
    disabled_tools: tuple[str, ...] = ()
    start_at_launch: bool = False  # else when a conversation first needs tools

    @property
    def transport(self) -> str:
        return "http" if self.url else "stdio"

    def allows(self, tool: str) -> bool:
        """Whether the model is offered this tool of the server."""
        if self.enabled_tools is not None and tool not in self.enabled_tools:
            return False
        return tool not in self.disabled_tools

    def describe(self) -> str:
        """`command args...` or the URL, one line."""
        if self.url:
            return self.url
        return " ".join([self.command, *self.args])


def _strings(value: object, what: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ValueError(f"{what} must be a list of strings")
    return tuple(value)


def _seconds(value: object, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{what} must be a number of seconds")
    if not 0 < value <= TIMEOUT_MAX:
        raise ValueError(f"{what} must be in (0, {TIMEOUT_MAX:.0f}] seconds")
    return float(value)


def _flag(value: object, what: str) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"{what} must be true or false")
    return value


def _text(value: object, what: str) -> str:
    if not isinstance(value, str):
        raise ValueError(f"{what} must be a string")
    return value


def check_server(name: str, raw: object) -> McpServer:
    """One `[mcp_servers.NAME]` table as a typed value; ValueError names what is wrong."""
    if not NAME.match(name):
        raise ValueError(f"server name {name[:40]!r}: use letters, digits, '-' and '_'")
    if not isinstance(raw, dict):
        raise ValueError(f"{name}: expected a table ([mcp_servers.{name}])")
    unknown = sorted(set(raw) - _KEYS)
    if unknown:
        raise ValueError(
            f"{name}: unknown key {unknown[0][:40]!r} (known: {', '.join(sorted(_KEYS))})"
        )
    command = _text(raw.get("command", ""), f"{name}.command").strip()
    url = _text(raw.get("url", ""), f"{name}.url").strip()
    if bool(command) == bool(url):
        raise ValueError(f"{name}: needs either command (stdio) or url (streamable HTTP)")
    if url and not re.match(r"^https?://[^\s/]+", url):
        raise ValueError(f"{name}.url must be an http:// or https:// address, not {url[:60]!r}")
    env = raw.get("env", {})
    if not isinstance(env, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in env.items()
    ):
        raise ValueError(f'{name}.env must be a table of "NAME" = "value" strings')
    if url and (raw.get("args") or env or raw.get("cwd")):
        raise ValueError(f"{name}: args, env and cwd are for a command, not a url")
    timeout = raw.get("timeout", raw.get("tool_timeout_sec", DEFAULT_TOOL_TIMEOUT))
    enabled_tools = raw.get("enabled_tools")
    return McpServer(
        name=name,
        command=command,
        args=_strings(raw.get("args", []), f"{name}.args"),
        env=dict(env),
        cwd=_text(raw.get("cwd", ""), f"{name}.cwd"),
        url=url,
        enabled=_flag(raw.get("enabled", True), f"{name}.enabled"),
        timeout=_seconds(timeout, f"{name}.timeout"),
        startup_timeout=_seconds(
            raw.get("startup_timeout_sec", DEFAULT_STARTUP_TIMEOUT), f"{name}.startup_timeout_sec"
        ),
        enabled_tools=None
        if enabled_tools is None
        else _strings(enabled_tools, f"{name}.enabled_tools"),
        disabled_tools=_strings(raw.get("disabled_tools", []), f"{name}.disabled_tools"),
        start_at_launch=_flag(raw.get("start_at_launch", False), f"{name}.start_at_launch"),
    )


def check_mcp_servers(value: object) -> dict[str, McpServer]:
    """The whole `[mcp_servers]` table: name -> McpServer."""
    if not isinstance(value, dict):
        raise ValueError("expected [mcp_servers.NAME] tables")
    return {name: check_server(name, raw) for name, raw in value.items()}

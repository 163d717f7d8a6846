"""`[mcp_servers.NAME]` tables of config.toml, in the shape Codex CLI users already write.

    [mcp_servers.files]                  # stdio: the app starts the command
    command = "npx"
    args = ["-y", "@modelcontextprotocol/server-filesystem", "/home/me/notes"]
    env = { "LOG_LEVEL" = "warn" }
    enabled_tools = ["read_file", "list_directory"]   # optional allow-list

    [mcp_servers.search]                 # streamable HTTP: a server already running
    url = "http://127.0.0.1:8931/mcp"
    timeout = 30                         # seconds a tool call may take

Checked once here (`read_mcp_servers`, the config schema's check for the key); the
tools package (`ssdmoe_tui.tools`) only reads the typed `McpServer` values. Codex's
own key names are accepted as well (`tool_timeout_sec`, `startup_timeout_sec`,
`startup_timeout_ms`, `disabled_tools`, `env_vars`, `bearer_token_env_var`,
`http_headers`, `env_http_headers`), so a table copied from ~/.codex/config.toml works
unchanged. Each table stands alone: a bad one leaves out its own server, with one line
naming it; a key nobody knows is named and ignored. No line ever quotes a value: `env`,
headers and URLs hold tokens (issue 45), so a line names the key and says what it wants.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from ssdmoe_tui.errors import printable

NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
ENV_KEY = re.compile(r"^[^=\x00]{1,256}$")  # what an environment can hold
HEADER_NAME = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]{1,128}$")  # an HTTP token
TIMEOUT_MAX = 24 * 3600.0
DEFAULT_TOOL_TIMEOUT = 60.0  # Codex's default for tool_timeout_sec
DEFAULT_STARTUP_TIMEOUT = 10.0  # Codex's default for startup_timeout_sec

_KEYS = {
    "command", "args", "env", "env_vars", "cwd", "url", "bearer_token_env_var",
    "http_headers", "env_http_headers", "enabled", "timeout", "tool_timeout_sec",
    "startup_timeout_sec", "startup_timeout_ms", "enabled_tools", "disabled_tools",
    "start_at_launch",
}  # fmt: skip
# Codex keys this app has no use for: named as such, and ignored.
_CODEX_UNUSED = {"required", "scopes", "oauth_resource", "experimental_use_rmcp_client"}


@dataclass(frozen=True)
class McpServer:
    """One configured MCP server: a command to start (stdio) or a URL (streamable HTTP)."""

    name: str
    command: str = ""
    args: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    env_vars: tuple[str, ...] = ()  # names passed through from the app's environment
    cwd: str = ""
    url: str = ""
    bearer_token_env_var: str = ""  # sent as `Authorization: Bearer $VAR`
    http_headers: dict[str, str] = field(default_factory=dict)
    env_http_headers: dict[str, str] = field(default_factory=dict)  # header -> variable
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
        """`command args...` or the URL without its query (which may hold a token), one line."""
        if self.url:
            return self.url.split("?", 1)[0]
        return " ".join([self.command, *self.args])

    def environment(self, environ: Mapping[str, str] = os.environ) -> dict[str, str]:
        """What a stdio server's process gets on top of the SDK's safe defaults: `env`,
        and each of `env_vars` that is set here (Codex passes an unset one as absent)."""
        passed = {k: environ[k] for k in self.env_vars if k in environ}
        return {**passed, **self.env}

    def headers(self, environ: Mapping[str, str] = os.environ) -> dict[str, str]:
        """The HTTP headers of a URL server, variables read now; ValueError names a
        variable that is not set (never a value)."""

        def var(name: str, what: str) -> str:
            if not environ.get(name):
                raise ValueError(f"{what} names ${name}, which is not set")
            return environ[name]

        out = dict(self.http_headers)
        for header, name in self.env_http_headers.items():
            out[header] = var(name, f"env_http_headers.{header}")
        if self.bearer_token_env_var:
            out["Authorization"] = "Bearer " + var(
                self.bearer_token_env_var, "bearer_token_env_var"
            )
        return out


def _strings(value: object, what: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ValueError(f"{what} must be a list of strings")
    return tuple(value)


def _seconds(value: object, what: str, unit: float = 1.0) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{what} must be a number of {'seconds' if unit == 1 else 'ms'}")
    seconds = value * unit
    if not 0 < seconds <= TIMEOUT_MAX:
        raise ValueError(f"{what} must be in (0, {TIMEOUT_MAX / unit:.0f}]")
    return float(seconds)


def _flag(value: object, what: str) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"{what} must be true or false")
    return value


def _text(value: object, what: str) -> str:
    if not isinstance(value, str):
        raise ValueError(f"{what} must be a string")
    return value


def _table(value: object, what: str, keys: re.Pattern[str], values: str) -> dict[str, str]:
    """A TOML table of strings whose names match `keys` (its values are never quoted)."""
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise ValueError(f'{what} must be a table of "NAME" = "{values}" strings')
    bad = next((k for k in value if not keys.match(k)), None)
    if bad is not None:
        raise ValueError(f"{what}: {printable(bad, 40)!r} is not a valid name")
    return dict(value)


def _env_name(value: object, what: str) -> str:
    name = _text(value, what)
    if not ENV_NAME.match(name):
        raise ValueError(f"{what} must name an environment variable (letters, digits, _)")
    return name


def check_server(name: str, raw: object) -> tuple[McpServer, list[str]]:
    """One `[mcp_servers.NAME]` table as a typed value, and one line per key it ignored;
    ValueError names what makes the table unusable (a key, never its value)."""
    if not NAME.match(name):
        raise ValueError(f"server name {printable(name, 40)!r}: use letters, digits, '-' and '_'")
    if not isinstance(raw, dict):
        raise ValueError(
            f"{name} is a value, not a server's table: each server is a table of its own, "
            f"[mcp_servers.NAME] with command or url below it"
        )
    ignored = []
    for key in sorted(set(raw) - _KEYS):
        why = "a Codex key this app does not use" if key in _CODEX_UNUSED else "unknown key"
        ignored.append(f"{name}: {why} {printable(key, 40)!r} ignored")
    command = _text(raw.get("command", ""), f"{name}.command").strip()
    url = _text(raw.get("url", ""), f"{name}.url").strip()
    if bool(command) == bool(url):
        raise ValueError(f"{name}: needs either command (stdio) or url (streamable HTTP)")
    if url and not re.match(r"^https?://[^\s/]+", url):
        raise ValueError(f"{name}.url must be an http:// or https:// address")
    env = _table(raw.get("env", {}), f"{name}.env", ENV_KEY, "value")
    env_vars = _strings(raw.get("env_vars", []), f"{name}.env_vars")
    for var in env_vars:
        _env_name(var, f"{name}.env_vars")
    for_command = ("args", "env", "env_vars", "cwd")
    for_url = ("bearer_token_env_var", "http_headers", "env_http_headers")
    if url and any(raw.get(k) for k in for_command):
        raise ValueError(f"{name}: {', '.join(for_command)} are for a command, not a url")
    if command and any(raw.get(k) for k in for_url):
        raise ValueError(f"{name}: {', '.join(for_url)} are for a url, not a command")
    headers = _table(raw.get("http_headers", {}), f"{name}.http_headers", HEADER_NAME, "value")
    env_headers = _table(
        raw.get("env_http_headers", {}), f"{name}.env_http_headers", HEADER_NAME, "VARIABLE"
    )
    for header, var in env_headers.items():
        _env_name(var, f"{name}.env_http_headers.{header}")
    bearer = raw.get("bearer_token_env_var", "")
    timeout_key = (
        "timeout" if "timeout" in raw or "tool_timeout_sec" not in raw else "tool_timeout_sec"
    )
    timeout = raw.get(timeout_key, DEFAULT_TOOL_TIMEOUT)  # named as written (Codex's key too)
    if "startup_timeout_ms" in raw and "startup_timeout_sec" not in raw:
        startup = _seconds(raw["startup_timeout_ms"], f"{name}.startup_timeout_ms", 0.001)
    else:
        startup = _seconds(
            raw.get("startup_timeout_sec", DEFAULT_STARTUP_TIMEOUT), f"{name}.startup_timeout_sec"
        )
    enabled_tools = raw.get("enabled_tools")
    server = McpServer(
        name=name,
        command=command,
        args=_strings(raw.get("args", []), f"{name}.args"),
        env=env,
        env_vars=env_vars,
        cwd=_text(raw.get("cwd", ""), f"{name}.cwd"),
        url=url,
        bearer_token_env_var=_env_name(bearer, f"{name}.bearer_token_env_var") if bearer else "",
        http_headers=headers,
        env_http_headers=env_headers,
        enabled=_flag(raw.get("enabled", True), f"{name}.enabled"),
        timeout=_seconds(timeout, f"{name}.{timeout_key}"),
        startup_timeout=startup,
        enabled_tools=None
        if enabled_tools is None
        else _strings(enabled_tools, f"{name}.enabled_tools"),
        disabled_tools=_strings(raw.get("disabled_tools", []), f"{name}.disabled_tools"),
        start_at_launch=_flag(raw.get("start_at_launch", False), f"{name}.start_at_launch"),
    )
    return server, ignored


def read_mcp_servers(value: object) -> tuple[dict[str, McpServer], list[str]]:
    """The whole `[mcp_servers]` table: the good servers by name, and one line per
    problem (a bad table: its server is left out, the others kept; an ignored key).
    ValueError only when `mcp_servers` is not a table at all."""
    if not isinstance(value, dict):
        raise ValueError("expected [mcp_servers.NAME] tables")
    servers: dict[str, McpServer] = {}
    problems: list[str] = []
    for name, raw in value.items():
        try:
            server, ignored = check_server(name, raw)
        except ValueError as e:
            problems.append(f"[mcp_servers] {e}; server {printable(name, 40)!r} not started")
            continue
        servers[name] = server
        problems += [f"[mcp_servers] {line}" for line in ignored]
    return servers, problems


def check_mcp_servers(value: object) -> dict[str, McpServer]:
    """Strict: every table good and every key known, else ValueError with the first
    problem (for a program's own tables, such as the tests'); config.toml is read with
    `read_mcp_servers`, which keeps the good servers."""
    servers, problems = read_mcp_servers(value)
    if problems:
        raise ValueError(problems[0])
    return servers

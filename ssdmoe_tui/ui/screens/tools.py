"""F10: the MCP servers from config.toml, their state and their tools (each with its
arguments and what it does, as the model is told); `s` starts the ones not running."""

from __future__ import annotations

from rich.table import Table
from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Label, Static

from ssdmoe_tui.terminal_text import visible
from ssdmoe_tui.tools.servers import ToolServers, ToolSpec

EMPTY = (
    "No MCP servers configured. Add one to config.toml:\n\n"
    "  [mcp_servers.files]\n"
    '  command = "npx"\n'
    '  args = ["-y", "@modelcontextprotocol/server-filesystem", "/home/me/notes"]\n\n'
    "(docs/app.md, Tools)"
)


def signature(tool: ToolSpec) -> str:
    """`name(city: string, days?: integer)`: the arguments the model is asked for, from
    the tool's input schema (`?`: not required)."""
    schema = tool.input_schema if isinstance(tool.input_schema, dict) else {}
    props = schema.get("properties")
    props = props if isinstance(props, dict) else {}
    required = schema.get("required")
    required = set(required) if isinstance(required, list) else set()
    args = []
    for name, spec in list(props.items())[:12]:
        kind = spec.get("type", "any") if isinstance(spec, dict) else "any"
        kind = kind if isinstance(kind, str) else "/".join(map(str, kind))
        args.append(f"{name}{'' if name in required else '?'}: {kind}")
    more = ", ..." if len(props) > 12 else ""
    return f"{tool.name}({', '.join(args)}{more})"


def tool_lines(tools: list[ToolSpec]) -> str:
    """One line per tool: its signature and the first line of its description."""
    lines = []
    for t in tools:
        about = (t.description.strip().splitlines() or [""])[0]
        about = about if len(about) <= 100 else about[:99] + "…"
        lines.append(f"{signature(t)}" + (f"  {about}" if about else ""))
    return "\n".join(lines)


def servers_table(servers: ToolServers) -> Table:
    table = Table(box=None, padding=(0, 2, 0, 0), show_edge=False, expand=True)
    table.add_column("server", style="bold", no_wrap=True)
    table.add_column("state", overflow="fold")  # a log path is shown whole
    table.add_column("tools")
    for name, s in servers.servers.items():
        state = s.state + (f": {s.error}" if s.error else "")
        tools = tool_lines(s.tools) if s.state == "running" else ""
        if s.hidden:
            tools += f"\n(+{s.hidden} not allowed)"
        where = f"{s.config.transport}: {s.config.describe()}"
        # Text, not str: names, errors and command lines come from outside (a server, the
        # config) and a str cell is parsed as markup ('[/x]' raised MarkupError); their
        # control characters are escaped (visible)
        table.add_row(Text(visible(name)), Text(visible(state)), Text(visible(tools or where)))
    return table


class ToolsScreen(ModalScreen[None]):
    BINDINGS = [
        Binding("escape,f10,q", "dismiss", "Close", id="tools.close"),
        Binding("s", "start", "Start servers", id="tools.start"),
    ]

    def __init__(self, servers: ToolServers | None) -> None:
        super().__init__(classes="dialog-screen")
        self.servers = servers

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog wide", id="tools-dialog"):
            yield Label("Tools: MCP servers  (s starts them, Esc closes)", classes="dialog-title")
            with VerticalScroll():
                yield Static(id="tools-table")

    def on_mount(self) -> None:
        self.refresh_table()
        self.set_interval(0.5, self.refresh_table)

    def refresh_table(self) -> None:
        table = self.query_one("#tools-table", Static)
        if self.servers is None or not self.servers.servers:
            table.update(EMPTY)
        else:
            table.update(servers_table(self.servers))

    def action_start(self) -> None:
        if self.servers is not None and self.servers.pending() + self._failed():
            self._start()

    def _failed(self) -> list[str]:
        assert self.servers is not None
        return [n for n, s in self.servers.servers.items() if s.state == "failed"]

    @work(thread=True, exclusive=True, exit_on_error=False)
    def _start(self) -> None:
        assert self.servers is not None
        for line in self.servers.start():
            self.app.call_from_thread(self.notify, line, severity="error", markup=False)

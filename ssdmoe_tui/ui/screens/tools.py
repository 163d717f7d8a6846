"""F10: the MCP servers from config.toml, their state and their tools (each with its
arguments and what it does, as the model is told); `s` starts the ones not running.
Below them, which servers and tools this conversation has on (Space or Enter toggles
one): the screen closes with that choice, which the app keeps with the conversation.
When the loaded model cannot use tools, or every `[mcp_servers]` table was refused,
the screen says so first, in the words already given (one line each)."""

from __future__ import annotations

from collections.abc import Sequence

from rich.table import Table
from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Label, SelectionList, Static
from textual.widgets.selection_list import Selection

from ssdmoe_tui.terminal_text import visible
from ssdmoe_tui.tools.choice import ToolChoice
from ssdmoe_tui.tools.servers import ToolServers, ToolSpec

EMPTY = (
    "No MCP servers configured. Add one to config.toml:\n\n"
    "  [mcp_servers.files]\n"
    '  command = "npx"\n'
    '  args = ["-y", "@modelcontextprotocol/server-filesystem", "/home/me/notes"]\n\n'
    "(docs/app.md, Tools)"
)
REFUSED = "No MCP server to run: config.toml's [mcp_servers] tables were refused:"
CHOICE_TITLE = "On in this conversation (Space toggles; Esc keeps the choice):"
Key = tuple[str, str]  # (server, "") for a whole server, (server, tool) for one tool


def refused_text(lines: Sequence[str]) -> Text:
    """What F10 says when tables were configured but none could be used: the config's
    own warnings about them, one line each (they name the file, the table and why; as
    Text, not markup: `[mcp_servers]` is no style)."""
    return Text("\n".join([REFUSED, *(f"  {visible(line)}" for line in lines)]))


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
        if s.left_out:  # listed, but unusable (tools/servers.py left_out_line says why)
            tools += f"\n(+{len(s.left_out)} unusable: {', '.join(n for n, _ in s.left_out[:3])})"
        where = f"{s.config.transport}: {s.config.describe()}"
        # Text, not str: names, errors and command lines come from outside (a server, the
        # config) and a str cell is parsed as markup ('[/x]' raised MarkupError); their
        # control characters are escaped (visible)
        table.add_row(Text(visible(name)), Text(visible(state)), Text(visible(tools or where)))
    return table


def choice_rows(servers: ToolServers, choice: ToolChoice) -> list[tuple[str, Key, bool]]:
    """The toggles: each server, then each tool it offers now (a server not running
    offers none yet), with whether this conversation has it on."""
    rows: list[tuple[str, Key, bool]] = []
    for name, s in servers.servers.items():
        on = choice.server_on(name)
        rows.append((visible(f"{name}  (all its tools)"), (name, ""), on))
        for t in s.tools if s.state == "running" else []:
            note = "" if on else "  (its server is off)"
            own = (name, t.name) not in choice.tools_off  # its own toggle, whatever the server's
            rows.append((visible(f"  {name} · {t.name}{note}"), (name, t.name), own))
    return rows


class ToolsScreen(ModalScreen[ToolChoice | None]):
    """Closes with the conversation's choice (None when there was none to make)."""

    BINDINGS = [
        Binding("escape,f10,q", "close", "Close", id="tools.close"),
        Binding("s", "start", "Start servers", id="tools.start"),
    ]

    def __init__(
        self,
        servers: ToolServers | None,
        choice: ToolChoice | None = None,
        *,
        refused: Sequence[str] = (),
        cannot_use: str = "",
    ) -> None:
        """`choice`: the open conversation's (None: no toggles); `refused`: the config's
        warnings about its [mcp_servers] tables; `cannot_use`: why the loaded model
        cannot use tools ("" when it can)."""
        super().__init__(classes="dialog-screen")
        self.servers = servers
        self.choice = choice
        self.refused = tuple(refused)
        self.cannot_use = cannot_use
        self._rows: list[tuple[str, Key, bool]] = []

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog wide", id="tools-dialog"):
            yield Label("Tools: MCP servers  (s starts them, Esc closes)", classes="dialog-title")
            if self.cannot_use:
                yield Static(Text(visible(self.cannot_use)), id="tools-cannot")
            with VerticalScroll(id="tools-scroll"):
                yield Static(id="tools-table")
            if self.choice is not None and self.servers is not None and self.servers.servers:
                yield Label(CHOICE_TITLE, classes="dialog-hint")
                yield SelectionList[Key](id="tools-on")

    def on_mount(self) -> None:
        self.refresh_table()
        self.set_interval(0.5, self.refresh_table)
        toggles = self.query(SelectionList)
        if toggles:
            toggles.first().focus()

    def refresh_table(self) -> None:
        table = self.query_one("#tools-table", Static)
        if self.servers is None or not self.servers.servers:
            table.update(refused_text(self.refused) if self.refused else EMPTY)
        else:
            table.update(servers_table(self.servers))
        self._sync_toggles()

    def _sync_toggles(self) -> None:
        """The toggles as the servers and the choice stand (rebuilt only when they change:
        a server started, a server toggled), keeping the highlighted row."""
        if self.choice is None or self.servers is None or not self.query(SelectionList):
            return
        rows = choice_rows(self.servers, self.choice)
        if rows == self._rows:
            return
        self._rows = rows
        toggles = self.query_one("#tools-on", SelectionList)
        at = toggles.highlighted
        with toggles.prevent(SelectionList.SelectedChanged, SelectionList.SelectionToggled):
            toggles.set_options([Selection(Text(p), key, on) for p, key, on in rows])
        if at is not None and rows:
            toggles.highlighted = min(at, len(rows) - 1)

    @on(SelectionList.SelectionToggled, "#tools-on")
    def _toggled(self, event: SelectionList.SelectionToggled) -> None:
        assert self.choice is not None
        server, tool = event.selection.value
        on = event.selection.value in event.selection_list.selected
        if tool:
            self.choice = self.choice.with_tool(server, tool, on)
        else:
            self.choice = self.choice.with_server(server, on)
        self._sync_toggles()

    def action_close(self) -> None:
        self.dismiss(self.choice)

    def action_start(self) -> None:
        if self.servers is not None and self.servers.restartable():
            self._start()

    @work(thread=True, exclusive=True, exit_on_error=False)
    def _start(self) -> None:
        assert self.servers is not None
        failed = self.servers.start()
        self.app.call_from_thread(self.refresh_table)  # the states, before the lines say why
        for line in failed:
            self.app.call_from_thread(self.notify, line, severity="error", markup=False)

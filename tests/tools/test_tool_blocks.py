"""The tool blocks and the F10 screen show what the model, a tool, a server and the
config wrote, as it is: a call's arguments, a result's first line, a server's command
line, tool names and errors are text from outside, and Rich-style markup in them
('[/bold]', '[b]') was parsed: a closing tag with no opening one raised MarkupError (the
tool loop failed, a resumed conversation's blocks were not shown, F10 ended the app),
and a bracketed word vanished from the title the user reads."""

from __future__ import annotations

import io

from rich.console import Console
from textual.app import App, ComposeResult
from textual.widgets import Collapsible
from textual.widgets._collapsible import CollapsibleTitle

from ssdmoe_tui.mcp_config import check_mcp_servers
from ssdmoe_tui.tools.calls import ToolCall
from ssdmoe_tui.tools.servers import ToolServers
from ssdmoe_tui.ui.screens.tools import servers_table
from ssdmoe_tui.ui.widgets.tool_blocks import ToolCallBlock, ToolResultBlock

ARGS = '{"pattern": "[/bold] a [b] c"}'


class Blocks(App):
    def compose(self) -> ComposeResult:
        yield ToolCallBlock(ToolCall("c1", "grep", ARGS), "waiting for approval")
        yield ToolResultBlock("grep", "[/x] found [b] here", is_error=False)


def _title(block: Collapsible) -> str:
    return block.query_one(CollapsibleTitle).label.plain


async def test_markup_in_a_call_or_result_is_shown_as_written():
    app = Blocks()
    async with app.run_test(size=(120, 20)) as pilot:
        call = app.query_one(ToolCallBlock)
        assert '"[/bold] a [b] c"' in _title(call)
        call.set_state("running [/done]")
        await pilot.pause()
        assert _title(call).endswith("[running [/done]]")
        assert "[/x] found [b] here" in _title(app.query_one(ToolResultBlock))


def test_the_f10_table_shows_a_command_line_with_markup_as_written():
    config = {"grep": {"command": "rg", "args": ["[/x]", "[b]"]}}
    console = Console(width=120, record=True, file=io.StringIO())
    console.print(servers_table(ToolServers(check_mcp_servers(config))))
    assert "stdio: rg [/x] [b]" in console.export_text()

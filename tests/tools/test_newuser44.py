"""What a new user met with tools (issue 44, item 5: M1, M2, M7, M11, M13, M14), each
through the real app (Textual's pilot) or the real config reader, with the test MCP
server (tests/tools/mcp_test_server.py, the official SDK) where a server is needed."""

from __future__ import annotations

import sys

from ssdmoe_tui.mcp_config import check_mcp_servers
from ssdmoe_tui.ui.app import ChatSettings, SsdmoeApp
from ssdmoe_tui.ui.screens.tools import ToolsScreen
from tests.helpers.mcp_servers import stdio_server
from tests.helpers.pilot import SIZE, record_notifications, screen_text, wait_until


async def test_m1_f10_then_s_without_the_tools_extra_says_how_to_get_it(monkeypatch):
    # Without the `tools` extra, `import mcp` fails: a None in sys.modules is how Python
    # itself marks a module that cannot be imported.
    monkeypatch.setitem(sys.modules, "mcp", None)
    servers = check_mcp_servers({"weather": stdio_server()})
    app = SsdmoeApp(ChatSettings(mcp_servers=servers), engine_factory=None)
    async with app.run_test(size=SIZE) as pilot:
        said = record_notifications(app)
        await pilot.press("f10")
        await wait_until(pilot, lambda: isinstance(app.screen, ToolsScreen), what="F10")
        await pilot.press("s")
        await wait_until(pilot, lambda: said, what="the line about the mcp package")
        assert said == [
            ("error", "MCP servers need the mcp package: pip install 'ssdmoe-tui[tools]'")
        ]
        await pilot.pause(0.3)
        assert app.is_running and isinstance(app.screen, ToolsScreen)
        assert "failed: needs the mcp package: pip install" in screen_text(app)
        await pilot.press("escape")
    assert app.return_code in (0, None)

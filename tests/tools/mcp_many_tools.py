"""An MCP server (the official SDK's `MCPServer`) that lists many tools: TOOLS of them
(default 300), `tool_00000` ... each echoing its argument, and with HUGE_KIB set one more,
`huge`, whose description alone is that many KiB. For the bounds on what one server may
offer the model (tools/servers.py `within_bounds`).

    python -m tests.tools.mcp_many_tools
"""

from __future__ import annotations

import os

from mcp.server.mcpserver import MCPServer

server = MCPServer("ssdmoe-many-tools")


def _echo(i: int):  # noqa: ANN202 - a tool function
    def tool(text: str) -> str:
        return f"tool {i}: {text}"

    return tool


def main() -> None:
    huge = int(os.environ.get("HUGE_KIB", "0"))
    if huge:  # listed first: left out, the smaller ones after it still offered
        server.add_tool(_echo(-1), name="huge", description="x" * (huge << 10))
    for i in range(int(os.environ.get("TOOLS", "300"))):
        server.add_tool(_echo(i), name=f"tool_{i:05d}", description=f"Echo the text ({i}).")
    server.run("stdio")


if __name__ == "__main__":
    main()

"""A hostile MCP server over stdio, written by hand (JSON-RPC lines): what the official
SDK's server would never send, so a test can see what the app makes of it.

    MODE=garbage python -m tests.tools.mcp_raw_server

MODE: `ok` (one tool, `good`), `garbage` (a line that is no JSON, then silence), `hang`
(nothing at all), `badinit` (an initialize answer of the wrong shape), `badtool` (`good`
and a tool whose inputSchema is a string), `names` (`good` and tools named with a slash,
`..`, a newline, a terminal escape, another case and a Cyrillic look-alike letter).
"""

from __future__ import annotations

import json
import os
import sys
import time

NAMES = ["a/b", "..", "x\ny", "t\x1b]0;pwned\x07", "Good", "g\u043e\u043ed"]


def tools(mode: str) -> list[dict]:
    listed = [{"name": "good", "inputSchema": {"type": "object", "properties": {}}}]
    if mode == "badtool":
        listed.append({"name": "bad", "inputSchema": "not a schema"})
    if mode == "names":
        listed += [{"name": n, "inputSchema": {"type": "object"}} for n in NAMES]
    return listed


def main() -> None:
    mode = os.environ.get("MODE", "ok")
    if mode == "garbage":
        print("hello, this is not JSON", flush=True)
    if mode in ("garbage", "hang"):
        time.sleep(120)
        return
    for line in sys.stdin:
        msg = json.loads(line)
        if "id" not in msg:
            continue  # a notification
        method = msg["method"]
        if method == "initialize":
            result: dict = {
                "protocolVersion": msg["params"]["protocolVersion"],
                "capabilities": {"tools": {}},
                "serverInfo": {"name": "raw", "version": "1"},
            }
            if mode == "badinit":
                result["capabilities"] = "all of them"
        elif method == "tools/list":
            result = {"tools": tools(mode)}
        elif method == "tools/call":
            result = {"content": [{"type": "text", "text": f"ran {msg['params']['name']}"}]}
        else:
            result = {}
        print(json.dumps({"jsonrpc": "2.0", "id": msg["id"], "result": result}), flush=True)


if __name__ == "__main__":
    main()

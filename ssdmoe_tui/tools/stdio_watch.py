"""An MCP server's transport, watched: its process, the end of its output, what it
sends that is not MCP, and the tools it lists that cannot be used.

The SDK's `stdio_client` starts the server and bridges its pipes; when the server dies
(mid-call, or minutes later) its stdout ends and every later call reads "Connection
closed", but nothing else changes: the server still showed as "running" in F10 and
its tools were still offered. This wraps that transport so the owner learns both

- that the server's output ended (`Watch.gone`, set on the read stream's end of file,
  which the SDK's own shutdown also reaches: the owner tells the two apart by whether
  it asked the server to stop), and
- how its process ended (`Watch.returncode`, once the SDK has reaped it).

Two more things the SDK takes whole or not at all are looked at here first: a line on
a stdio server's stdout that is not JSON-RPC (the SDK drops it; a server that writes
only such lines "did not start in 3 s" without a word: `Watch.bad_output` keeps the
first for that line), and the tools in a `tools/list` answer: the SDK refuses the whole
list (the whole server) for one tool whose schema it cannot read, so each tool is
checked on its own (`mcp_types.Tool`) and one that fails is left out of the answer,
named in `Watch.left_out`.

The SDK does not hand out the process it starts, so `watch_spawns` wraps the one
function `stdio_client` starts it with (`mcp.client.stdio._create_platform_compatible_process`,
looked up at call time) to pass the process to the `Watch` of the transport being
entered (a context variable: each server's task has its own). Should a later SDK rename
that function, nothing breaks: the exit status is then said to be unknown.
"""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
import re
import signal
from contextlib import asynccontextmanager
from typing import Any

from ssdmoe_tui.errors import printable
from ssdmoe_tui.tools.stderr_log import StderrLog

# What a tool's name may be (the MCP spec's advice: 1-128 ASCII letters, digits, _ - .,
# and / for namespaces): a newline, an escape or a look-alike letter in a name the model
# is offered and the user asked to approve is not taken.
TOOL_NAME = re.compile(r"[A-Za-z0-9_./-]{1,128}")

_SPAWNING: contextvars.ContextVar[Watch | None] = contextvars.ContextVar(
    "ssdmoe_mcp_spawning", default=None
)


class Watch:
    """What the owner of one stdio server's transport learns about it."""

    def __init__(self) -> None:
        self.gone = asyncio.Event()  # the server's output ended
        self.process: Any = None  # the SDK's (anyio) process, when the hook saw it
        self.bad_output = ""  # the first line it sent that is not JSON-RPC (quoted, cut)
        self.left_out: list[tuple[str, str]] = []  # ("'name'", why): each tool listed unusable

    def saw(self, item: Any) -> Any:
        """One message from the server as the SDK is to get it: a parse failure noted,
        a `tools/list` answer without the tools the SDK would refuse it for."""
        if isinstance(item, Exception):
            if not self.bad_output:
                self.bad_output = _quoted_input(item)
            return item
        message = getattr(item, "message", None)
        result = getattr(message, "result", None)
        if not isinstance(result, dict) or not isinstance(result.get("tools"), list):
            return item
        kept = []
        for tool in result["tools"]:
            why = _unusable(tool)
            if why:
                name = tool.get("name") if isinstance(tool, dict) else None
                shown = printable(name, 40) if isinstance(name, str) else "(no name)"
                self.left_out.append((f"'{shown}'", why))
            else:
                kept.append(tool)
        if len(kept) == len(result["tools"]):
            return item
        fixed = message.model_copy(update={"result": {**result, "tools": kept}})
        return dataclasses.replace(item, message=fixed)

    @property
    def returncode(self) -> int | None:
        return getattr(self.process, "returncode", None)

    def exit_words(self) -> str:
        """'exited with status 3', 'killed by signal 9 (SIGKILL)', or, with no process
        known (streamable HTTP, or an SDK whose spawn function moved), what is known."""
        code = self.returncode
        if code is None:
            return "its connection closed" if self.process is None else "stopped answering"
        if code < 0:
            try:
                name = f" ({signal.Signals(-code).name})"
            except ValueError:
                name = ""
            return f"killed by signal {-code}{name}"
        return f"exited with status {code}"


class _WatchedReads:
    """The transport's read stream, setting `gone` when it ends (the SDK's `ReadStream`
    protocol: receive, aclose, async iteration, async context)."""

    def __init__(self, inner: Any, watch: Watch) -> None:
        self._inner = inner
        self._watch = watch

    def __getattr__(self, name: str) -> Any:  # last_context and the like
        return getattr(self._inner, name)

    async def receive(self) -> Any:
        import anyio

        try:
            item = await self._inner.receive()
        except anyio.EndOfStream:  # the server's stdout ended (our own close is another error)
            self._watch.gone.set()
            raise
        return self._watch.saw(item)

    async def aclose(self) -> None:
        await self._inner.aclose()

    def __aiter__(self) -> _WatchedReads:
        return self

    async def __anext__(self) -> Any:
        import anyio

        try:
            return await self.receive()
        except anyio.EndOfStream:
            raise StopAsyncIteration from None

    async def __aenter__(self) -> _WatchedReads:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


def _quoted_input(e: Exception) -> str:
    """The line a parse failure was about (pydantic keeps it as the error's input)."""
    errors = getattr(e, "errors", None)
    try:
        line = errors()[0]["input"] if callable(errors) else None
    except Exception:  # noqa: BLE001 - any other failure: no line to quote
        line = None
    return repr(printable(line, 80)) if isinstance(line, str) else printable(str(e), 80)


def _unusable(tool: Any) -> str:
    """Why the SDK (or this app) cannot take one listed tool; "" when it can."""
    from mcp_types import Tool
    from pydantic import ValidationError

    try:
        spec = Tool.model_validate(tool, by_name=False)
    except ValidationError as e:
        return pydantic_line(e)
    if not TOOL_NAME.fullmatch(spec.name):
        return "a tool's name is 1 to 128 letters, digits, _ - . or /"
    return ""


def pydantic_line(e: Any) -> str:
    """A pydantic ValidationError as one line: what was invalid, where, and why."""
    try:
        first = e.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "the message"
        return f"invalid {e.title} ({where}: {first['msg']})"
    except Exception:  # noqa: BLE001 - not shaped as expected: its own words
        return " ".join(str(e).split())


def watch_spawns() -> None:
    """Pass each process `stdio_client` starts to the transport's `Watch` (once)."""
    import mcp.client.stdio as stdio

    create = getattr(stdio, "_create_platform_compatible_process", None)
    if create is None or getattr(create, "ssdmoe_watched", False):
        return

    async def watched(*args: Any, **kwargs: Any) -> Any:
        process = await create(*args, **kwargs)
        if (w := _SPAWNING.get()) is not None:
            w.process = process
        return process

    watched.ssdmoe_watched = True  # type: ignore[attr-defined]
    stdio._create_platform_compatible_process = watched


def stdio_transport(params: Any, errlog: StderrLog, watch: Watch) -> Any:
    """The SDK's `stdio_client` as a transport whose server's stderr goes to `errlog`
    (not the terminal the TUI draws on) and which `watch` follows."""
    from mcp.client.stdio import stdio_client

    watch_spawns()

    @asynccontextmanager
    async def transport():  # noqa: ANN202 - the SDK's Transport shape
        token = _SPAWNING.set(watch)
        try:
            async with stdio_client(params, errlog=errlog.writer) as (reads, writes):
                _SPAWNING.reset(token)
                token = None
                errlog.spawned()  # the server holds the pipe now: its end ends the log's copy
                yield _WatchedReads(reads, watch), writes
        finally:
            if token is not None:
                _SPAWNING.reset(token)

    return transport()


def watched(transport: Any, watch: Watch) -> Any:
    """Any transport (an async context giving the read and write streams) whose reads
    `watch` sees first (streamable HTTP: no process, no end of output to tell)."""

    @asynccontextmanager
    async def wrapped():  # noqa: ANN202 - the SDK's Transport shape
        async with transport as (reads, writes):
            yield _WatchedReads(reads, watch), writes

    return wrapped()

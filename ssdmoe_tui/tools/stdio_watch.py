"""A stdio MCP server's transport, watched: its process and the end of its output.

The SDK's `stdio_client` starts the server and bridges its pipes; when the server dies
(mid-call, or minutes later) its stdout ends and every later call reads "Connection
closed", but nothing else changes: the server still showed as "running" in F10 and
its tools were still offered. This wraps that transport so the owner learns both

- that the server's output ended (`Watch.gone`, set on the read stream's end of file,
  which the SDK's own shutdown also reaches: the owner tells the two apart by whether
  it asked the server to stop), and
- how its process ended (`Watch.returncode`, once the SDK has reaped it).

The SDK does not hand out the process it starts, so `watch_spawns` wraps the one
function `stdio_client` starts it with (`mcp.client.stdio._create_platform_compatible_process`,
looked up at call time) to pass the process to the `Watch` of the transport being
entered (a context variable: each server's task has its own). Should a later SDK rename
that function, nothing breaks: the exit status is then said to be unknown.
"""

from __future__ import annotations

import asyncio
import contextvars
import signal
from contextlib import asynccontextmanager
from typing import Any

from ssdmoe_tui.tools.stderr_log import StderrLog

_SPAWNING: contextvars.ContextVar[Watch | None] = contextvars.ContextVar(
    "ssdmoe_mcp_spawning", default=None
)


class Watch:
    """What the owner of one stdio server's transport learns about it."""

    def __init__(self) -> None:
        self.gone = asyncio.Event()  # the server's output ended
        self.process: Any = None  # the SDK's (anyio) process, when the hook saw it

    @property
    def returncode(self) -> int | None:
        return getattr(self.process, "returncode", None)

    def exit_words(self) -> str:
        """'exited with status 3', 'killed by signal 9 (SIGKILL)', or why not known."""
        code = self.returncode
        if code is None:
            return "exited (exit status unknown)" if self.process is None else "stopped answering"
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

    def __init__(self, inner: Any, gone: asyncio.Event) -> None:
        self._inner = inner
        self._gone = gone

    def __getattr__(self, name: str) -> Any:  # last_context and the like
        return getattr(self._inner, name)

    async def receive(self) -> Any:
        import anyio

        try:
            return await self._inner.receive()
        except anyio.EndOfStream:  # the server's stdout ended (our own close is another error)
            self._gone.set()
            raise

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
                yield _WatchedReads(reads, watch.gone), writes
        finally:
            if token is not None:
                _SPAWNING.reset(token)

    return transport()

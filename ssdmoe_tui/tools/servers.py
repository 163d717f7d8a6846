"""The configured MCP servers, held open by the official `mcp` SDK on one background
event loop (a daemon thread), so the UI thread and the engine thread only ever block on
a call with a deadline.

    servers = ToolServers(config.mcp_servers)
    servers.start()                 # every enabled server; blocks up to the startup timeouts
    servers.tools()                 # [ToolSpec]: what the model is offered
    servers.call("read_file", {"path": "a.txt"})  # -> ToolResult (never raises)
    servers.close()                 # stops every server; also at interpreter exit

Each server runs in its own task, inside `async with mcp.Client(...)` (stdio: the SDK
starts the command in its own process group and, on close, closes its stdin, then
terminates the group; streamable HTTP: the SDK ends the session). `close` is idempotent
and registered with `atexit`, so ctrl+q, a SIGTERM the app turns into a normal exit and
an uncaught exception all stop the servers; a process killed outright leaves a stdio
server its stdin's end of file, which ends an MCP server.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import json
import logging
import os
import threading
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ssdmoe_tui.errors import printable
from ssdmoe_tui.mcp_config import McpServer
from ssdmoe_tui.tools.stderr_log import StderrLog
from ssdmoe_tui.tools.stdio_watch import Watch, pydantic_line, stdio_transport, watched

CLOSE_TIMEOUT = 8.0  # the SDK gives a stdio server 2 s after stdin closes, then kills it
RESULT_CHARS_MAX = 64_000  # what one tool result may put in the context
# What one server may offer the model: every tool offered is in every prompt, so a server
# listing 10,000 tools (600,000 tokens) made every message too long for the context.
TOOLS_MAX = 128
SCHEMA_BYTES_MAX = 128 << 10  # the tools' JSON as the template gets it (~32k tokens)
STOPPED_TEXT = "Error: the call was stopped by the user"
GONE_WAIT = 4.0  # a call whose server died waits this long for how it ended
_OPEN: weakref.WeakSet[ToolServers] = weakref.WeakSet()


class ToolsUnavailable(Exception):
    """The `mcp` package is not installed: one line saying how to get it."""


def require_sdk() -> None:
    try:
        import mcp  # noqa: F401
    except ImportError:
        raise ToolsUnavailable(
            "MCP servers need the mcp package: pip install 'ssdmoe-tui[tools]'"
        ) from None


@dataclass(frozen=True)
class ToolSpec:
    """One tool the model may call: its server and the schema the template shows."""

    server: str
    name: str
    description: str
    input_schema: dict[str, Any]

    def for_template(self) -> dict[str, Any]:
        """The OpenAI-style function entry chat templates take as `tools`."""
        schema = self.input_schema or {"type": "object", "properties": {}}
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": schema},
        }


@dataclass(frozen=True)
class ToolResult:
    text: str  # what goes back to the model
    is_error: bool = False
    note: str = ""  # one line for the user when it failed


@dataclass
class ServerState:
    config: McpServer
    state: str = "stopped"  # stopped, starting, running, failed, disabled
    error: str = ""  # why it failed, or how it stopped on its own ("exited with status 3 ...")
    tools: list[ToolSpec] = field(default_factory=list)
    hidden: int = 0  # tools the server lists that the allow-list leaves out
    cut: int = 0  # allowed tools past TOOLS_MAX or SCHEMA_BYTES_MAX: not offered
    left_out: list[tuple[str, str]] = field(default_factory=list)  # listed, unusable: (name, why)
    _client: Any = None
    _watch: Watch | None = None
    _stop: asyncio.Event | None = None
    _task: asyncio.Future | None = None


def _one_line(e: BaseException) -> str:
    """An exception (or an exception group of the SDK's task groups) as one line."""
    while getattr(e, "exceptions", None):  # an ExceptionGroup (3.11+; anyio's backport)
        e = e.exceptions[0]  # type: ignore[attr-defined]
    text = " ".join(str(e).split()) or type(e).__name__
    if type(e).__name__ == "ValidationError" and hasattr(e, "title"):  # pydantic's, via the SDK
        text = f"it sent an {pydantic_line(e)}"  # not the SDK's page of validation text
    elif isinstance(e, FileNotFoundError) and e.filename:
        text = f"command not found: {e.filename}"
    elif isinstance(e, (TimeoutError, asyncio.TimeoutError)):
        text = "timed out"
    return text if len(text) <= 160 else text[:157] + "..."


def quiet_sdk_logs() -> None:
    """The SDK logs what it drops (a line on a server's stdout that is not JSON-RPC: a
    whole traceback) through `logging`, which nothing here configures, so Python printed
    it on stderr: on the terminal of `ssdmoe generate`. What matters reaches the user as
    a server's state and one line (`Watch`); the SDK's own log is not shown."""
    log = logging.getLogger("mcp")
    if not any(isinstance(h, logging.NullHandler) for h in log.handlers):
        log.addHandler(logging.NullHandler())
    log.propagate = False


def within_bounds(tools: list[ToolSpec]) -> tuple[list[ToolSpec], int]:
    """The tools a server may offer, in its order: at most TOOLS_MAX, whose schemas take
    at most SCHEMA_BYTES_MAX (a tool that would pass it is left out, a smaller one after
    it may still fit); and how many were left out."""
    kept: list[ToolSpec] = []
    used = 0
    for t in tools:
        size = len(json.dumps(t.for_template(), ensure_ascii=False).encode())
        if len(kept) < TOOLS_MAX and used + size <= SCHEMA_BYTES_MAX:
            kept.append(t)
            used += size
    return kept, len(tools) - len(kept)


def cut_line(name: str, offered: int, cut: int) -> str:
    """One line saying that server `name` offers the model only part of its tools."""
    return (
        f"MCP server {name}: {offered} of its {offered + cut:,} tools are offered to the "
        f"model, {cut:,} left out (at most {TOOLS_MAX} tools and {SCHEMA_BYTES_MAX >> 10} "
        "KiB of schemas a server: choose them with enabled_tools in config.toml)"
    )


def left_out_line(name: str, left_out: list[tuple[str, str]]) -> str:
    """One line naming the tools server `name` listed that cannot be used, and why (each
    reason once, the names it applies to before it)."""
    by_why: dict[str, list[str]] = {}
    for tool, why in left_out:
        by_why.setdefault(why, []).append(tool)
    parts = []
    for why, tools in by_why.items():
        more = f" and {len(tools) - 3} more" if len(tools) > 3 else ""
        parts.append(f"{', '.join(tools[:3])}{more}: {why}")
    return f"MCP server {name}: {len(left_out)} of its tools left out: {'; '.join(parts)}"


def result_text(result: Any) -> str:
    """A CallToolResult's content as text for the model: text blocks as they are, other
    blocks (images, resources) named; structured content as JSON when there is no text."""
    parts = []
    for block in getattr(result, "content", None) or []:
        kind = getattr(block, "type", "")
        if kind == "text":
            parts.append(block.text)
        elif kind == "resource":
            res = block.resource
            parts.append(getattr(res, "text", None) or f"[resource {res.uri}]")
        else:
            parts.append(f"[{kind or 'content'} block not shown to the model]")
    if not parts and getattr(result, "structured_content", None) is not None:
        parts.append(json.dumps(result.structured_content, ensure_ascii=False))
    text = "\n".join(parts)
    if len(text) > RESULT_CHARS_MAX:
        text = text[:RESULT_CHARS_MAX] + f"\n[... cut at {RESULT_CHARS_MAX:,} characters]"
    return text


class ToolServers:
    """Every configured server's state, and the calls to their tools."""

    def __init__(
        self,
        config: Mapping[str, McpServer],
        on_change: Callable[[], None] | None = None,
        log_dir: Path | None = None,
    ) -> None:
        self.servers = {
            name: ServerState(c, "stopped" if c.enabled else "disabled")
            for name, c in config.items()
        }
        self.on_change = on_change  # called (any thread) when a server's state changes
        # called (the servers' thread) with one line when a running server stops on its
        # own: the app shows it as a toast
        self.on_stopped: Callable[[str], None] | None = None
        self.log_dir = log_dir  # stdio servers' stderr goes to NAME.log here (else dropped)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._closed = False
        self._calls: set[concurrent.futures.Future] = set()  # tool calls in flight
        self._stops = 0  # cancel_calls so far: a call's ticket from before one is refused

    # ------------------------------------------------------------------ queries

    @property
    def configured(self) -> bool:
        return any(s.config.enabled for s in self.servers.values())

    def tools(self) -> list[ToolSpec]:
        """The running servers' allowed tools; a name two servers share goes to the first."""
        seen: dict[str, ToolSpec] = {}
        for s in self.servers.values():
            if s.state == "running":
                for t in s.tools:
                    seen.setdefault(t.name, t)
        return list(seen.values())

    def pending(self) -> list[str]:
        """Enabled servers not started yet (nor failed, nor stopped on their own: those
        wait for the user to start them again, F10 `s`, so what they said stays shown)."""
        return [n for n, s in self.servers.items() if s.state == "stopped" and not s.error]

    def restartable(self) -> list[str]:
        """Servers F10's `s` starts: those pending, failed, or stopped on their own."""
        return [n for n, s in self.servers.items() if s.state in ("stopped", "failed")]

    # ------------------------------------------------------------------ lifecycle

    def _ensure_loop(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._closed:
                raise RuntimeError("the tool servers are closed")
            if self._loop is None:
                quiet_sdk_logs()
                loop = asyncio.new_event_loop()
                thread = threading.Thread(target=loop.run_forever, name="ssdmoe-mcp", daemon=True)
                thread.start()
                self._loop, self._thread = loop, thread
                _OPEN.add(self)
            return self._loop

    def start(self, names: list[str] | None = None) -> list[str]:
        """Start the enabled servers not running yet (`names`: only those) and wait, each
        up to its startup timeout; returns one line per server that failed (one line in
        all when the `mcp` package is missing: each server shows why in F10). Blocking:
        call it off the UI thread."""
        todo = [
            s for n, s in self.servers.items()
            if s.state in ("stopped", "failed") and (names is None or n in names)
        ]  # fmt: skip
        try:
            require_sdk()
        except ToolsUnavailable as e:
            for s in todo:
                s.state, s.error = (
                    "failed",
                    "needs the mcp package: pip install 'ssdmoe-tui[tools]'",
                )
            self._changed()
            return [str(e)] if todo else []
        loop = self._ensure_loop()
        futures = []
        for s in todo:
            s.state, s.error = "starting", ""
            self._changed()
            futures.append((s, asyncio.run_coroutine_threadsafe(self._start_one(s), loop)))
        failed = []
        for s, fut in futures:
            try:
                fut.result(timeout=s.config.startup_timeout + 2.0)
            except Exception as e:  # noqa: BLE001 - one server's failure is one line
                if s.state != "failed":
                    s.state, s.error = "failed", _one_line(e)
            if s.state == "failed":
                failed.append(f"MCP server {s.config.name}: {s.error}")
            else:  # running, but offering only part of its tools: said too
                if s.left_out:
                    failed.append(left_out_line(s.config.name, s.left_out))
                if s.cut:
                    failed.append(cut_line(s.config.name, len(s.tools), s.cut))
            self._changed()
        return failed

    async def _start_one(self, s: ServerState) -> None:
        """Start the server's task and wait until it is running (or failed)."""
        loop = asyncio.get_running_loop()
        ready: asyncio.Future = loop.create_future()
        s._stop = asyncio.Event()
        s._watch = Watch()
        s._task = asyncio.ensure_future(self._hold(s, ready))
        try:
            await asyncio.wait_for(asyncio.shield(ready), s.config.startup_timeout)
        except (TimeoutError, asyncio.TimeoutError):
            s.state, s.error = "failed", f"did not start in {s.config.startup_timeout:g} s"
            if said := s._watch.bad_output:  # it did answer: not in MCP
                s.error += (
                    f": it wrote {said} on its stdout, which is not MCP (a server speaks "
                    "JSON-RPC there; its own messages go to stderr)"
                )
            s._stop.set()
            s._task.cancel()

    async def _hold(self, s: ServerState, ready: asyncio.Future) -> None:
        """The server's task: open the client, list its tools, hold it until stopped."""
        from mcp import Client, StdioServerParameters

        c = s.config
        if not c.url and c.cwd and not os.path.isdir(c.cwd):  # not "command not found"
            s.state, s.error = "failed", f"cwd {printable(c.cwd)}: no such folder"
            ready.set_result(None)
            self._changed()
            return
        errlog = None
        log_start = self._log_size(c)
        watch = s._watch = s._watch or Watch()
        try:
            if c.url:
                headers = c.headers()  # ValueError names a variable that is not set
                target: Any = watched(_http_transport(c.url, headers), watch)
            else:
                env = c.environment()
                target = StdioServerParameters(
                    command=c.command, args=list(c.args), env=env or None, cwd=c.cwd or None
                )
            errlog = self._errlog(c)
            kwargs: dict[str, Any] = {"read_timeout_seconds": c.startup_timeout}
            if errlog is not None and not c.url:
                target = stdio_transport(target, errlog, watch)
            async with Client(target, **kwargs) as client:
                listed = await client.list_tools()
                tools = [
                    ToolSpec(c.name, t.name, t.description or "", dict(t.input_schema or {}))
                    for t in listed.tools
                ]
                s.left_out = list(watch.left_out)  # unusable, not in `listed`
                allowed = [t for t in tools if c.allows(t.name)]
                s.hidden = len(tools) - len(allowed)
                s.tools, s.cut = within_bounds(allowed)
                s._client = client
                s.state = "running"
                self._changed()
                if not ready.done():
                    ready.set_result(None)
                assert s._stop is not None
                await _first_of(s._stop.wait(), watch.gone.wait())
                if not s._stop.is_set():  # its output ended: the server is gone
                    s._client = None  # no call goes to it from here
            # leaving the client reaped the process (the SDK's shutdown)
        except asyncio.CancelledError:
            raise
        except BaseException as e:  # noqa: BLE001 - the SDK's task groups raise groups
            s.state, s.error = "failed", _one_line(e)
            if watch.gone.is_set():  # a stdio server whose output ended: how it ended
                closed = s.error == "Connection closed"  # the SDK's words for just that
                s.error = watch.exit_words() if closed else f"{s.error}; {watch.exit_words()}"
            if log_start is not None:  # a stdio server: what it said, and where
                if errlog is not None:  # its copy into the log ends with the server
                    await asyncio.to_thread(errlog.close, 2.0)
                s.error = f"{s.error} ({self._stderr_note(c, log_start)})"
            if not ready.done():
                ready.set_result(None)
        else:
            if s.state == "running" and s._stop is not None and not s._stop.is_set():
                # it died (mid-call or later): stopped, saying how, what it said last
                # and where its log is, until the user starts it again (F10, s)
                s.error = watch.exit_words()
                if log_start is not None:
                    if errlog is not None:
                        await asyncio.to_thread(errlog.close, 2.0)
                    s.error = f"{s.error} ({self._stderr_note(c, log_start)})"
                s.state = "stopped"
                self._said(f"MCP server {c.name} stopped: {s.error}")
            elif s.state == "running":
                s.state = "stopped"
        finally:
            s._client = None
            if errlog is not None:
                errlog.close()
            self._changed()

    def _log_path(self, c: McpServer) -> Path | None:
        return None if c.url or self.log_dir is None else self.log_dir / f"mcp-{c.name}.log"

    def _log_size(self, c: McpServer) -> int | None:
        """Where this run's stderr starts in the server's log (None: no log kept)."""
        path = self._log_path(c)
        if path is None:
            return None
        try:
            return path.stat().st_size
        except OSError:
            return 0

    def _stderr_note(self, c: McpServer, start: int) -> str:
        """A stopped stdio server's last line on stderr in this run, and its log's path:
        a server that exits (its status: `stdio_watch.Watch`) usually says why there."""
        path = self._log_path(c)
        assert path is not None
        try:
            with open(path, "rb") as f:
                size = f.seek(0, 2)
                start = start if start <= size else 0  # rotated since (stderr_log.py)
                f.seek(max(start, size - 4096))
                tail = f.read(4096).decode("utf-8", "replace")
        except OSError:
            return f"log: {path}"
        lines = [line.strip() for line in tail.splitlines() if line.strip()]
        said = f"its stderr: {printable(lines[-1], 120)}" if lines else "nothing on its stderr"
        return f"{said}; log: {path}"

    def _errlog(self, c: McpServer) -> StderrLog | None:
        """A stdio server's stderr: `mcp-NAME.log` in `log_dir`, capped and rotated
        (tools/stderr_log.py), or dropped without a `log_dir`."""
        if c.url:
            return None
        return StderrLog(None if self.log_dir is None else self.log_dir / f"mcp-{c.name}.log")

    def ticket(self) -> int:
        """Taken where the user decides a call runs (the UI thread, before it hands the
        call to a worker thread), passed to `call`: a call whose ticket predates an Esc
        (`cancel_calls`) is not sent, though its thread only reaches `call` after it."""
        return self._stops

    def call(self, name: str, arguments: dict[str, Any], ticket: int | None = None) -> ToolResult:
        """Call a tool with its server's timeout. Never raises: an unknown tool, a server
        that is gone, a timeout or an error the server reports is an error result for the
        model and one line for the user; a call stopped (see `ticket`) is one too."""
        server = next(
            (s for s in self.servers.values() if s.state == "running" and any(t.name == name for t in s.tools)),
            None,
        )  # fmt: skip
        if server is None or self._loop is None:
            known = ", ".join(t.name for t in self.tools()) or "none"
            msg = f"unknown tool {name!r} (available: {known})"
            return ToolResult(f"Error: {msg}", True, msg)
        timeout = server.config.timeout
        note = f"{name} ({server.config.name}): stopped"
        stopped = ToolResult(STOPPED_TEXT, True, note)
        with self._lock:  # registered, or refused, wholly before or after a cancel_calls
            if ticket is not None and ticket != self._stops:
                return stopped
            coro = self._call(server, name, arguments)
            fut = asyncio.run_coroutine_threadsafe(coro, self._loop)
            self._calls.add(fut)
        try:
            result = fut.result(timeout=timeout + 2.0 + GONE_WAIT)
        except concurrent.futures.CancelledError:  # cancel_calls / close
            return stopped
        except Exception as e:  # noqa: BLE001 - any failure is the model's error result
            fut.cancel()
            why = _one_line(e)
            if isinstance(e, (TimeoutError, asyncio.TimeoutError)):
                why = f"timed out after {timeout:g} s"
            msg = f"{name} ({server.config.name}): {why}"
            return ToolResult(f"Error: {why}", True, msg)
        finally:
            self._calls.discard(fut)
        text = result_text(result)
        if getattr(result, "is_error", False):
            first = (text.strip().splitlines() or ["error"])[0]
            return ToolResult(
                text or "Error", True, f"{name} ({server.config.name}): {first[:120]}"
            )
        return ToolResult(text)

    async def _call(self, s: ServerState, name: str, arguments: dict[str, Any]) -> Any:
        client = s._client
        if client is None:
            raise RuntimeError("the server has stopped")
        try:
            return await asyncio.wait_for(
                client.call_tool(name, arguments, read_timeout_seconds=s.config.timeout),
                s.config.timeout,
            )
        except Exception:
            watch, task = s._watch, s._task
            if watch is None or not watch.gone.is_set() or task is None:
                raise
            # the server died during the call ("Connection closed"): say how it ended
            await asyncio.wait({task}, timeout=GONE_WAIT)
            raise RuntimeError(f"its server stopped ({watch.exit_words()})") from None

    def cancel_calls(self) -> None:
        """Stop the tool calls in flight (Esc): their callers get an error result now, and
        a call whose ticket was taken before this is not sent."""
        with self._lock:
            self._stops += 1
            calls = list(self._calls)
        for fut in calls:
            fut.cancel()

    def close(self, timeout: float = CLOSE_TIMEOUT) -> None:
        """Stop every server and the loop (idempotent; waits up to `timeout`)."""
        self.cancel_calls()
        with self._lock:
            if self._closed:
                return
            self._closed = True
            loop, thread = self._loop, self._thread
        if loop is None:
            return
        try:
            asyncio.run_coroutine_threadsafe(self._stop_all(), loop).result(timeout)
        except Exception:  # noqa: BLE001, S110 - closing: nothing left to tell
            pass
        loop.call_soon_threadsafe(loop.stop)
        if thread is not None:
            thread.join(timeout=2.0)
        if thread is None or not thread.is_alive():
            loop.close()  # its selector and wake-up pipe (a running loop cannot be closed)
        for s in self.servers.values():
            if s.state in ("running", "starting"):
                s.state = "stopped"

    async def _stop_all(self) -> None:
        tasks = []
        for s in self.servers.values():
            if s._stop is not None:
                s._stop.set()
            if s._task is not None:
                tasks.append(s._task)
        if tasks:
            await asyncio.wait(tasks, timeout=CLOSE_TIMEOUT - 1.0)

    def _said(self, line: str) -> None:
        if self.on_stopped is not None:
            try:
                self.on_stopped(line)
            except Exception:  # noqa: BLE001, S110 - a UI gone away must not stop a server
                pass

    def _changed(self) -> None:
        if self.on_change is not None:
            try:
                self.on_change()
            except Exception:  # noqa: BLE001, S110 - a UI gone away must not stop a server
                pass


def _http_transport(url: str, headers: dict[str, str]) -> Any:
    """A streamable HTTP transport that sends `headers` (a bearer token, the config's
    http_headers) with every request: the SDK's client over an HTTP client made with
    them, as its docs say to configure headers (the SDK's own timeouts: 30 s, a stream's
    read 300 s); without headers, the SDK's own."""
    from contextlib import asynccontextmanager

    import httpx2  # the mcp SDK's HTTP client
    from mcp.client.streamable_http import streamable_http_client

    if not headers:
        return streamable_http_client(url)

    @asynccontextmanager
    async def transport():  # noqa: ANN202 - the SDK's Transport shape
        timeout = httpx2.Timeout(30.0, read=300.0)
        async with httpx2.AsyncClient(headers=headers, timeout=timeout) as http:
            async with streamable_http_client(url, http_client=http) as streams:
                yield streams

    return transport()


async def _first_of(*waits: Any) -> None:
    """Wait until the first of `waits` (coroutines) is done; cancel the others."""
    tasks = [asyncio.ensure_future(w) for w in waits]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for t in tasks:
            t.cancel()


@atexit.register
def _close_all() -> None:
    for servers in list(_OPEN):
        servers.close(timeout=4.0)

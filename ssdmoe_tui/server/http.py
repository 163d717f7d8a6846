"""HTTP plumbing the serving modules share: the request body read once (size cap, JSON,
Unicode), a disconnect watched while work runs, and an SSE response that notices a
client going away also while it sends nothing (a long prefill)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from starlette.requests import ClientDisconnect, Request
from starlette.responses import StreamingResponse

from ssdmoe_tui.server.errors import ApiError, bad_request
from ssdmoe_tui.server.schema import check_unicode


class Disconnected(Exception):
    """The client went away before its answer was ready (answered with a 499)."""


class SSEResponse(StreamingResponse):
    """A streaming response that always watches for the client going away (also while
    nothing is sent, e.g. during a long prefill), cancelling the body iterator then;
    `on_close` runs however the response ends."""

    def __init__(self, *args: Any, on_close: Callable[[], None] | None = None, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.on_close = on_close

    async def __call__(self, scope, receive, send) -> None:  # noqa: ANN001
        import anyio

        try:
            async with anyio.create_task_group() as tg:

                async def stream() -> None:
                    try:
                        await self.stream_response(send)
                    except OSError:
                        pass
                    tg.cancel_scope.cancel()

                tg.start_soon(stream)
                await self.listen_for_disconnect(receive)
                tg.cancel_scope.cancel()
        finally:
            if self.on_close is not None:
                self.on_close()


async def keepalive(
    stream: AsyncIterator[str], progress: Callable[[], str], every: float
) -> AsyncIterator[str]:
    """`stream`'s events, with an SSE comment (`: <progress>`) whenever it has been
    silent for `every` seconds: proxies (nginx's 60 s) and Node's fetch (undici's 300 s
    body timeout) drop a silent stream, and a queued request or a long prefill is one.
    Clients' SSE parsers skip comment lines."""
    it = stream.__aiter__()
    nxt: asyncio.Future | None = None
    try:
        while True:
            if nxt is None:
                nxt = asyncio.ensure_future(it.__anext__())
            done, _ = await asyncio.wait({nxt}, timeout=every)
            if not done:
                yield f": {progress()}\n\n"
                continue
            fut, nxt = nxt, None
            try:
                item = fut.result()
            except StopAsyncIteration:
                return
            yield item
    finally:
        if nxt is not None:
            nxt.cancel()  # the stream's own cleanup (stop the generation) runs in that task
        else:
            asyncio.ensure_future(it.aclose())  # type: ignore[attr-defined]


def sse(
    stream: AsyncIterator[str],
    headers: dict[str, str] | None = None,
    *,
    progress: Callable[[], str] | None = None,
    every: float = 1.0,
    on_close: Callable[[], None] | None = None,
) -> SSEResponse:
    if progress is not None:
        stream = keepalive(stream, progress, every)
    return SSEResponse(
        stream,
        media_type="text/event-stream",
        headers={"cache-control": "no-cache", **(headers or {})},
        on_close=on_close,
    )


async def until_disconnect(request: Request, work: Awaitable[Any]) -> Any:
    """Run `work`; if the client disconnects first, cancel it and raise Disconnected."""
    task = asyncio.ensure_future(work)

    async def watch() -> None:
        while True:
            msg = await request.receive()
            if msg["type"] == "http.disconnect":
                return

    watcher = asyncio.ensure_future(watch())
    try:
        done, _ = await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        task.cancel()
        watcher.cancel()
        raise
    if task in done:
        watcher.cancel()
        return task.result()
    task.cancel()
    try:
        await task
    except (asyncio.CancelledError, Exception):  # noqa: BLE001
        pass
    raise Disconnected()


async def read_json(request: Request, cap: int) -> Any:
    """The body as JSON: over `cap` bytes is a 413, malformed JSON or text that is not
    Unicode a 400."""
    length = request.headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > cap:
        raise ApiError(413, f"the request body is over the {cap}-byte limit", code="body_too_large")
    chunks, size = [], 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > cap:
                raise ApiError(
                    413, f"the request body is over the {cap}-byte limit", code="body_too_large"
                )
            chunks.append(chunk)
    except ClientDisconnect:
        raise Disconnected() from None
    try:
        body = json.loads(b"".join(chunks))
    except (ValueError, RecursionError) as e:  # not JSON, not UTF-8, nested too deep
        raise bad_request(
            f"the request body is not valid JSON ({e})", code="invalid_json"
        ) from None
    check_unicode(body)
    return body

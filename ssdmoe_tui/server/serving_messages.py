"""POST /v1/messages and /v1/messages/count_tokens: Anthropic's Messages API (what
Anthropic-SDK tools speak), on the chat path.

The reply is a `message` with `text` and `tool_use` blocks, `stop_reason` (`end_turn`,
`max_tokens`, `stop_sequence`, `tool_use`) and `usage` as Anthropic counts it
(`input_tokens` the uncached part, `cache_read_input_tokens` the part the KV cache
served); or Anthropic's SSE events (`message_start`, `content_block_start` / `_delta` /
`_stop`, `message_delta` with the final usage, `message_stop`). Errors use Anthropic's
envelope (`routes.anthropic_error`).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from ssdmoe_tui.engine.run import protocol as P
from ssdmoe_tui.server.engine_client import Job
from ssdmoe_tui.server.errors import ApiError
from ssdmoe_tui.server.output import Call, Content, OutputFilter, Reasoning
from ssdmoe_tui.server.prompts import Prompt
from ssdmoe_tui.server.schema import ToolCall
from ssdmoe_tui.server.schema_messages import MessagesRequest, parse_messages
from ssdmoe_tui.server.serving_chat import record_reply
from ssdmoe_tui.server.serving_engine import Serving


def error_type(status: int) -> str:
    """Anthropic's error type for a status."""
    return {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
            404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error",
            529: "overloaded_error"}.get(status, "api_error")  # fmt: skip


def error_body(e: ApiError) -> dict:
    return {"type": "error", "error": {"type": error_type(e.status), "message": e.message}}


def usage(done: P.GenerationDone) -> dict:
    cached = Serving.cached_tokens(done)
    return {
        "input_tokens": len(done.prompt_token_ids) - cached,
        "cache_read_input_tokens": cached,
        "cache_creation_input_tokens": 0,
        "output_tokens": len(done.token_ids),
    }


def stop_reason(done: P.GenerationDone, filt: OutputFilter) -> str:
    if filt.calls:
        return "tool_use"
    if filt.stopped:
        return "stop_sequence"
    return "max_tokens" if done.finish_reason == "length" else "end_turn"


def tool_use(call: ToolCall) -> dict:
    try:
        args = json.loads(call.arguments) if call.arguments.strip() else {}
    except (ValueError, RecursionError):
        args = {}
    return {"type": "tool_use", "id": call.id, "name": call.name, "input": args}


def thinking_block(text: str) -> dict:
    # no signature: nothing here is encrypted, and a client sends the block back as is
    return {"type": "thinking", "thinking": text, "signature": ""}


def _event(kind: str, **payload: Any) -> str:
    return f"event: {kind}\ndata: {json.dumps({'type': kind, **payload}, ensure_ascii=False)}\n\n"


class ServingMessages(Serving):
    async def count_tokens(self, request: Request) -> Response:
        req = parse_messages(await self.body(request), self.settings.model_id, count_only=True)
        prompt = await self._prompt(req)
        return JSONResponse({"input_tokens": len(prompt.tokens)})

    async def _prompt(self, req: MessagesRequest) -> Prompt:
        import asyncio

        return await asyncio.to_thread(self.state.builder.chat, req.chat)

    async def create(self, request: Request) -> Response:
        p = await self.prepare(
            request, parse_messages, lambda r: self.state.builder.chat(r.chat), "msg"
        )
        req, prompt = p.req, p.prompt
        filt = self.output_filter(prompt, req.sampling.stop, req.chat.tools)
        if req.chat.stream:
            return self.sse(p, self._events(req, prompt, lambda: self.run(p), filt, p.rid))
        job = await self.start(request, p)
        done = await self.drain(request, job, filt)
        record_reply(self.state, req.chat, prompt, done, filt)
        ext = self.ext(done)
        text = "".join(filt.content)
        thinking = [thinking_block("".join(filt.reasoning))] if filt.reasoning else []
        content = thinking + (
            [{"type": "text", "text": text}] if text.strip() or not filt.calls else []
        )
        content += [tool_use(c) for c in filt.calls]
        body = self._message(job.request_id, req, content, done, filt, ext)
        return JSONResponse(body, headers=self.headers(ext))

    @staticmethod
    def _message(rid: str, req: MessagesRequest, content: list, done, filt, ext=None) -> dict:  # noqa: ANN001
        out = {
            "id": "msg_" + rid.split("-", 1)[-1],
            "type": "message",
            "role": "assistant",
            "model": req.model,
            "content": content,
            "stop_reason": stop_reason(done, filt) if done is not None else None,
            "stop_sequence": filt.stop_sequence if done is not None else None,
            "usage": usage(done) if done is not None else {"input_tokens": 0, "output_tokens": 0},
        }
        if ext is not None:
            out["ssdmoe"] = ext
        return out

    async def _events(
        self,
        req: MessagesRequest,
        prompt: Prompt,
        acquire: Callable[[], Awaitable[Job]],
        filt: OutputFilter,
        rid: str,
    ) -> AsyncIterator[str]:
        index = -1
        open_kind: str | None = None  # the block being streamed: "text" or "thinking"
        held = ""  # whitespace-only text not sent yet
        text_sent = False
        job: Job | None = None

        def open_block(kind: str) -> list[str]:
            nonlocal index, open_kind, text_sent
            if open_kind == kind:
                return []
            out = close_block()
            index += 1
            open_kind = kind
            block = {"type": "text", "text": ""} if kind == "text" else thinking_block("")
            out.append(_event("content_block_start", index=index, content_block=block))
            if kind == "text":
                text_sent = True
            return out

        def close_block() -> list[str]:
            nonlocal open_kind
            if open_kind is None:
                return []
            open_kind = None
            return [_event("content_block_stop", index=index)]

        try:
            start = self._message(rid, req, [], None, filt)
            start["usage"] = {"input_tokens": len(prompt.tokens), "output_tokens": 0}
            yield _event("message_start", message=start)
            try:
                job = await acquire()
                async for pieces in self.pieces(job, filt):
                    for p in pieces:
                        if isinstance(p, Content):
                            text = p.text
                            if open_kind != "text":
                                held += text  # whitespace between calls opens no block
                                if not held.strip():
                                    continue
                                text, held = held, ""
                            for e in open_block("text"):
                                yield e
                            yield _event("content_block_delta", index=index,
                                         delta={"type": "text_delta", "text": text})  # fmt: skip
                        elif isinstance(p, Reasoning):
                            for e in open_block("thinking"):
                                yield e
                            yield _event("content_block_delta", index=index,
                                         delta={"type": "thinking_delta", "thinking": p.text})  # fmt: skip
                        elif isinstance(p, Call):
                            for e in close_block():
                                yield e
                            index += 1
                            block = {**tool_use(p.call), "input": {}}
                            yield _event("content_block_start", index=index, content_block=block)
                            args = json.dumps(tool_use(p.call)["input"], ensure_ascii=False)
                            yield _event("content_block_delta", index=index,
                                         delta={"type": "input_json_delta", "partial_json": args})  # fmt: skip
                            yield _event("content_block_stop", index=index)
            except ApiError as e:
                yield _event("error", error=error_body(e)["error"])
                return
            if not filt.calls and not text_sent:  # no answer text yet: one text block
                for e in open_block("text"):
                    yield e
                if held:
                    yield _event("content_block_delta", index=index,
                                 delta={"type": "text_delta", "text": held})  # fmt: skip
            for e in close_block():
                yield e
            done = self.done(job)
            record_reply(self.state, req.chat, prompt, done, filt)
            ext = self.ext(done)
            delta = {"stop_reason": stop_reason(done, filt), "stop_sequence": filt.stop_sequence}
            yield _event("message_delta", delta=delta, usage=usage(done), ssdmoe=ext)
            yield _event("message_stop")
        finally:
            if job is not None:
                job.cancel()

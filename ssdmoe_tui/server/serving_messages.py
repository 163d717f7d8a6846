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
from ssdmoe_tui.prompting.output import Call, Content, OutputFilter, Reasoning
from ssdmoe_tui.server.engine_client import Job
from ssdmoe_tui.server.errors import ApiError
from ssdmoe_tui.server.prompts import Prompt
from ssdmoe_tui.server.schema import ToolCall
from ssdmoe_tui.server.schema_messages import MESSAGES_FIELDS, MessagesRequest, parse_messages
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


class _BlockWriter:
    """One reply's content-block events, indexed in order: the text or thinking block
    being streamed is opened on its first piece and closed before another kind or a
    call; each call is a whole tool_use block."""

    def __init__(self) -> None:
        self.index = -1
        self.open_kind: str | None = None  # the block being streamed: "text" or "thinking"
        self.held = ""  # whitespace-only text not sent yet
        self.text_sent = False

    def piece(self, p: object) -> list[str]:
        """The events one piece of output makes (text, thinking or a call)."""
        if isinstance(p, Content):
            text = p.text
            if self.open_kind != "text":
                self.held += text  # whitespace between calls opens no block
                if not self.held.strip():
                    return []
                text, self.held = self.held, ""
            return [*self.open_block("text"), self._delta("text_delta", "text", text)]
        if isinstance(p, Reasoning):
            return [*self.open_block("thinking"), self._delta("thinking_delta", "thinking", p.text)]
        if isinstance(p, Call):
            out = self.close_block()
            self.index += 1
            block = {**tool_use(p.call), "input": {}}
            args = json.dumps(tool_use(p.call)["input"], ensure_ascii=False)
            return [
                *out,
                _event("content_block_start", index=self.index, content_block=block),
                self._delta("input_json_delta", "partial_json", args),
                _event("content_block_stop", index=self.index),
            ]
        return []

    def finish(self, called: bool) -> list[str]:
        """The last block closed; a reply with no answer text and no call gets one text
        block, with the whitespace it held."""
        out = []
        if not called and not self.text_sent:
            out += self.open_block("text")
            if self.held:
                out.append(self._delta("text_delta", "text", self.held))
        return out + self.close_block()

    def _delta(self, kind: str, field: str, value: str) -> str:
        return _event("content_block_delta", index=self.index, delta={"type": kind, field: value})

    def open_block(self, kind: str) -> list[str]:
        if self.open_kind == kind:
            return []
        out = self.close_block()
        self.index += 1
        self.open_kind = kind
        block = {"type": "text", "text": ""} if kind == "text" else thinking_block("")
        out.append(_event("content_block_start", index=self.index, content_block=block))
        if kind == "text":
            self.text_sent = True
        return out

    def close_block(self) -> list[str]:
        if self.open_kind is None:
            return []
        self.open_kind = None
        return [_event("content_block_stop", index=self.index)]


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
            request, parse_messages, lambda r: self.state.builder.chat(r.chat), "msg",
            MESSAGES_FIELDS,
        )  # fmt: skip
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
        out = _BlockWriter()
        job: Job | None = None
        try:
            start = self._message(rid, req, [], None, filt)
            start["usage"] = {"input_tokens": len(prompt.tokens), "output_tokens": 0}
            yield _event("message_start", message=start)
            try:
                job = await acquire()
                async for pieces in self.pieces(job, filt):
                    for p in pieces:
                        for e in out.piece(p):
                            yield e
            except ApiError as e:
                yield _event("error", error=error_body(e)["error"])
                return
            for e in out.finish(bool(filt.calls)):
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

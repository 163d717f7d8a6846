"""POST /v1/responses: OpenAI's Responses API (what Codex CLI speaks), on the chat path.

The request becomes a chat request (`schema_responses`); the reply becomes output items
(a `message` with `output_text`, one `function_call` per tool call) in a `response`
object, or the Responses SSE events (`response.created`, `response.output_item.added`,
`response.output_text.delta`, ..., `response.completed` / `response.incomplete`).
`previous_response_id` continues a stored response's conversation (in memory, the last
`MAX_STORED`): its messages plus the new input are a chat whose exact tokens the prompt
history recorded, so the KV cache serves all but the new items.
"""

from __future__ import annotations

import json
import secrets
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from ssdmoe_tui.engine.run import protocol as P
from ssdmoe_tui.server.engine_client import Job
from ssdmoe_tui.server.errors import ApiError, bad_request
from ssdmoe_tui.server.output import Call, Content, OutputFilter
from ssdmoe_tui.server.prompts import Prompt
from ssdmoe_tui.server.schema import ChatMessage, ChatRequest, ToolCall
from ssdmoe_tui.server.schema_responses import ResponsesRequest, parse_responses
from ssdmoe_tui.server.serving_chat import record_reply
from ssdmoe_tui.server.serving_engine import STATS_HEADER, ServerState, Serving

MAX_STORED = 256


def _id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(12)}"


class ResponseStore:
    """Stored responses' conversations (messages without instructions), newest last."""

    def __init__(self, limit: int = MAX_STORED) -> None:
        self.limit = limit
        self._items: OrderedDict[str, tuple[ChatMessage, ...]] = OrderedDict()

    def get(self, rid: str) -> tuple[ChatMessage, ...] | None:
        msgs = self._items.get(rid)
        if msgs is not None:
            self._items.move_to_end(rid)
        return msgs

    def put(self, rid: str, messages: tuple[ChatMessage, ...]) -> None:
        self._items[rid] = messages
        while len(self._items) > self.limit:
            self._items.popitem(last=False)


def usage(done: P.GenerationDone) -> dict:
    n_in, n_out = len(done.prompt_token_ids), len(done.token_ids)
    return {
        "input_tokens": n_in,
        "input_tokens_details": {
            "cached_tokens": Serving.cached_tokens(done),
            "cache_write_tokens": 0,
        },  # fmt: skip
        "output_tokens": n_out,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": n_in + n_out,
    }


def message_item(item_id: str, text: str, status: str) -> dict:
    return {"type": "message", "id": item_id, "status": status, "role": "assistant",
            "content": [{"type": "output_text", "text": text, "annotations": []}]}  # fmt: skip


def call_item(item_id: str, call: ToolCall, status: str = "completed") -> dict:
    return {"type": "function_call", "id": item_id, "call_id": call.id, "name": call.name,
            "arguments": call.arguments, "status": status}  # fmt: skip


class _Run:
    """One response being made: its request, the chat it runs as, its output items."""

    def __init__(self, req: ResponsesRequest, chat: ChatRequest, history: tuple) -> None:
        self.req = req
        self.chat = chat
        self.history = history  # the conversation before this request's input
        self.id = _id("resp")
        self.created = int(time.time())
        self.output: list[dict] = []

    def response(self, status: str, done: P.GenerationDone | None = None, **extra: Any) -> dict:
        req = self.req
        out = {
            "id": self.id, "object": "response", "created_at": self.created, "status": status,
            "model": req.model, "output": self.output, "instructions": req.instructions,
            "previous_response_id": req.previous_response_id,
            "max_output_tokens": req.sampling.max_tokens,
            "temperature": req.sampling.temperature, "top_p": req.sampling.top_p,
            "tools": req.tools_echo, "tool_choice": req.tool_choice,
            "parallel_tool_calls": True, "store": req.store, "metadata": req.metadata or {},
            "error": None, "incomplete_details": None, "usage": None,
            "text": {"format": {"type": "text"}}, "truncation": "disabled",
        }  # fmt: skip
        if done is not None:
            out["usage"] = usage(done)
            if status == "incomplete":
                out["incomplete_details"] = {"reason": "max_output_tokens"}
        out.update(extra)
        return out


class ServingResponses(Serving):
    def __init__(self, state: ServerState) -> None:
        super().__init__(state)
        self.store = ResponseStore()

    async def create(self, request: Request) -> Response:
        run: list[_Run] = []

        def parse(body: Any, model_id: str) -> ChatRequest:
            req = parse_responses(body, model_id)
            history: tuple[ChatMessage, ...] = ()
            if req.previous_response_id is not None:
                got = self.store.get(req.previous_response_id)
                if got is None:
                    raise bad_request(
                        f"previous response '{req.previous_response_id}' not found (responses "
                        f"are kept in memory, the last {self.store.limit}; not after a restart)",
                        "previous_response_id",
                        "previous_response_not_found",
                    )
                history = got
            chat = req.chat(history)
            run.append(_Run(req, chat, history))
            return chat

        p = await self.prepare(request, parse, self.state.builder.chat, "resp")
        chat, prompt, r = p.req, p.prompt, run[0]
        filt = OutputFilter((), self.state.tool_format, chat.tools)
        if chat.stream:
            return self.sse(p, self._events(r, prompt, lambda: self.run(p), filt))
        job = await self.start(request, p)
        done = await self.drain(request, job, filt)
        text = "".join(filt.content)
        if text or not filt.calls:
            r.output.append(message_item(_id("msg"), text, self._status(done, filt)))
        r.output.extend(call_item(_id("fc"), c) for c in filt.calls)
        ext = self._finish(r, prompt, done, filt)
        body = r.response(self._status(done, filt), done, ssdmoe=ext)
        return JSONResponse(body, headers={STATS_HEADER: self.stats_header(ext)})

    @staticmethod
    def _status(done: P.GenerationDone, filt: OutputFilter) -> str:
        cut = done.finish_reason == "length" and not filt.calls
        return "incomplete" if cut else "completed"

    def _finish(self, r: _Run, prompt: Prompt, done: P.GenerationDone, filt: OutputFilter) -> dict:
        """Record the exact tokens, store the conversation, the `ssdmoe` field."""
        record_reply(self.state, r.chat, prompt, done, filt)
        if r.req.store:
            reply = ChatMessage("assistant", "".join(filt.content), tuple(filt.calls))
            self.store.put(r.id, r.history + r.req.input + (reply,))
        return self.ext(done)

    async def _events(
        self, r: _Run, prompt: Prompt, acquire: Callable[[], Awaitable[Job]], filt: OutputFilter
    ) -> AsyncIterator[str]:
        seq = [0]

        def event(kind: str, **payload: Any) -> str:
            body = {"type": kind, "sequence_number": seq[0], **payload}
            seq[0] += 1
            return f"event: {kind}\ndata: {json.dumps(body, ensure_ascii=False)}\n\n"

        msg: dict | None = None  # the message item being streamed

        def close_message() -> list[str]:
            nonlocal msg
            if msg is None:
                return []
            i, part = len(r.output) - 1, msg["content"][0]
            msg["status"] = "completed"
            ref = {"item_id": msg["id"], "output_index": i}
            out = [
                event(
                    "response.output_text.done",
                    **ref,
                    content_index=0,
                    text=part["text"],
                    logprobs=[],
                ),  # fmt: skip
                event("response.content_part.done", **ref, content_index=0, part=part),
                event("response.output_item.done", output_index=i, item=msg),
            ]
            msg = None
            return out

        job: Job | None = None
        try:
            yield event("response.created", response=r.response("in_progress"))
            try:
                job = await acquire()
                yield event("response.in_progress", response=r.response("in_progress"))
                async for pieces in self.pieces(job, filt):
                    for p in pieces:
                        if isinstance(p, Content):
                            if msg is None:
                                msg = message_item(_id("msg"), "", "in_progress")
                                r.output.append(msg)
                                i = len(r.output) - 1
                                yield event("response.output_item.added", output_index=i,
                                            item={**msg, "content": []})  # fmt: skip
                                yield event("response.content_part.added", item_id=msg["id"],
                                            output_index=i, content_index=0,
                                            part={"type": "output_text", "text": "",
                                                  "annotations": []})  # fmt: skip
                            msg["content"][0]["text"] += p.text
                            yield event("response.output_text.delta", item_id=msg["id"],
                                        output_index=len(r.output) - 1, content_index=0,
                                        delta=p.text, logprobs=[])  # fmt: skip
                        elif isinstance(p, Call):
                            for e in close_message():
                                yield e
                            item = call_item(_id("fc"), p.call, "in_progress")
                            r.output.append(item)
                            i = len(r.output) - 1
                            yield event("response.output_item.added", output_index=i,
                                        item={**item, "arguments": ""})  # fmt: skip
                            ref = {"item_id": item["id"], "output_index": i}
                            yield event("response.function_call_arguments.delta", **ref,
                                        delta=item["arguments"])  # fmt: skip
                            yield event("response.function_call_arguments.done", **ref,
                                        arguments=item["arguments"])  # fmt: skip
                            item["status"] = "completed"
                            yield event("response.output_item.done", output_index=i, item=item)
            except ApiError as e:
                err = {"code": e.code or "server_error", "message": e.message}
                yield event("response.failed", response=r.response("failed", error=err))
                return
            done = self.done(job)
            if not r.output:  # an empty reply is still one (empty) message
                msg = message_item(_id("msg"), "", "in_progress")
                r.output.append(msg)
                i = len(r.output) - 1
                yield event("response.output_item.added", output_index=i,
                            item={**msg, "content": []})  # fmt: skip
                yield event("response.content_part.added", item_id=msg["id"], output_index=i,
                            content_index=0, part={"type": "output_text", "text": "",
                                                   "annotations": []})  # fmt: skip
            for e in close_message():
                yield e
            status = self._status(done, filt)
            ext = self._finish(r, prompt, done, filt)
            kind = "response.completed" if status == "completed" else "response.incomplete"
            yield event(kind, response=r.response(status, done, ssdmoe=ext))
        finally:
            if job is not None:
                job.cancel()

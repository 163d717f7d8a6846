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
from ssdmoe_tui.prompting.output import Call, Content, OutputFilter, Reasoning
from ssdmoe_tui.server.engine_client import Job
from ssdmoe_tui.server.errors import ApiError, bad_request
from ssdmoe_tui.server.prompts import Prompt
from ssdmoe_tui.server.schema import ChatMessage, ChatRequest, ToolCall
from ssdmoe_tui.server.schema_responses import RESPONSES_FIELDS, ResponsesRequest, parse_responses
from ssdmoe_tui.server.serving_chat import record_reply
from ssdmoe_tui.server.serving_engine import ServerState, Serving

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


def reasoning_tokens(tokenizer: Any, done: P.GenerationDone, filt: OutputFilter) -> int:
    """Generated tokens up to the think block's end (all of them if it never closed);
    harmony's: the analysis messages' tokens."""
    if not filt.reasoning:
        return 0
    if filt.harmony:
        from ssdmoe_tui.prompting.harmony import reasoning_tokens as harmony_reasoning

        return harmony_reasoning(done.token_ids, tokenizer)
    end, ids = getattr(tokenizer, "think_end_id", None), list(done.token_ids)
    return ids.index(end) + 1 if end in ids else len(ids)


def usage(done: P.GenerationDone, reasoning: int = 0) -> dict:
    n_in, n_out = len(done.prompt_token_ids), len(done.token_ids)
    return {
        "input_tokens": n_in,
        "input_tokens_details": {
            "cached_tokens": Serving.cached_tokens(done),
            "cache_write_tokens": 0,
        },  # fmt: skip
        "output_tokens": n_out,
        "output_tokens_details": {"reasoning_tokens": reasoning},
        "total_tokens": n_in + n_out,
    }


def message_item(item_id: str, text: str, status: str) -> dict:
    return {"type": "message", "id": item_id, "status": status, "role": "assistant",
            "content": [{"type": "output_text", "text": text, "annotations": []}]}  # fmt: skip


def reasoning_item(item_id: str, text: str, status: str) -> dict:
    return {"type": "reasoning", "id": item_id, "status": status, "summary": [],
            "content": [{"type": "reasoning_text", "text": text}]}  # fmt: skip


def call_item(
    item_id: str, call: ToolCall, status: str = "completed", namespaces: dict | None = None
) -> dict:
    item = {"type": "function_call", "id": item_id, "call_id": call.id, "name": call.name,
            "arguments": call.arguments, "status": status}  # fmt: skip
    if namespaces and call.name in namespaces:  # a member of a `namespace` tool
        item["namespace"] = namespaces[call.name]
    return item


class _Run:
    """One response being made: its request, the chat it runs as, its output items."""

    def __init__(self, req: ResponsesRequest, chat: ChatRequest, history: tuple) -> None:
        self.req = req
        self.chat = chat
        self.history = history  # the conversation before this request's input
        self.id = _id("resp")
        self.created = int(time.time())
        self.output: list[dict] = []
        self.reasoning_tokens = 0

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
            out["usage"] = usage(done, self.reasoning_tokens)
            if status == "incomplete":
                out["incomplete_details"] = {"reason": "max_output_tokens"}
        out.update(extra)
        return out


class _EventWriter:
    """One run's Responses SSE events, numbered in order: the text item being streamed (a
    message's output_text or a reasoning item's reasoning_text) is opened on its first
    text and closed before a call or the end; each call is a whole function_call item."""

    def __init__(self, r: _Run) -> None:
        self.r = r
        self.seq = 0
        self.open_item: dict | None = None
        self.held = ""  # whitespace-only answer text not sent yet

    def event(self, kind: str, **payload: Any) -> str:
        body = {"type": kind, "sequence_number": self.seq, **payload}
        self.seq += 1
        return f"event: {kind}\ndata: {json.dumps(body, ensure_ascii=False)}\n\n"

    def piece(self, p: object) -> list[str]:
        """The events one piece of output makes (text, reasoning or a call)."""
        if isinstance(p, Call):
            return self.call(p.call)
        if not isinstance(p, Content | Reasoning):
            return []
        kind, text = ("message" if isinstance(p, Content) else "reasoning"), p.text
        if kind == "message" and (self.open_item or {}).get("type") != kind:
            self.held += text  # whitespace between calls opens no message
            if not self.held.strip():
                return []
            text, self.held = self.held, ""
        return [*self.open_text(kind), self.delta(text)]

    def finish(self, called: bool) -> list[str]:
        """The last text item closed; a reply with no answer text and no call gets one
        (empty) message, with the whitespace it held."""
        out = []
        if not called and not any(o["type"] == "message" for o in self.r.output):
            out += self.open_text("message")
            if self.held:
                out.append(self.delta(self.held))
        return out + self.close_text()

    @staticmethod
    def _part_kind(item: dict) -> str:
        return "output_text" if item["type"] == "message" else "reasoning_text"

    def open_text(self, kind: str) -> list[str]:
        open_item = self.open_item
        out = self.close_text() if open_item is not None and open_item["type"] != kind else []
        if self.open_item is not None:
            return out
        item = message_item(_id("msg"), "", "in_progress") if kind == "message" else (
            reasoning_item(_id("rs"), "", "in_progress"))  # fmt: skip
        self.open_item = item
        self.r.output.append(item)
        i = len(self.r.output) - 1
        part = {**item["content"][0], "text": ""}
        out.append(self.event("response.output_item.added", output_index=i,
                              item={**item, "content": []}))  # fmt: skip
        out.append(self.event("response.content_part.added", item_id=item["id"],
                              output_index=i, content_index=0, part=part))  # fmt: skip
        return out

    def delta(self, text: str) -> str:
        item = self.open_item
        item["content"][0]["text"] += text
        extra = {"logprobs": []} if item["type"] == "message" else {}
        return self.event(f"response.{self._part_kind(item)}.delta", item_id=item["id"],
                          output_index=len(self.r.output) - 1, content_index=0, delta=text,
                          **extra)  # fmt: skip

    def close_text(self) -> list[str]:
        if self.open_item is None:
            return []
        item, self.open_item = self.open_item, None
        i, part = len(self.r.output) - 1, item["content"][0]
        item["status"] = "completed"
        ref = {"item_id": item["id"], "output_index": i}
        extra = {"logprobs": []} if item["type"] == "message" else {}
        return [
            self.event(
                f"response.{self._part_kind(item)}.done",
                **ref,
                content_index=0,
                text=part["text"],
                **extra,
            ),  # fmt: skip
            self.event("response.content_part.done", **ref, content_index=0, part=part),
            self.event("response.output_item.done", output_index=i, item=item),
        ]

    def call(self, call: ToolCall) -> list[str]:
        out = self.close_text()
        item = call_item(_id("fc"), call, "in_progress", self.r.req.namespaces)
        self.r.output.append(item)
        i = len(self.r.output) - 1
        ref = {"item_id": item["id"], "output_index": i}
        out.append(self.event("response.output_item.added", output_index=i,
                              item={**item, "arguments": ""}))  # fmt: skip
        out.append(self.event("response.function_call_arguments.delta", **ref,
                              delta=item["arguments"]))  # fmt: skip
        out.append(self.event("response.function_call_arguments.done", **ref,
                              arguments=item["arguments"]))  # fmt: skip
        item["status"] = "completed"
        out.append(self.event("response.output_item.done", output_index=i, item=item))
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

        p = await self.prepare(request, parse, self.state.builder.chat, "resp", RESPONSES_FIELDS)
        chat, prompt, r = p.req, p.prompt, run[0]
        if r.req.skipped_tools:  # hosted tools: none runs here (docs/server.md, one rule)
            p.warnings.append(
                "hosted tools are not run by this server and were left out: "
                + ", ".join(r.req.skipped_tools)
            )
        filt = self.output_filter(prompt, (), chat.tools)
        if chat.stream:
            return self.sse(p, self._events(r, prompt, lambda: self.run(p), filt))
        job = await self.start(request, p)
        done = await self.drain(request, job, filt)
        text, status = "".join(filt.content), self._status(done, filt)
        if filt.reasoning:
            r.output.append(reasoning_item(_id("rs"), "".join(filt.reasoning), status))
        if text.strip() or not filt.calls:
            r.output.append(message_item(_id("msg"), text, status))
        r.output.extend(call_item(_id("fc"), c, namespaces=r.req.namespaces) for c in filt.calls)
        ext = self._finish(r, prompt, done, filt)
        body = r.response(self._status(done, filt), done, ssdmoe=ext)
        return JSONResponse(body, headers=self.headers(ext))

    @staticmethod
    def _status(done: P.GenerationDone, filt: OutputFilter) -> str:
        cut = done.finish_reason == "length" and not filt.calls
        return "incomplete" if cut else "completed"

    def _finish(self, r: _Run, prompt: Prompt, done: P.GenerationDone, filt: OutputFilter) -> dict:
        """Record the exact tokens, store the conversation, the `ssdmoe` field."""
        record_reply(self.state, r.chat, prompt, done, filt)
        r.reasoning_tokens = reasoning_tokens(self.engine.tokenizer, done, filt)
        if r.req.store:
            reply = ChatMessage("assistant", "".join(filt.content), tuple(filt.calls))
            self.store.put(r.id, r.history + r.req.input + (reply,))
        ext = self.ext(done)
        if r.req.skipped_tools:  # hosted tools the request listed: none ran here
            ext["skipped_tools"] = list(r.req.skipped_tools)
        return ext

    async def _events(
        self, r: _Run, prompt: Prompt, acquire: Callable[[], Awaitable[Job]], filt: OutputFilter
    ) -> AsyncIterator[str]:
        out = _EventWriter(r)
        job: Job | None = None
        try:
            yield out.event("response.created", response=r.response("in_progress"))
            try:
                job = await acquire()
                yield out.event("response.in_progress", response=r.response("in_progress"))
                async for pieces in self.pieces(job, filt):
                    for p in pieces:
                        for e in out.piece(p):
                            yield e
            except ApiError as e:
                err = {"code": e.code or "server_error", "message": e.message}
                yield out.event("response.failed", response=r.response("failed", error=err))
                return
            done = self.done(job)
            for e in out.finish(bool(filt.calls)):
                yield e
            status = self._status(done, filt)
            ext = self._finish(r, prompt, done, filt)
            kind = "response.completed" if status == "completed" else "response.incomplete"
            yield out.event(kind, response=r.response(status, done, ssdmoe=ext))
        finally:
            if job is not None:
                job.cancel()

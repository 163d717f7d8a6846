"""POST /v1/chat/completions: messages (with tools and tool results) in, the reply as
OpenAI's chat.completion JSON or chat.completion.chunk SSE; a whole reply's exact
tokens are recorded for the next turn's prompt."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from ssdmoe_tui.engine.run import protocol as P
from ssdmoe_tui.prompting.output import Call, Content, OutputFilter, Piece, Reasoning
from ssdmoe_tui.server.engine_client import Job
from ssdmoe_tui.server.prompts import Prompt
from ssdmoe_tui.server.schema import CHAT_FIELDS, ChatMessage, ChatRequest, ToolCall, parse_chat
from ssdmoe_tui.server.serving_engine import ServerState
from ssdmoe_tui.server.serving_openai import OpenAIServing


def call_json(call: ToolCall, index: int | None = None) -> dict:
    out = {"id": call.id, "type": "function",
           "function": {"name": call.name, "arguments": call.arguments}}  # fmt: skip
    if index is not None:
        out = {"index": index, **out}
    return out


def record_reply(
    state: ServerState, req: ChatRequest, prompt: Prompt, done: P.GenerationDone, filt: OutputFilter
) -> ChatMessage | None:
    """Remember the exact tokens of a whole reply (not of one cut by a stop string or a
    disconnect: the client's copy of it would not match what the model saw). Returns the
    reply as the client got it (None when cut)."""
    if filt.stopped or done.finish_reason not in ("stop", "length"):
        return None
    reply = ChatMessage("assistant", "".join(filt.content), tuple(filt.calls))
    try:
        state.builder.record(req, prompt, done.token_ids, reply)
    except Exception as e:  # noqa: BLE001 - a lost record only costs cache hits
        from ssdmoe_tui.errors import user_message

        state.engine.on_notice(f"prompt history not recorded: {user_message(e)}")
    return reply


class ServingChat(OpenAIServing):
    async def create(self, request: Request) -> Response:
        p = await self.prepare(
            request, parse_chat, self.state.builder.chat, "chatcmpl", CHAT_FIELDS
        )
        req, prompt = p.req, p.prompt
        if req.stream:
            return self.sse(p, self.chat_stream(req, prompt, lambda: self.run(p), p.rid))
        job = await self.start(request, p)
        filt = self.output_filter(prompt, req.sampling.stop, req.tools)

        def message() -> dict:
            content = "".join(filt.content)
            msg: dict[str, Any] = {
                "role": "assistant",
                "content": content if (content or not filt.calls) else None,
            }
            if filt.reasoning:  # vLLM's and llama.cpp's field; opencode, the AI SDK read it
                msg["reasoning_content"] = "".join(filt.reasoning)
            if filt.calls:
                msg["tool_calls"] = [call_json(c) for c in filt.calls]
            return {"message": msg}

        return await self.reply(
            job, filt, request, model=req.model, obj="chat.completion", body=message,
            on_done=lambda done: record_reply(self.state, req, prompt, done, filt),
        )  # fmt: skip

    def chat_stream(
        self,
        req: ChatRequest,
        prompt: Prompt,
        acquire: Callable[[], Awaitable[Job]],
        rid: str,
    ) -> AsyncIterator[str]:
        filt = self.output_filter(prompt, req.sampling.stop, req.tools)
        n_calls = [0]

        def bodies(pieces: list[Piece]) -> list[dict]:
            out = []
            for p in pieces:
                if isinstance(p, Content):
                    out.append({"delta": {"content": p.text}})
                elif isinstance(p, Reasoning):
                    out.append({"delta": {"reasoning_content": p.text}})
                elif isinstance(p, Call):
                    out.append({"delta": {"tool_calls": [call_json(p.call, n_calls[0])]}})
                    n_calls[0] += 1
            return out

        return self.stream(
            acquire,
            filt,
            req,
            rid=rid,
            obj="chat.completion.chunk",
            bodies=bodies,
            first={"delta": {"role": "assistant", "content": ""}},
            last={"delta": {}},
            on_done=lambda done: record_reply(self.state, req, prompt, done, filt),
        )

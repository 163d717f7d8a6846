"""The OpenAI envelope chat completions and completions share: a JSON reply with
`choices`, `usage` and the `ssdmoe` field, or SSE chunks of the same object ending
with the final chunk, the optional usage chunk and `[DONE]`."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from ssdmoe_tui.engine.run import protocol as P
from ssdmoe_tui.prompting.output import OutputFilter, Piece
from ssdmoe_tui.server.engine_client import Job
from ssdmoe_tui.server.errors import ApiError
from ssdmoe_tui.server.schema import ChatRequest, CompletionRequest
from ssdmoe_tui.server.serving_engine import Serving


def usage(done: P.GenerationDone) -> dict:
    n_prompt = len(done.prompt_token_ids)
    n_out = len(done.token_ids)
    return {
        "prompt_tokens": n_prompt,
        "completion_tokens": n_out,
        "total_tokens": n_prompt + n_out,
        "prompt_tokens_details": {"cached_tokens": Serving.cached_tokens(done)},
    }


def data(payload: dict) -> str:
    return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n"


class OpenAIServing(Serving):
    async def reply(
        self,
        job: Job,
        filt: OutputFilter,
        request: Request,
        *,
        model: str,
        obj: str,
        body: Callable[[], dict],
        on_done: Callable[[P.GenerationDone], None] | None = None,
    ) -> Response:
        """Wait for the whole reply and send it as JSON."""
        done = await self.drain(request, job, filt)
        if on_done is not None:
            on_done(done)
        ext = self.ext(done)
        choice = {"index": 0, **body(), "logprobs": None,
                  "finish_reason": self.finish_reason(done, filt)}  # fmt: skip
        payload = {"id": job.request_id, "object": obj, "created": int(time.time()),
                   "model": model, "choices": [choice], "usage": usage(done),
                   "ssdmoe": ext}  # fmt: skip
        return JSONResponse(payload, headers=self.headers(ext))

    async def stream(
        self,
        acquire: Callable[[], Awaitable[Job]],
        filt: OutputFilter,
        req: ChatRequest | CompletionRequest,
        *,
        rid: str,
        obj: str,
        bodies: Callable[[list[Piece]], list[dict]],
        last: dict,
        first: dict | None = None,
        on_done: Callable[[P.GenerationDone], None] | None = None,
    ) -> AsyncIterator[str]:
        """SSE events: `first` (before the engine is free), one chunk per body of each
        batch of pieces, the final chunk (`last`, finish_reason and the `ssdmoe` field),
        the usage chunk (when `req` asked for it), [DONE]."""
        base = {"id": rid, "object": obj, "created": int(time.time()), "model": req.model}

        def chunk(body: dict, finish: str | None = None, **extra: Any) -> str:
            choice = {"index": 0, **body, "logprobs": None, "finish_reason": finish}
            return data({**base, "choices": [choice], **extra})

        job: Job | None = None
        try:
            if first is not None:
                yield chunk(first)
            try:
                job = await acquire()
                async for pieces in self.pieces(job, filt):
                    for body in bodies(pieces):
                        yield chunk(body)
            except ApiError as e:
                yield data(e.body())
                yield "data: [DONE]\n\n"
                return
            done = self.done(job)
            if on_done is not None:
                on_done(done)
            yield chunk(last, self.finish_reason(done, filt), ssdmoe=self.ext(done))
            if req.include_usage:
                yield data({**base, "choices": [], "usage": usage(done)})
            yield "data: [DONE]\n\n"
        finally:
            if job is not None:
                job.cancel()

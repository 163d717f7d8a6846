"""POST /v1/completions: a raw prompt (text or token ids), JSON or SSE."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable

from starlette.requests import Request
from starlette.responses import Response

from ssdmoe_tui.prompting.output import Content, OutputFilter, Piece
from ssdmoe_tui.server.engine_client import Job
from ssdmoe_tui.server.schema import COMPLETION_FIELDS, CompletionRequest, parse_completion
from ssdmoe_tui.server.serving_openai import OpenAIServing


class ServingCompletion(OpenAIServing):
    async def create(self, request: Request) -> Response:
        p = await self.prepare(
            request, parse_completion, self.state.builder.completion, "cmpl", COMPLETION_FIELDS
        )
        if p.req.stream:
            return self.sse(p, self._stream(p.req, lambda: self.run(p), p.rid))
        job = await self.start(request, p)
        filt = OutputFilter(p.req.sampling.stop)
        return await self.reply(job, filt, request, model=p.req.model, obj="text_completion",
                                body=lambda: {"text": "".join(filt.content)})  # fmt: skip

    def _stream(
        self, req: CompletionRequest, acquire: Callable[[], Awaitable[Job]], rid: str
    ) -> AsyncIterator[str]:
        filt = OutputFilter(req.sampling.stop)

        def bodies(pieces: list[Piece]) -> list[dict]:
            text = "".join(p.text for p in pieces if isinstance(p, Content))
            return [{"text": text}] if text else []

        return self.stream(
            acquire,
            filt,
            req,
            rid=rid,
            obj="text_completion",
            bodies=bodies,
            last={"text": ""},
        )

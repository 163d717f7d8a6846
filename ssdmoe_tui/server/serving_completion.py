"""POST /v1/completions: a raw prompt (text or token ids), JSON or SSE."""

from __future__ import annotations

from collections.abc import AsyncIterator

from starlette.requests import Request
from starlette.responses import Response

from ssdmoe_tui.server.engine_client import Job
from ssdmoe_tui.server.output import Content, OutputFilter, Piece
from ssdmoe_tui.server.schema import CompletionRequest, parse_completion
from ssdmoe_tui.server.serving_openai import OpenAIServing


class ServingCompletion(OpenAIServing):
    async def create(self, request: Request) -> Response:
        req, _, k, job = await self.begin(
            request, parse_completion, self.state.builder.completion, "cmpl"
        )
        filt = OutputFilter(req.sampling.stop)
        return await self.reply(
            request,
            job,
            filt,
            k,
            model=req.model,
            obj="text_completion",
            stream=self._stream(req, job, filt) if req.stream else None,
            body=lambda: {"text": "".join(filt.content)},
        )

    def _stream(self, req: CompletionRequest, job: Job, filt: OutputFilter) -> AsyncIterator[str]:
        def bodies(pieces: list[Piece]) -> list[dict]:
            text = "".join(p.text for p in pieces if isinstance(p, Content))
            return [{"text": text}] if text else []

        return self.stream(
            job,
            filt,
            model=req.model,
            obj="text_completion",
            include_usage=req.include_usage,
            bodies=bodies,
            last={"text": ""},
        )

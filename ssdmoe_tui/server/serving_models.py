"""The endpoints that do not generate: health, the model card, live stats."""

from __future__ import annotations

from dataclasses import asdict

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from ssdmoe_tui.server.schema import split_model
from ssdmoe_tui.server.serving_engine import ServerState


class ServingModels:
    def __init__(self, state: ServerState) -> None:
        self.state = state

    async def health(self, request: Request) -> Response:
        e = self.state.engine
        return JSONResponse(
            {
                "status": "ok",
                "model": self.state.settings.model_id,
                "phase": e.phase.phase,
                "busy": e.busy,
                "queued": e.queued,
            }
        )

    def card(self) -> dict:
        engine = self.state.engine
        info = engine.info
        return {
            "id": self.state.settings.model_id,
            "object": "model",
            "created": self.state.created,
            "owned_by": "ssdmoe",
            "ssdmoe": {
                "model_type": info.model_type,
                "max_context": info.max_context,
                "trained_k": info.trained_k,
                "default_k": engine.default_k,
                "num_experts": info.num_experts,
                "moe_layers": info.num_layers,
                "expert_bytes": info.expert_bytes,
            },
        }

    async def models(self, request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [self.card()]})

    async def model(self, request: Request) -> Response:
        split_model(request.path_params["model_id"], self.state.settings.model_id)
        return JSONResponse(self.card())

    async def stats(self, request: Request) -> Response:
        e = self.state.engine
        info = e.info
        return JSONResponse(
            {
                "model": self.state.settings.model_id,
                "phase": asdict(e.phase),
                "busy": e.busy,
                "queued": e.queued,
                "generations": e.generations,
                "default_k": e.default_k,
                "live": asdict(e.last_sample) if e.last_sample else None,
                "last_response": self.state.last_response_stats,
                "batch": e.batch_stats,
                "engine": {
                    "device": info.device,
                    "dtype": info.dtype,
                    "reader": info.reader,
                    "expert_source": info.expert_source,
                    "expert_cache_budget_bytes": info.expert_cache_budget,
                    "resident_bytes": info.resident_bytes,
                },
                "notices": list(e.notices),
            }
        )

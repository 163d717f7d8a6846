"""The HTTP surface: which path goes to which handler, the API key, the error envelope,
and the middleware (all of it here, in one list, so each cross-cutting check has one
place). Handlers live in the `serving_*` modules; they raise `ApiError` and this module
turns it into the response.
"""

from __future__ import annotations

import hmac
import traceback
from collections.abc import Awaitable, Callable

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from ssdmoe_tui.server.errors import ApiError
from ssdmoe_tui.server.hosts import HostCheck
from ssdmoe_tui.server.http import Disconnected
from ssdmoe_tui.server.serving_chat import ServingChat
from ssdmoe_tui.server.serving_completion import ServingCompletion
from ssdmoe_tui.server.serving_engine import ServerState
from ssdmoe_tui.server.serving_models import ServingModels
from ssdmoe_tui.server.serving_responses import ServingResponses

Handler = Callable[[Request], Awaitable[Response]]


def check_key(state: ServerState, request: Request) -> None:
    key = state.settings.api_key
    if not key:
        return
    auth = request.headers.get("authorization", "")
    # constant-time: the time taken must not tell how much of a guess was right
    if not hmac.compare_digest(auth.encode(), f"Bearer {key}".encode()):
        raise ApiError(
            401,
            "missing or wrong API key (send 'Authorization: Bearer <key>')",
            code="invalid_api_key",
        )


def endpoint(state: ServerState, fn: Handler, *, auth: bool = True) -> Handler:
    """`fn` behind the key check, with every failure answered in the error envelope."""

    async def run(request: Request) -> Response:
        try:
            if auth:
                check_key(state, request)
            return await fn(request)
        except ApiError as e:
            return JSONResponse(e.body(), status_code=e.status, headers=e.headers)
        except Disconnected:
            return Response(status_code=499)
        except Exception as e:  # noqa: BLE001 - a bug: logged, answered in the envelope
            state.log(f"internal error on {request.method} {request.url.path}:\n"
                      + traceback.format_exc().rstrip())  # fmt: skip
            err = ApiError(500, f"internal error: {type(e).__name__}: {e}", code="internal_error")
            return JSONResponse(err.body(), status_code=500)

    return run


def middleware(state: ServerState) -> list[Middleware]:
    """Every middleware the app runs, outermost first: the Host check against DNS
    rebinding (before the routes, the API key and the engine)."""
    return [Middleware(HostCheck, policy=state.settings.hosts)]


def build_app(state: ServerState) -> Starlette:
    models = ServingModels(state)
    chat = ServingChat(state)
    completion = ServingCompletion(state)
    responses = ServingResponses(state)

    def route(path: str, fn: Handler, method: str, auth: bool = True) -> Route:
        return Route(path, endpoint(state, fn, auth=auth), methods=[method])

    routes = [
        route("/health", models.health, "GET", auth=False),
        route("/v1/models", models.models, "GET"),
        route("/models", models.models, "GET"),
        route("/v1/models/{model_id:path}", models.model, "GET"),
        route("/v1/stats", models.stats, "GET"),
        route("/v1/chat/completions", chat.create, "POST"),
        route("/chat/completions", chat.create, "POST"),
        route("/v1/completions", completion.create, "POST"),
        route("/completions", completion.create, "POST"),
        route("/v1/responses", responses.create, "POST"),
        route("/responses", responses.create, "POST"),
    ]
    app = Starlette(routes=routes, middleware=middleware(state))

    async def not_found(request: Request, exc: Exception) -> Response:
        status = getattr(exc, "status_code", 404)
        msg = "no such endpoint" if status == 404 else "method not allowed"
        return JSONResponse(
            ApiError(status, f"{msg}: {request.method} {request.url.path}").body(),
            status_code=status,
        )

    app.add_exception_handler(404, not_found)
    app.add_exception_handler(405, not_found)
    return app

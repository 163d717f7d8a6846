"""The HTTP surface: which path goes to which handler, the API key, the error envelope,
and the middleware (all of it here, in one list, so each cross-cutting check has one
place). Handlers live in the `serving_*` modules; they raise `ApiError` and this module
turns it into the response.
"""

from __future__ import annotations

import hmac
import traceback
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from ssdmoe_tui.server.errors import ApiError
from ssdmoe_tui.server.hosts import HostCheck
from ssdmoe_tui.server.http import Disconnected
from ssdmoe_tui.server.origins import OriginCheck, OriginPolicy
from ssdmoe_tui.server.serving_chat import ServingChat
from ssdmoe_tui.server.serving_completion import ServingCompletion
from ssdmoe_tui.server.serving_engine import K_HEADER, STATS_HEADER, WARNING_HEADER, ServerState
from ssdmoe_tui.server.serving_messages import ServingMessages
from ssdmoe_tui.server.serving_messages import error_body as anthropic_error
from ssdmoe_tui.server.serving_models import ServingModels
from ssdmoe_tui.server.serving_responses import ServingResponses

Handler = Callable[[Request], Awaitable[Response]]


@dataclass(frozen=True)
class Dialect:
    """How one API family sends its key and expects its errors."""

    key_headers: tuple[str, ...]  # headers that may carry the key
    error_body: Callable[[ApiError], dict]
    key_hint: str


OPENAI = Dialect(("authorization",), ApiError.body, "send 'Authorization: Bearer <key>'")
ANTHROPIC = Dialect(
    ("x-api-key", "authorization"), anthropic_error, "send 'x-api-key: <key>' or a Bearer token"
)


def check_key(state: ServerState, request: Request, dialect: Dialect = OPENAI) -> None:
    key = state.settings.api_key
    if not key:
        return
    ok = False
    for name in dialect.key_headers:
        sent = request.headers.get(name, "")
        want = f"Bearer {key}" if name == "authorization" else key
        # constant-time: the time taken must not tell how much of a guess was right
        ok |= hmac.compare_digest(sent.encode(), want.encode())
    if not ok:
        raise ApiError(
            401, f"missing or wrong API key ({dialect.key_hint})", code="invalid_api_key"
        )


def endpoint(
    state: ServerState, fn: Handler, *, auth: bool = True, dialect: Dialect = OPENAI
) -> Handler:
    """`fn` behind the key check, with every failure answered in the dialect's envelope."""

    async def run(request: Request) -> Response:
        try:
            if auth:
                check_key(state, request, dialect)
            return await fn(request)
        except ApiError as e:
            return JSONResponse(dialect.error_body(e), status_code=e.status, headers=e.headers)
        except Disconnected:
            return Response(status_code=499)
        except Exception as e:  # noqa: BLE001 - a bug: logged, answered in the envelope
            state.log(f"internal error on {request.method} {request.url.path}:\n"
                      + traceback.format_exc().rstrip())  # fmt: skip
            err = ApiError(500, f"internal error: {type(e).__name__}: {e}", code="internal_error")
            return JSONResponse(dialect.error_body(err), status_code=500)

    return run


def middleware(state: ServerState) -> list[Middleware]:
    """Every middleware the app runs, outermost first: the Host check against DNS
    rebinding (before the routes, the API key and the engine); the origin check (an
    `Origin` not allowed, or a body that is not JSON, is refused: a web page's simple
    request never runs, origins.py); then CORS, only for the origins `--allowed-origins`
    names (none by default: no page can read an answer, and a preflighted request,
    JSON with a key, is not sent at all)."""
    origins = state.settings.allowed_origins
    out = [
        Middleware(HostCheck, policy=state.settings.hosts),
        Middleware(OriginCheck, policy=OriginPolicy.of(origins)),
    ]
    if origins:
        out.append(
            Middleware(
                CORSMiddleware,
                allow_origins=list(origins),
                allow_methods=["GET", "POST", "OPTIONS"],
                allow_headers=["*"],  # authorization, x-api-key, the SDKs' x-stainless-*, ...
                expose_headers=[STATS_HEADER, K_HEADER, WARNING_HEADER],
                max_age=600,
            )
        )
    return out


def build_app(state: ServerState) -> Starlette:
    models = ServingModels(state)
    chat = ServingChat(state)
    completion = ServingCompletion(state)
    responses = ServingResponses(state)
    messages = ServingMessages(state)

    def route(
        path: str, fn: Handler, method: str, auth: bool = True, dialect: Dialect = OPENAI
    ) -> Route:
        return Route(path, endpoint(state, fn, auth=auth, dialect=dialect), methods=[method])

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
        route("/v1/messages", messages.create, "POST", dialect=ANTHROPIC),
        route("/v1/messages/count_tokens", messages.count_tokens, "POST", dialect=ANTHROPIC),
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

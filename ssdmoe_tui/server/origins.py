"""What a web page can send without asking: one ASGI middleware, after the Host check.

A browser sends a "simple request" (GET or POST with a `text/plain`, form or typeless
body) to any origin without a CORS preflight; CORS only stops the page from *reading*
the answer. Against a keyless loopback server that is enough to do harm: the request
runs, burns the machine's compute, and writes the prompt history and KV checkpoints. So
before any route, on every path and every API:

- a request carrying an `Origin` header that `--allowed-origins` does not name is a 403
  (`origin_not_allowed`): browsers send `Origin` on every cross-origin request (and on
  every POST), API clients (the `openai` and `anthropic` SDKs, curl) send none;
- a request without `Origin` but with a `Referer` whose origin is not named is refused
  the same way: an older browser, or a page's navigation or form, may name the page in
  `Referer` alone, and no API client sends one;
- a request with a body (any method but GET, HEAD, OPTIONS) whose `Content-Type` is not
  `application/json` is a 415 (`unsupported_media_type`): the only bodies this API
  takes are JSON, and a page can send JSON cross-origin only after a preflight, which
  the server answers only for the allowed origins.

Either check alone closes the hole; both together keep it closed if one is loosened.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from ssdmoe_tui.errors import printable
from ssdmoe_tui.server.errors import ApiError, send_error
from ssdmoe_tui.server.hosts import ASGIApp, Receive, Scope, Send

_BODYLESS = frozenset({"GET", "HEAD", "OPTIONS"})


def _shown(text: str) -> str:
    """A header value as quoted in a refusal: printable, at most 100 characters."""
    return repr(printable(text, 100))


def referer_origin(referer: str) -> str:
    """The origin a `Referer` names: `https://evil.example:8443/page?q` ->
    `https://evil.example:8443` (what a browser would have sent as `Origin`)."""
    scheme, sep, rest = referer.strip().partition("://")
    if not sep:
        return referer.strip()
    return f"{scheme}://{rest.split('/', 1)[0].split('?', 1)[0].split('#', 1)[0]}"


def media_type(content_type: str) -> str:
    """`application/json; charset=utf-8` -> `application/json` (lower-cased)."""
    return content_type.split(";", 1)[0].strip().lower()


@dataclass(frozen=True)
class OriginPolicy:
    """The web origins whose pages may call the server (`--allowed-origins`)."""

    allowed: tuple[str, ...] = ()

    @classmethod
    def of(cls, origins: Iterable[str]) -> OriginPolicy:
        return cls(tuple(o.strip().rstrip("/").lower() for o in origins if o and o.strip()))

    def allows(self, origin: str) -> bool:
        return "*" in self.allowed or origin.strip().rstrip("/").lower() in self.allowed


def refusal(method: str, headers: dict[str, str], policy: OriginPolicy) -> ApiError | None:
    """Why a request is refused before any route (None: it passes). `headers`: the
    request's headers, names lower-cased."""
    origin, what = headers.get("origin"), "Origin"
    if origin is None and headers.get("referer") is not None:
        origin, what = referer_origin(headers["referer"]), "Referer"
    if origin is not None and not policy.allows(origin):
        return ApiError(
            403,
            f"{what} {_shown(headers[what.lower()])} is not allowed: this server answers web "
            "pages only from the origins given with --allowed-origins (none by default)",
            code="origin_not_allowed",
        )
    if method.upper() not in _BODYLESS:
        sent = headers.get("content-type")
        if sent is None or media_type(sent) != "application/json":
            what = "no Content-Type" if sent is None else f"Content-Type {_shown(sent)}"
            return ApiError(
                415,
                f"the request has {what}: send the body as JSON with "
                "'Content-Type: application/json'",
                code="unsupported_media_type",
            )
    return None


class OriginCheck:
    """ASGI middleware applying `refusal` to every HTTP request (see the module)."""

    def __init__(self, app: ASGIApp, policy: OriginPolicy) -> None:
        self.app = app
        self.policy = policy

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope.get("type") != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1")
                   for k, v in scope.get("headers", ())}  # fmt: skip
        err = refusal(scope.get("method", "GET"), headers, self.policy)
        if err is None:
            await self.app(scope, receive, send)
            return
        await send_error(send, err)

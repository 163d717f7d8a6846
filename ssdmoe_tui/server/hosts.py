"""The Host check against DNS rebinding: one ASGI middleware, outermost.

A web page can make its own name resolve to 127.0.0.1 (DNS rebinding) and then drive a
keyless loopback server from the user's browser: the browser thinks it talks to the
page's own origin, so the same-origin policy lets it read the answers. What gives it
away is the `Host` header, which carries the page's name. So the server answers only
requests whose Host is

- a loopback name: `localhost`, `*.localhost` (RFC 6761: never anything but loopback),
  or a loopback address (127.0.0.0/8, ::1);
- an address it is bound to; bound to all interfaces (0.0.0.0, ::), any IP address
  (a rebinding page needs a *name*: an address literal cannot be rebound);
- a name given with `--allowed-hosts` (`name`, `.example.com` for the name and every
  name under it, `*` for any Host at all).

A request without a Host header (HTTP/1.0 tools; no browser sends one) is answered.
Anything else is a 403 in OpenAI's error envelope naming the Host and the option.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from dataclasses import dataclass
from typing import Any

from ssdmoe_tui.server.errors import ApiError, send_error

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

_WILDCARDS = {ipaddress.ip_address("0.0.0.0"), ipaddress.ip_address("::")}


def host_name(header: str) -> str:
    """The name or address of a Host header, without port, brackets or a trailing dot,
    lower-cased ("[::1]:8000" -> "::1", "LocalHost.:80" -> "localhost"); anything after
    an address's "]" but a port keeps the whole text ("[::1].evil" is no loopback name)."""
    h = header.strip().lower()
    if h.startswith("["):
        end = h.find("]")
        rest = h[end + 1 :] if end > 0 else ""
        if end > 0 and (rest == "" or (rest[0] == ":" and rest[1:].isdigit())):
            return h[1:end]
        return h  # "[::1].evil": no address with a port, so the whole text is the name
    if h.count(":") == 1:
        h = h.split(":", 1)[0]
    return h.rstrip(".")


def _address(name: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(name.split("%", 1)[0])  # fe80::1%eth0: the zone goes
    except ValueError:
        return None


@dataclass(frozen=True)
class HostPolicy:
    """Which Host names the server answers (see the module docstring)."""

    bound: tuple[str, ...] = ()  # the addresses the server listens on
    extra: tuple[str, ...] = ()  # --allowed-hosts

    @classmethod
    def of(cls, bound: Iterable[str], extra: Iterable[str] = ()) -> HostPolicy:
        names = tuple(host_name(b) for b in bound if b)
        allowed = tuple(e.strip().lower().rstrip(".") for e in extra if e and e.strip())
        return cls(names, allowed)

    def allows(self, name: str) -> bool:
        if "*" in self.extra:
            return True
        if name == "localhost" or name.endswith(".localhost"):
            return True
        addr = _address(name)
        if addr is not None:
            if addr.is_loopback:
                return True
            bound = [a for a in map(_address, self.bound) if a is not None]
            if any(b in _WILDCARDS for b in bound):
                return True
            if addr in bound:
                return True
        for allowed in self.extra:
            if allowed.startswith("."):
                if name == allowed[1:] or name.endswith(allowed):
                    return True
            elif name == allowed:
                return True
        return name in self.bound


def host_refusal(raw: str, policy: HostPolicy) -> ApiError | None:
    """The 403 for a Host header the policy refuses (None: it passes)."""
    if policy.allows(host_name(raw)):
        return None
    shown = raw if len(raw) <= 100 else raw[:97] + "..."
    message = (
        f"Host {shown!r} is not allowed: this server answers loopback names "
        "and its own addresses (against DNS rebinding); start it with "
        f"--allowed-hosts {host_name(raw) or 'NAME'} to allow that name"
    )
    return ApiError(403, message, code="host_not_allowed")


class HostCheck:
    """ASGI middleware: a request whose Host the policy refuses gets a 403 and never
    reaches a route (nor the API-key check, nor the engine)."""

    def __init__(self, app: ASGIApp, policy: HostPolicy) -> None:
        self.app = app
        self.policy = policy

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope.get("type") not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        header = next((v for k, v in scope.get("headers", ()) if k == b"host"), None)
        if header is None:
            await self.app(scope, receive, send)
            return
        err = host_refusal(header.decode("latin-1"), self.policy)
        if err is None:
            await self.app(scope, receive, send)
            return
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})
            return
        await send_error(send, err)

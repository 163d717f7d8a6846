"""A hostile HTTP server on loopback for the attached-app tests: it answers the paths
`RemoteEngine` asks (`/v1/models`, `/v1/stats`, `/v1/chat/completions`) with whatever
each test says (the standard library's server, on a port of its own)."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

CARD = {"object": "list", "data": [{"id": "hostile", "object": "model",
        "ssdmoe": {"trained_k": 2, "default_k": 2, "moe_layers": 2, "num_experts": 8}}]}  # fmt: skip
LIVE = {"decode_tok_s": 1.0, "prefill_tok_s": 1.0, "ssd_mib_per_token": 0.0,
        "requested_mib_per_token": 0.0, "expert_cache_hit_rate": 0.5,
        "expert_cache_used_bytes": 1, "expert_cache_budget_bytes": 2, "resident_bytes": 3,
        "kv_cache_bytes": 4, "rss_bytes": 5, "peak_rss_bytes": 6, "peak_memory_bytes": 7,
        "kv_hit_rate": 0.0, "context_tokens": 8, "max_context": 9, "k": 2,
        "generated_tokens": 1}  # fmt: skip
STATS = {"model": "hostile", "engine": {"device": "cpu"}, "live": LIVE}


def event(data: bytes) -> bytes:
    """One server-sent event: its data line and the blank line that ends it."""
    return b"data: " + data + b"\n\n"


DONE = event(b"[DONE]")


def chunk(content: str = "", finish: str | None = None, **extra) -> bytes:
    c = {"choices": [{"index": 0, "delta": {"content": content}, "finish_reason": finish}],
         **extra}  # fmt: skip
    return event(json.dumps(c).encode())


Behaviour = Callable[[BaseHTTPRequestHandler], None]


def answer(body: object, status: int = 200) -> Behaviour:
    def send(h: BaseHTTPRequestHandler) -> None:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        h.send_response(status)
        h.send_header("content-type", "application/json")
        h.send_header("content-length", str(len(data)))
        h.end_headers()
        h.wfile.write(data)

    return send


class Hostile:
    """A loopback HTTP server answering each path as `routes` says."""

    def __init__(self, routes: dict[str, Behaviour]) -> None:
        routes = {"/v1/models": answer(CARD), "/v1/stats": answer(STATS), **routes}

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:
                pass

            def do_GET(self) -> None:
                routes.get(self.path, answer({"error": {"message": "no"}}, 404))(self)

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("content-length") or 0))
                self.do_GET()

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

"""`ssdmoe serve`: an OpenAI-compatible HTTP server on the streamed engine (docs/server.md)."""

from __future__ import annotations

import argparse

from ssdmoe_tui.commands.common import add_model_arguments


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "serve",
        help="serve the model over an OpenAI-compatible HTTP API",
        description="OpenAI-compatible server: /v1/chat/completions, /v1/completions, "
        "/v1/models, /v1/stats, /health. Needs the server extra: pip install 'ssdmoe-tui[server]'.",
    )
    add_model_arguments(p)
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default: 127.0.0.1)")
    p.add_argument("--port", type=int, default=8080, help="port (default: 8080; 0: any free port)")
    p.add_argument(
        "--api-key",
        default=None,
        help="require 'Authorization: Bearer KEY' on every endpoint but /health "
        "(default: $SSDMOE_API_KEY if set)",
    )
    p.add_argument(
        "--max-queue", type=int, default=8, help="requests that may wait for the engine (then 429)"
    )
    p.add_argument(
        "--max-tokens",
        type=int,
        default=4096,
        help="reply length when a request sets none (capped by the context)",
    )
    p.add_argument(
        "--temp", type=float, default=0.0, help="temperature when a request sets none (default 0)"
    )
    p.add_argument("--max-body", default="32M", help="largest request body (default 32M)")
    p.add_argument(
        "--no-prompt-cache-disk",
        action="store_true",
        help="keep the prompt cache in memory only (no KV checkpoints on disk)",
    )
    p.add_argument(
        "--prefill-step",
        type=int,
        default=None,
        help="prefill chunk in tokens (default: from memory, at most 2048)",
    )
    p.set_defaults(func=run)


def _check(args: argparse.Namespace) -> None:
    from ssdmoe_tui.errors import BadValueError

    if not 0 <= args.port <= 65535:
        raise BadValueError(f"--port {args.port} is outside 0..65535")
    if args.max_queue < 0:
        raise BadValueError(f"--max-queue {args.max_queue} must be >= 0")
    if args.max_tokens < 1:
        raise BadValueError(f"--max-tokens {args.max_tokens} must be >= 1")
    if not 0.0 <= args.temp <= 2.0:
        raise BadValueError(f"--temp {args.temp} is outside 0..2")
    for flag in ("reader", "experts"):
        if getattr(args, flag, "auto") != "auto":
            raise BadValueError(f"--{flag} is not supported by serve yet (use the default)")
    if getattr(args, "direct_io", False) or getattr(args, "prefetch", False):
        raise BadValueError("--direct-io / --prefetch are not supported by serve yet")


def run(args: argparse.Namespace) -> int:
    import asyncio
    import os
    import sys

    try:
        import starlette  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError:
        print(
            "ssdmoe: error: serve needs the server extra: pip install 'ssdmoe-tui[server]'",
            file=sys.stderr,
        )
        return 2
    from ssdmoe_tui.engine.cache import parse_size
    from ssdmoe_tui.engine.protocol import LoadModel
    from ssdmoe_tui.errors import BadValueError
    from ssdmoe_tui.server.engine_client import EngineFailed
    from ssdmoe_tui.server.main import (
        ServeOptions,
        Server,
        bind,
        engine_service_factory,
        print_ready,
        url_of,
    )

    _check(args)
    try:
        max_body = parse_size(args.max_body)
    except ValueError as e:
        raise BadValueError(f"--max-body {args.max_body!r}: {e}") from None
    api_key = args.api_key if args.api_key is not None else os.environ.get("SSDMOE_API_KEY")
    options = ServeOptions(
        load=LoadModel(
            path=args.model,
            k=args.k,
            prefill_k=args.prefill_k,
            expert_cache=args.expert_cache,
            dtype=args.dtype,
        ),
        api_key=api_key or None,
        max_queue=args.max_queue,
        max_body_bytes=max_body,
        max_tokens=args.max_tokens,
        temperature=args.temp,
        persist_cache=not args.no_prompt_cache_disk,
        make_service=engine_service_factory(args.prefill_step),
    )
    sock = bind(args.host, args.port)
    server = Server(options)
    print(f"ssdmoe serve: loading {args.model or 'the demo model'} ...", file=sys.stderr)
    try:
        asyncio.run(
            server.run(
                sock, on_ready=lambda s: print_ready(url_of(sock), s.model_id, bool(api_key))
            )
        )
    except EngineFailed as e:
        print(f"ssdmoe: error: {e}", file=sys.stderr)
        return 1
    finally:
        sock.close()
    return 0

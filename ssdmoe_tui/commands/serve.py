"""`ssdmoe serve`: an OpenAI-compatible HTTP server on the streamed engine (docs/server.md)."""

from __future__ import annotations

import argparse
import re
from functools import partial

from ssdmoe_tui import options as O
from ssdmoe_tui.commands.common import (
    Adder,
    add_all,
    add_distributed_argument,
    add_max_tokens_argument,
    add_model_arguments,
    add_prefill_step_argument,
    add_speculate_arguments,
    arg_type,
    engine_options,
    flag,
)
from ssdmoe_tui.errors import BadValueError
from ssdmoe_tui.server import defaults as D


def _whole_in(text: str, what: str, lo: int, hi: int | None = None) -> int:
    try:
        value = int(text.strip())
    except ValueError:
        raise BadValueError(f"{what} must be a whole number, got {text!r}") from None
    if value < lo or (hi is not None and value > hi):
        raise BadValueError(f"{what} {value} is outside {lo}..{hi if hi is not None else ''}")
    return value


def _port(text: str) -> int:
    return _whole_in(text, "port", 0, 65535)


def _queue(text: str) -> int:
    return _whole_in(text, "max queue", 0)


def _batch(text: str) -> int | None:
    """`--max-batch N` (1..256) or `auto`."""
    if text.strip().lower() == "auto":
        return None
    return _whole_in(text, "max batch", 1, 256)


HELP = "serve the model over an OpenAI-compatible HTTP API"
DESCRIPTION = (
    "OpenAI-compatible server: /v1/chat/completions, /v1/completions, /v1/models, /v1/stats, "
    "/health (docs/server.md). Needs the server extra: pip install 'ssdmoe-tui[server]'."
)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("serve", help=HELP, description=DESCRIPTION)
    add_all(p, ARGUMENTS)
    p.set_defaults(func=run)


def _host_list(text: str) -> tuple[str, ...]:
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    for n in names:
        if n != "*" and not re.fullmatch(r"\.?[A-Za-z0-9_.:\[\]-]{1,253}", n):
            raise BadValueError(f"{n!r} is not a host name (NAME, .DOMAIN or *)")
    return names


def _origin_list(text: str) -> tuple[str, ...]:
    origins = tuple(o.strip().rstrip("/") for o in text.split(",") if o.strip())
    for o in origins:
        if o != "*" and not re.fullmatch(r"https?://[A-Za-z0-9_.\[\]:-]{1,253}", o):
            raise BadValueError(
                f"{o!r} is not a web origin (scheme://host[:port], e.g. http://localhost:3000, or *)"
            )
    return origins


#: Where the server listens and whom it answers: host, port, Host and Origin allow-lists,
#: the API key.
ADDRESS: tuple[Adder, ...] = (
    flag("--host", default=D.HOST, help=f"address to bind (default: {D.HOST})"),
    flag("--port", type=arg_type(_port), default=D.PORT,
         help=f"port (default {D.PORT}; 0: any free port)"),
    flag("--allowed-hosts", type=arg_type(_host_list), default=(), metavar="NAMES",
         help="comma-separated Host names to answer besides loopback names and the bound "
         "address (a web page cannot drive the server through a rebound DNS name): "
         "NAME, .DOMAIN (it and every name under it), or * (any)"),
    flag("--allowed-origins", type=arg_type(_origin_list), default=(), metavar="ORIGINS",
         help="comma-separated web origins (https://chat.example.com) whose pages may call "
         "the API from a browser (CORS), or * for any; default none: a request with any "
         "other Origin header, or a body that is not application/json, is refused"),
    flag("--api-key", default=None,
         help="require 'Authorization: Bearer KEY' on every endpoint but /health "
         "(default: $SSDMOE_API_KEY when set)"),
)  # fmt: skip

#: How much the server takes on: queue, batch, tokens, temperature, body size.
LIMITS: tuple[Adder, ...] = (
    flag("--max-queue", type=arg_type(_queue), default=D.MAX_QUEUE, metavar="N",
         help="requests that may wait for the engine before new ones get 429 "
         f"(default {D.MAX_QUEUE})"),
    flag("--max-batch", type=arg_type(_batch), default=None, metavar="N",
         help="requests decoded together, sharing each layer's expert reads; more wait in "
         "the queue (default auto: what the KV budget allows at the model's context, at "
         "least 4; 1: one at a time)"),
    partial(add_max_tokens_argument, default=D.MAX_TOKENS),
    flag("--temp", type=arg_type(O.parse_temp), default=D.TEMPERATURE,
         help=f"temperature when a request sets none (default {D.TEMPERATURE:g}: greedy)"),
    flag("--max-body", type=arg_type(O.parse_bytes, "max body"), default=D.MAX_BODY_BYTES,
         metavar="SIZE", help=f"largest request body (default {D.MAX_BODY_BYTES >> 20}M)"),
)  # fmt: skip

#: What the prompt cache keeps on disk.
CACHE: tuple[Adder, ...] = (
    flag("--no-disk-cache", action="store_true",
         help="keep the prompt cache in memory only (no KV checkpoints on disk)"),
    flag("--no-system-checkpoint", action="store_true",
         help="do not give a new chat's system prompt its own KV checkpoint (saves a step "
         "and a checkpoint per distinct system prompt; new chats then prefill it)"),
)  # fmt: skip

#: serve's options in --help order.
ARGUMENTS: tuple[Adder, ...] = (
    add_model_arguments, add_prefill_step_argument, add_speculate_arguments,
    *ADDRESS, *LIMITS, *CACHE, add_distributed_argument,
)  # fmt: skip


def run(args: argparse.Namespace) -> int:
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

    link = None
    if args.distributed:  # rank 0 serves HTTP; the other ranks follow its engine
        from ssdmoe_tui.engine.distributed.group import start
        from ssdmoe_tui.engine.distributed.link import ServiceLink, follow

        dist = start(sigterm=False)
        with dist.guard():
            link = ServiceLink(dist)
            if not dist.is_root:
                hooks = None
                if not args.no_disk_cache:  # this machine's copy of the KV checkpoints
                    from ssdmoe_tui.server.main import default_cache_root
                    from ssdmoe_tui.server.replicated_kv import ReplicatedKV

                    hooks = ReplicatedKV.follower(dist, default_cache_root()).hooks()
                dist.exit_code = follow(dist, engine_options(args), link, kv_hooks=hooks)
            else:
                dist.exit_code = _serve(args, link)
        return dist.exit_code
    return _serve(args, link)


def _serve(args: argparse.Namespace, link) -> int:
    import asyncio
    import os
    import sys

    from ssdmoe_tui.commands.common import speculation
    from ssdmoe_tui.server.engine_client import EngineFailed
    from ssdmoe_tui.server.main import (
        ServeOptions,
        Server,
        bind,
        is_loopback,
        print_ready,
        url_of,
    )

    api_key = args.api_key if args.api_key is not None else os.environ.get("SSDMOE_API_KEY")
    spec = speculation(args)
    if spec.on and link is not None:
        raise BadValueError("--speculate: not with --distributed (the ranks step one token)")
    options = ServeOptions(
        engine=engine_options(args),
        api_key=api_key or None,
        max_queue=args.max_queue,
        max_batch=args.max_batch,
        speculate=spec,
        max_body_bytes=args.max_body,
        max_tokens=args.max_tokens,
        temperature=args.temp,
        persist_cache=not args.no_disk_cache,
        distributed=link.dist if link is not None else None,
        system_checkpoints=not args.no_system_checkpoint,
        make_service=link.service_factory(engine_options(args)) if link is not None else None,
        allowed_hosts=args.allowed_hosts,
        allowed_origins=args.allowed_origins,
    )
    sock = bind(args.host, args.port)
    if not api_key and not is_loopback(args.host):
        print(
            f"ssdmoe serve: warning: listening on {args.host} without --api-key: anyone who "
            "can reach this port can use the model",
            file=sys.stderr,
        )
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

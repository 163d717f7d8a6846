"""Start the engine, then serve HTTP until stopped: what `ssdmoe serve` and the tests run.

    server = Server(ServeOptions(load=LoadModel(path=...)))
    asyncio.run(server.run(sock))      # sock: a bound socket (a port of our choice, or 0)
    server.stop()                      # from any thread

The model is loaded before the socket accepts anything, so a client never sees a
half-started server; a load failure (model lock held, bad folder) is one line.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from ssdmoe_tui.engine.run import protocol as P
from ssdmoe_tui.errors import SsdmoeError
from ssdmoe_tui.options import EngineOptions, Speculation
from ssdmoe_tui.server import defaults as D
from ssdmoe_tui.server.engine_client import AsyncEngine, MakeService
from ssdmoe_tui.server.hosts import HostPolicy
from ssdmoe_tui.server.prompt_cache import ServerKV, model_folder
from ssdmoe_tui.server.prompts import HISTORY_FILE, HistoryRecords, PromptBuilder
from ssdmoe_tui.server.routes import build_app
from ssdmoe_tui.server.serving_engine import ApiSettings, ServerState


def default_cache_root() -> Path:
    from ssdmoe_tui.paths import data_dir

    return data_dir() / "server-cache"


def engine_service_factory(
    options: EngineOptions, max_batch: int | None = None, speculate: Speculation | None = None
) -> MakeService:
    """The default seam: the in-process engine thread, opened with `options`, decoding up
    to `max_batch` requests together (None: what its KV budget allows, at least 4), with
    `speculate` for requests that name none; the server injects its own KV hooks (not
    the app's sessions)."""

    def make(post):  # noqa: ANN001, ANN202
        from ssdmoe_tui.engine.run.service import EngineService

        return EngineService(post, options=options, max_batch=max_batch, speculate=speculate)

    return make


def load_command(options: EngineOptions) -> P.LoadModel:
    return P.LoadModel(
        path=options.model,
        k=options.k,
        prefill_k=options.prefill_k,
        expert_cache=str(options.expert_cache),
        dtype=options.dtype,
    )


@dataclass
class ServeOptions:
    engine: EngineOptions = field(default_factory=EngineOptions)
    api_key: str | None = None
    max_queue: int = D.MAX_QUEUE
    # requests decoded together (engine/run/batch_loop.py); None: what the KV budget
    # allows at the model's context, at least 4; 1: one at a time
    max_batch: int | None = None
    speculate: Speculation = field(default_factory=Speculation)  # requests that name none
    max_body_bytes: int = D.MAX_BODY_BYTES
    max_tokens: int = D.MAX_TOKENS
    temperature: float = D.TEMPERATURE
    cache_root: Path | None = None  # None: <data dir>/server-cache
    persist_cache: bool = True  # False: in-memory prompt cache only
    system_checkpoints: bool = True  # a fresh chat's system part gets its own checkpoint
    make_service: MakeService | None = None  # None: an EngineService in this process
    # serve --distributed: rank 0's engine.distributed handle; the KV checkpoints are then
    # kept in step on every rank (replicated_kv.py)
    distributed: object = None
    log_level: str = "warning"
    allowed_hosts: tuple[str, ...] = ()  # Host names answered beyond loopback (server/hosts.py)
    allowed_origins: tuple[str, ...] = ()  # web origins allowed by CORS ("*": any); none: off


def host_policy(sock: socket.socket, allowed: tuple[str, ...]) -> HostPolicy:
    """The Host names the server answers: loopback, the socket's address, `allowed`."""
    try:
        bound = [str(sock.getsockname()[0])]
    except OSError:
        bound = []
    return HostPolicy.of(bound, allowed)


class Server:
    def __init__(self, options: ServeOptions) -> None:
        self.options = options
        make = options.make_service or engine_service_factory(
            options.engine, options.max_batch, options.speculate
        )
        self.engine = AsyncEngine(make, max_queue=options.max_queue, max_batch=None)
        self.state: ServerState | None = None  # the handlers' shared state, once loaded
        self.kv: ServerKV | None = None
        self.model_id = ""
        self._uvicorn = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.ready = threading.Event()
        self.error: str | None = None

    async def start_engine(self) -> None:
        opts = self.options
        notice = self.engine.on_notice
        kv = None
        hooks = None
        if opts.persist_cache:
            from ssdmoe_tui.engine.run.service import KVHooks

            # The folder depends on the model's fingerprint, known once it is loaded:
            # the hooks look it up lazily through `self.kv`.
            hooks = KVHooks(save=self._kv_save, load=self._kv_load, covers=self._kv_covers)
            if opts.distributed is not None:
                from ssdmoe_tui.server.replicated_kv import ReplicatedKV

                hooks = ReplicatedKV.root(opts.distributed, lambda info: self.kv).hooks()
        info = await self.engine.start(load_command(opts.engine), kv_hooks=hooks)
        self.model_id = info.name
        folder = model_folder(opts.cache_root or default_cache_root(), info.fingerprint)
        records_path = folder / HISTORY_FILE if opts.persist_cache else None
        records = await asyncio.to_thread(HistoryRecords, records_path, notice)
        if opts.persist_cache:
            kv = ServerKV(folder, notice=notice, tokens_of=records.tokens_of)
        self.kv = kv
        builder = PromptBuilder(self.engine.tokenizer, records, _vocab_size(info.path))
        self.state = ServerState(
            self.engine,
            builder,
            ApiSettings(
                model_id=self.model_id,
                api_key=opts.api_key,
                max_body_bytes=opts.max_body_bytes,
                max_tokens=opts.max_tokens,
                temperature=opts.temperature,
                system_checkpoints=opts.system_checkpoints,
                allowed_origins=tuple(opts.allowed_origins),
            ),
            kv,
        )

    # Engine-thread hooks; `self.kv` is set before any request can reach the engine.
    def _kv_save(self, *args):  # noqa: ANN002, ANN202
        if self.kv is not None:
            return self.kv.save(*args)
        return None

    def _kv_load(self, *args):  # noqa: ANN002, ANN202
        if self.kv is not None:
            return self.kv.load(*args)
        return None

    def _kv_covers(self, *args) -> int:  # noqa: ANN002
        return self.kv.covers(*args) if self.kv is not None else 0

    async def run(
        self, sock: socket.socket, on_ready: Callable[[Server], None] | None = None
    ) -> None:
        import uvicorn

        self._loop = asyncio.get_running_loop()
        try:
            await self.start_engine()
            hosts = host_policy(sock, self.options.allowed_hosts)
            self.state.settings = replace(self.state.settings, hosts=hosts)
            config = uvicorn.Config(
                build_app(self.state),
                log_level=self.options.log_level,
                access_log=False,
                lifespan="off",
                timeout_graceful_shutdown=2,
            )
            self._uvicorn = uvicorn.Server(config)
            task = asyncio.ensure_future(self._uvicorn.serve(sockets=[sock]))
            while not self._uvicorn.started and not task.done():
                await asyncio.sleep(0.01)
            if self._uvicorn.started:
                self._advertise(sock)
                self.ready.set()
                if on_ready is not None:
                    on_ready(self)
            await task
        finally:
            self.ready.set()
            if self.state is not None:
                await asyncio.to_thread(self.state.builder.records.close)
            await asyncio.to_thread(self.engine.shutdown)

    def _advertise(self, sock: socket.socket) -> None:
        """The model's claim says where it is served (models/lock.py), so the app on this
        machine lists this server in F4 and can attach to it; a failure only costs that."""
        advertise = getattr(self.engine.service, "advertise", None)
        if advertise is None:
            return
        try:
            advertise(local_url(sock), key_required=bool(self.options.api_key))
        except Exception as e:  # noqa: BLE001 - serving works without being listed
            from ssdmoe_tui.errors import user_message

            self.engine.on_notice(f"not listed for the app on this machine: {user_message(e)}")

    def stop(self) -> None:
        """Thread-safe: stop serving (the current generation is cancelled)."""
        srv = self._uvicorn
        if srv is not None:
            srv.should_exit = True
        if self.engine.service is not None:
            self.engine.service.cancel()


def _vocab_size(folder: str) -> int | None:
    """Rows of the model's embedding, from its config (Qwen3.5 nests it in text_config)."""
    from ssdmoe_tui.checkpoint.config import read_config

    cfg = read_config(Path(folder))
    for c in (cfg, cfg.get("text_config")):
        n = c.get("vocab_size") if isinstance(c, dict) else None
        if isinstance(n, int) and not isinstance(n, bool) and n > 0:
            return n
    return None


def bind(host: str, port: int) -> socket.socket:
    """A listening socket, so a taken port is one clear error before the model loads."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        raise SsdmoeError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
    sock.listen(128)
    sock.set_inheritable(True)
    return sock


def is_loopback(host: str) -> bool:
    """Whether only this machine can reach `host` (a name other than localhost: no)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def url_of(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    host = f"[{host}]" if ":" in host else host
    return f"http://{host}:{port}"


def local_url(sock: socket.socket) -> str:
    """The URL a client on this machine uses: a wildcard bind is reached on loopback."""
    host, port = sock.getsockname()[:2]
    if host in ("0.0.0.0", ""):
        host = "127.0.0.1"
    elif host == "::":
        host = "::1"
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def print_ready(url: str, model_id: str, api_key: bool) -> None:
    print(
        f"ssdmoe serve: {url}/v1  model {model_id!r}" + ("  (API key required)" if api_key else "")
    )
    sys.stdout.flush()

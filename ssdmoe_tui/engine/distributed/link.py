"""`serve --distributed`: every rank's engine thread runs rank 0's commands in step."""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable

from ssdmoe_tui.engine.distributed.failure import DistributedError, looks_like_comm_error
from ssdmoe_tui.engine.distributed.stats import DecodeMeter
from ssdmoe_tui.errors import user_message


def _encode_command(cmd) -> dict:
    from dataclasses import asdict

    return {"type": type(cmd).__name__, "fields": asdict(cmd)}


def _decode_command(data: dict):
    from ssdmoe_tui.engine.run import protocol as P

    cls = {c.__name__: c for c in (P.LoadModel, P.Generate, P.SetExpertCache, P.Shutdown)}.get(
        data["type"]
    )
    if cls is None:
        raise DistributedError(f"rank 0 sent an unknown engine command {data['type']!r}")
    fields = dict(data["fields"])
    if cls is P.Generate:
        from ssdmoe_tui.options import SamplingOptions

        fields["prompt_tokens"] = tuple(fields.get("prompt_tokens") or ())
        fields["sampling"] = SamplingOptions(**fields.get("sampling", {}))
    return cls(**fields)


class ServiceLink:
    """Keeps every rank's `EngineService` in step with rank 0's (`serve --distributed`).

    rank 0's engine thread takes commands from its queue and sends each to the other
    ranks, whose engine threads run the same command on their own engine. Whatever
    comes from outside the computation is decided on rank 0 and agreed at fixed points:
    the command, K (a K change waits for the next agreement, so every rank switches at
    the same token), and stop requests (one agreement per prefill chunk and per token).
    An error other than a rejected value (which every rank raises alike) leaves the
    ranks out of step, so it ends the launch with one line (`fatal`)."""

    def __init__(self, dist) -> None:
        self.dist = dist
        self._pending_k: int | None = None
        self.lock_here = dist.first_on_host()  # takes the machine-wide model lock

    def attach(self, service) -> None:
        service.link = self
        service.use_model_lock = self.lock_here

    def service_factory(self, options):
        """rank 0: `make(post)` for the server, an EngineService linked to the others."""

        def make(post):
            from ssdmoe_tui.engine.run.service import EngineService

            service = EngineService(post, options=options)
            self.attach(service)
            return service

        return make

    def set_k(self, k: int) -> None:
        """rank 0: K for the next agreement (the next token or the next command)."""
        self._pending_k = int(k)

    def _take_k(self) -> int:
        k, self._pending_k = self._pending_k, None
        return k or 0

    def next_command(self, q):
        """rank 0: the next queued command, sent to all; others: the command received.
        Returns (command, K to apply first or None)."""
        msg = None
        if self.dist.is_root:
            cmd = q.get()
            msg = {"cmd": _encode_command(cmd), "k": self._take_k()}
        msg = self.dist.broadcast_json(msg)
        return _decode_command(msg["cmd"]), (msg["k"] or None)

    def should_stop(self, local: Callable[[], bool], runner) -> Callable[[], bool]:
        """rank 0's stop decision and pending K, on every rank, at the same point."""

        def agreed() -> bool:
            word = (self._take_k() << 1) | int(bool(local())) if self.dist.is_root else 0
            word = self.dist.agree(word)
            if word >> 1:
                runner.set_k(word >> 1)
            return bool(word & 1)

        return agreed

    def sampler(self, sampler):
        return self.dist.wrap_sampler(sampler)

    def meter(self, sm) -> DecodeMeter:
        return self.dist.meter(sm)

    def turn_stats(self, sm, meter: DecodeMeter, steps: int) -> dict:
        return self.dist.run_stats(sm, meter, steps, probe=False)

    def fatal(self, exc: BaseException) -> None:
        """An error that leaves the ranks out of step: end the launch with one line."""
        line = f"rank {self.dist.rank}: {user_message(exc)}"
        wd = self.dist.watchdog
        if wd is None:
            from ssdmoe_tui.engine.distributed import exit_status

            print(f"ssdmoe: error: {line}", file=sys.stderr, flush=True)
            exit_status.write(self.dist.rank, 1)
            os._exit(1)
        if not self.dist.is_root:
            wd.local_failure(line, comm_error=looks_like_comm_error(exc))  # exits
        if looks_like_comm_error(exc):
            time.sleep(min(2.0, wd.timeout))  # the side channel names the lost rank first
        wd._exit(line)
        time.sleep(5)  # another verdict is ending the process
        os._exit(1)


def follow(dist, options, link: ServiceLink | None = None, kv_hooks=None) -> int:
    """A rank other than 0 of `serve --distributed`: run rank 0's engine commands until
    it shuts down (rank 0 alone serves HTTP). `kv_hooks`: this rank's side of the KV
    checkpoints (the server's `ReplicatedKV`: rank 0 decides, every rank restores)."""
    import signal

    from ssdmoe_tui.engine.run.service import EngineService

    if threading.current_thread() is threading.main_thread():
        # Ctrl-C reaches every process of the launch: rank 0 stops the server and then
        # sends Shutdown here; a follower that left first would look like a failure.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    service = EngineService(lambda _event: None, options=options, kv_hooks=kv_hooks)
    (link or ServiceLink(dist)).attach(service)
    service.start()
    service.shutdown(timeout=threading.TIMEOUT_MAX)  # returns once rank 0 sent Shutdown
    return 0


def agreed_kv_hooks(dist, hooks, saves: bool):
    """KV hooks for a rank of the distributed chat app: every rank restores the same
    prompt prefix from disk, or none does (the ranks compute each token together).

    Each rank loads through its own `hooks` (the app's conversation folders: a rank on
    rank 0's machine finds rank 0's checkpoints, a rank on another machine usually
    none), then the ranks compare the tokens restored; unless all restored the same
    number, none uses its checkpoint and all prefill. `saves`: this rank writes
    checkpoints (rank 0; the others would only write a second copy of the same values).
    A load error counts as nothing restored: it never skips the comparison."""
    from ssdmoe_tui.engine.run.service import KVHooks

    def load(session_id, tokens, info):
        got = None
        try:
            got = hooks.load(session_id, tokens, info) if hooks.load is not None else None
        except Exception:  # noqa: BLE001 - nothing restored here: every rank prefills
            got = None
        counts = dist.gather_json(int(got[1]) if got is not None else 0)
        if counts[0] > 0 and all(n == counts[0] for n in counts):
            return got
        return None

    def covers(session_id, tokens, info):
        try:
            n = int(hooks.covers(session_id, tokens, info))
        except Exception:  # noqa: BLE001 - nothing on disk here: memory serves
            n = 0
        return min(dist.gather_json(n))  # the same answer on every rank

    return KVHooks(save=hooks.save if saves else None, load=load,
                   covers=covers if hooks.covers is not None else None)  # fmt: skip

"""Expert-parallel streaming over MLX's own distributed layer (`mx.distributed`).

Started the MLX way, e.g. `mlx.launch -n 2 --backend ring ssdmoe generate --distributed ...`
(or `--hostfile hosts.json` for several machines). Every rank loads the resident
(non-expert) weights and runs the same attention and routers. Each MoE layer's experts
are split across the ranks by a fixed, balanced map (`ExpertMap`); a rank reads, caches
and computes only the routed experts it owns (`DistributedSwitch`), and one `all_sum`
per MoE layer combines the outputs.

What is summed is the block's expert outputs, one row per (token, chosen expert), before
mlx-lm's own code weights and adds them: every row comes from exactly one rank and the
others contribute exact zeros, so the sum is exact in any dtype and every rank ends the
layer with bit-for-bit the values one process computes. Greedy tokens therefore equal
the single-process engine's (tested), at the price of K rows per token on the link
instead of one (docs/distributed.md has the numbers).

Only rank 0 samples: the sampled token goes to every rank through one more `all_sum`
(the others add zeros), and decisions that come from outside the computation (stop
requests) are agreed the same way (`agree`), so every rank runs the same steps.

Collectives block, so a lost rank would hang the others: a side channel (`Watchdog`,
one TCP connection from each rank to rank 0, heartbeats both ways) turns a rank that
exits, crashes, hangs or reports an error into one line naming the rank and the cause,
printed once, and an exit on every rank within a bounded time.
"""

from __future__ import annotations

import contextlib
import json
import socket
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import mlx.core as mx
import numpy as np

from ssdmoe_tui.engine.distributed import exit_status
from ssdmoe_tui.engine.distributed.expert_map import ExpertMap
from ssdmoe_tui.engine.distributed.failure import DistributedError, looks_like_comm_error
from ssdmoe_tui.engine.distributed.watchdog import Watchdog, timeout_s
from ssdmoe_tui.errors import user_message


@dataclass
class CommCounters:
    """Time spent in the per-layer `all_sum` (transfer plus waiting for the slower rank)."""

    all_sum_s: float = 0.0
    all_sum_calls: int = 0
    all_sum_bytes: int = 0  # payload bytes this rank contributed
    expert_compute_s: float = 0.0  # evaluating this rank's share of the experts


# ---------------------------------------------------------------- the group


class Distributed:
    """This process's place in the launch: rank, size, collectives, counters."""

    def __init__(self, group, watchdog: Watchdog | None = None) -> None:
        self.group = group
        self.rank = int(group.rank())
        self.size = int(group.size())
        self.watchdog = watchdog
        self.counters = CommCounters()
        self._hosts: list[str] | None = None
        self.exit_code = 0  # what the command returned (the guard records it)

    @property
    def is_root(self) -> bool:
        return self.rank == 0

    # -------------------------------------------------------- collectives
    def all_sum(self, x: mx.array) -> mx.array:
        return mx.distributed.all_sum(x, group=self.group)

    def combine(self, partial: mx.array) -> mx.array:
        """The per-layer `all_sum`, timed apart from this rank's expert compute."""
        if self.size == 1:
            return partial
        c = self.counters
        t0 = time.perf_counter()
        mx.eval(partial)
        t1 = time.perf_counter()
        out = self.all_sum(partial)
        mx.eval(out)
        t2 = time.perf_counter()
        c.expert_compute_s += t1 - t0
        c.all_sum_s += t2 - t1
        c.all_sum_calls += 1
        c.all_sum_bytes += int(partial.nbytes)
        return out

    def wrap_sampler(self, sampler: Callable[[mx.array], mx.array]) -> Callable:
        """Rank 0 samples; its token reaches every rank through one `all_sum`."""
        if self.size == 1:
            return sampler

        def sample(logprobs: mx.array) -> mx.array:
            tok = sampler(logprobs)
            return self.all_sum(tok if self.is_root else mx.zeros_like(tok))

        return sample

    def agree(self, value: int) -> int:
        """Rank 0's integer, on every rank (the others' argument is ignored)."""
        if self.size == 1:
            return int(value)
        x = mx.array([int(value) if self.is_root else 0], dtype=mx.int32)
        return int(self.all_sum(x).item())

    def should_stop(self, local: Callable[[], bool]) -> Callable[[], bool]:
        """A stop test every rank answers the same way: rank 0 asks `local`."""
        if self.size == 1:
            return local
        return lambda: bool(self.agree(int(local()) if self.is_root else 0))

    def _exchange(self, payload: bytes, everyone: bool) -> list[bytes]:
        n = self.size
        mine = payload if (everyone or self.is_root) else b""
        lens = np.zeros(n, dtype=np.int32)
        lens[self.rank] = len(mine)
        lens = np.array(self.all_sum(mx.array(lens)))
        width = max(int(lens.max()), 1)
        buf = np.zeros((n, width), dtype=np.uint8)
        buf[self.rank, : len(mine)] = np.frombuffer(mine, dtype=np.uint8)
        out = np.array(self.all_sum(mx.array(buf)))
        return [out[i, : int(lens[i])].tobytes() for i in range(n)]

    def broadcast_json(self, obj=None):
        """Rank 0's JSON-able object, on every rank."""
        if self.size == 1:
            return obj
        data = json.dumps(obj).encode() if self.is_root else b""
        return json.loads(self._exchange(data, everyone=False)[0])

    def gather_json(self, obj) -> list:
        """Every rank's JSON-able object, in rank order, on every rank."""
        if self.size == 1:
            return [obj]
        return [json.loads(b) for b in self._exchange(json.dumps(obj).encode(), everyone=True)]

    def all_sum_latency_s(self, nbytes: int, repeats: int = 20) -> float:
        """Median seconds of one `all_sum` of `nbytes` (the link alone, no compute)."""
        if self.size == 1:
            return 0.0
        x = mx.zeros((max(nbytes // 4, 1),), dtype=mx.float32)
        mx.eval(self.all_sum(x))  # warm the connection
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            mx.eval(self.all_sum(x))
            times.append(time.perf_counter() - t0)
        return float(np.median(times))

    def hosts(self) -> list[str]:
        """Every rank's host name. A collective the first time (`start` calls it on every
        rank), then cached."""
        if self._hosts is None:
            self._hosts = self.gather_json(socket.gethostname())
        return self._hosts

    def first_on_host(self) -> bool:
        """Whether no lower rank runs on this machine (it takes machine-wide locks)."""
        hosts = self.hosts()
        return hosts.index(hosts[self.rank]) == self.rank

    def ranks_on_host(self) -> int:
        """Ranks sharing this machine's memory (an `auto` expert cache is split among them)."""
        hosts = self.hosts()
        return hosts.count(hosts[self.rank])

    # -------------------------------------------------------- the engine hook
    def partition(self, index):
        """What the loader needs to build this rank's share (a `switch.Partition`)."""
        from ssdmoe_tui.engine.distributed.switch import Partition

        return Partition(ExpertMap(self.size, index.num_layers, index.num_experts), self)

    def meter(self, sm):
        """Counters for one run's figures (a `stats.DecodeMeter`)."""
        from ssdmoe_tui.engine.distributed.stats import DecodeMeter

        return DecodeMeter(self, sm)

    def run_stats(self, sm, meter, steps: int, probe: bool = True) -> dict:
        """Every rank's numbers, summed and per rank (a collective: call on every rank)."""
        from ssdmoe_tui.engine.distributed.stats import (
            decode_payload_bytes as _decode_payload_bytes,
        )
        from ssdmoe_tui.engine.distributed.stats import rank_stats, summarize

        latency = self.all_sum_latency_s(_decode_payload_bytes(sm)) if probe else None
        per_rank = self.gather_json(rank_stats(self, sm, meter.window()))
        return summarize(per_rank, steps, self.partition(sm.index).map, latency)

    # -------------------------------------------------------- failures
    @contextlib.contextmanager
    def guard(self) -> Iterator[Distributed]:
        """Run a command's work; an error on any rank ends every rank with one line.

        On rank 0 the error propagates (the CLI prints it, prefixed with the rank) after
        the other ranks were told to stop. On another rank it goes to rank 0, which
        prints it; this rank then exits without printing."""
        wd = self.watchdog
        try:
            yield self
        except BaseException as e:
            stop = isinstance(e, KeyboardInterrupt | SystemExit)
            if stop and (wd is None or self.is_root):
                if wd is not None:
                    wd.finish()  # rank 0 was stopped on purpose: a clean end
                self._record(130 if isinstance(e, KeyboardInterrupt) else _exit_code(e))
                raise
            msg = f"rank {self.rank}: " + ("interrupted" if stop else user_message(e))
            if wd is None:
                self._record(1)
                raise DistributedError(msg) from e
            wd.local_failure(msg, comm_error=looks_like_comm_error(e))
            self._record(1)
            raise DistributedError(msg) from e  # rank 0 only: the others exited above
        else:
            if wd is not None:
                wd.finish()
            self._record(self.exit_code)

    def _record(self, status: int) -> None:
        """This rank's exit status, for `ssdmoe launch` (exit_status.py)."""
        if self.watchdog is not None:
            self.watchdog.record(status)
        else:
            exit_status.write(self.rank, status)


def _exit_code(e: BaseException) -> int:
    code = getattr(e, "code", 0)
    return code if isinstance(code, int) else 1


def start(backend: str = "any", *, sigterm: bool = True) -> Distributed:
    """Join the launch (`mlx.launch` sets it up) and start the side channel.

    Outside a launch MLX gives a group of one: the engine then runs as one process,
    and a notice says so. `sigterm=False`: leave SIGTERM to the caller (a server that
    shuts down gracefully on it)."""
    try:
        group = mx.distributed.init(strict=False, backend=backend)
    except RuntimeError as e:
        raise DistributedError(f"cannot join the distributed launch ({e})") from None
    dist = Distributed(group)
    if dist.size > 1:
        wd = Watchdog(dist.rank, dist.size, timeout_s())
        wd.connect(dist, sigterm=sigterm)
        dist.watchdog = wd
        dist.hosts()
    else:
        print(
            "ssdmoe: note: --distributed but this process is alone (start it with "
            "`mlx.launch -n 2 --backend ring ssdmoe ...`); running on one rank",
            file=sys.stderr,
            flush=True,
        )
    return dist

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
import os
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import mlx.core as mx
import numpy as np

from ssdmoe_tui.engine.options import parse_seconds
from ssdmoe_tui.engine.streamed import StreamedSwitch
from ssdmoe_tui.errors import BadValueError, SsdmoeError, user_message

ENV_TIMEOUT = "SSDMOE_DIST_TIMEOUT"  # seconds without a heartbeat before a rank counts as hung
ENV_CONTROL = "SSDMOE_DIST_CONTROL"  # host[:port] of rank 0's side channel (default: from launch)
DEFAULT_TIMEOUT_S = 30.0
HEARTBEAT_S = 1.0
CONNECT_TIMEOUT_S = 60.0  # ranks reach the side channel within this of each other


class DistributedError(SsdmoeError):
    """A rank failed; the message names it."""


# ---------------------------------------------------------------- the expert map


@dataclass(frozen=True)
class ExpertMap:
    """owner(layer, expert) = (layer + expert) mod ranks.

    Balanced (per layer the ranks' shares differ by at most one expert, and the offset
    by layer spreads the remainders), deterministic, and needs no communication."""

    ranks: int
    num_layers: int
    num_experts: int

    def owner(self, layer: int, expert: int) -> int:
        return (layer + expert) % self.ranks

    def owned_mask(self, layer: int, rank: int) -> np.ndarray:
        return (np.arange(self.num_experts) + layer) % self.ranks == rank

    def owned_count(self, rank: int) -> int:
        return int(sum(self.owned_mask(layer, rank).sum() for layer in range(self.num_layers)))

    def as_dict(self) -> dict:
        total = self.num_layers * self.num_experts
        owned = [self.owned_count(r) for r in range(self.ranks)]
        return {
            "rule": "owner(layer, expert) = (layer + expert) mod ranks",
            "ranks": self.ranks,
            "owned_experts": owned,
            "owned_fraction": [round(n / total, 4) for n in owned],
        }


# ---------------------------------------------------------------- counters


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
    def partition(self, index) -> Partition:
        return Partition(ExpertMap(self.size, index.num_layers, index.num_experts), self)

    def meter(self, sm) -> DecodeMeter:
        return DecodeMeter(self, sm)

    def run_stats(self, sm, meter: DecodeMeter, steps: int, probe: bool = True) -> dict:
        """Every rank's numbers, summed and per rank (a collective: call on every rank)."""
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
        try:
            yield self
        except BaseException as e:
            stop = isinstance(e, KeyboardInterrupt | SystemExit)
            if stop and (self.watchdog is None or self.is_root):
                if self.watchdog is not None:
                    self.watchdog.finish()  # rank 0 was stopped on purpose: a clean end
                raise
            msg = f"rank {self.rank}: " + ("interrupted" if stop else user_message(e))
            if self.watchdog is None:
                raise DistributedError(msg) from e
            self.watchdog.local_failure(msg, comm_error=_looks_like_comm_error(e))
            raise DistributedError(msg) from e  # rank 0 only: the others exited above
        else:
            if self.watchdog is not None:
                self.watchdog.finish()


def _looks_like_comm_error(e: BaseException) -> bool:
    text = str(e).lower()
    return isinstance(e, RuntimeError) and any(
        w in text for w in ("[ring]", "[nccl]", "[mpi]", "peer", "connection", "socket")
    )


# ---------------------------------------------------------------- the switch


@dataclass
class Partition:
    """What the loader needs to build a rank's share of the experts."""

    map: ExpertMap
    dist: Distributed

    @property
    def owned_slots(self) -> int:
        """Cache slots beyond this are never used: the rank owns no more experts."""
        return self.map.owned_count(self.dist.rank)

    def make_switch(self, layer, cache, kind, activation, quant, times) -> DistributedSwitch:
        return DistributedSwitch(
            layer, cache, kind, activation, quant, times,
            owned=self.map.owned_mask(layer, self.dist.rank), dist=self.dist,
        )  # fmt: skip


class DistributedSwitch(StreamedSwitch):
    """A `StreamedSwitch` that computes only this rank's rows and sums over the ranks.

    Same inputs and output as mlx-lm's `SwitchGLU`: (..., K, D) expert outputs. Rows
    whose expert another rank owns are zeros here, so the `all_sum` restores every row
    exactly. Each row is computed with the same `gather_qmm` call shape as one process
    uses for a single token, so the values are the same bits."""

    def __init__(self, layer, cache, kind, activation, quant, times, *, owned, dist) -> None:
        super().__init__(layer, cache, kind, activation, quant, times)
        object.__setattr__(self, "_owned", np.asarray(owned, dtype=bool))
        object.__setattr__(self, "_dist", dist)
        out_name = "down_proj.weight" if kind == "glu" else "fc2.weight"
        object.__setattr__(self, "_out_dims", int(cache.banks[0][out_name].shape[1]))

    def set_predictor(self, predict) -> None:  # prefetch is not used in distributed mode
        pass

    def __call__(self, x: mx.array, indices: mx.array) -> mx.array:
        times = self._times
        t0 = time.perf_counter()
        mass = self._mass.kept(self._layer, indices) if self._mass is not None else None
        if mass is not None:
            mx.eval(indices, mass)  # the router mass (routing_mass.py) in the same sync
        host = np.array(indices, copy=False)  # the layer's one host sync, as in one process
        times.router_sync_s += time.perf_counter() - t0
        times.calls += 1
        times.last_k = int(host.shape[-1])
        partial = self._owned_rows(mx.expand_dims(x, (-2, -3)), host)
        return self._dist.combine(partial)

    def _owned_rows(self, x: mx.array, host: np.ndarray) -> mx.array:
        cache = self._cache
        k = host.shape[-1]
        flat = host.reshape(-1)
        rows = np.nonzero(self._owned[flat])[0]
        if rows.size == 0:
            return mx.zeros((*host.shape, self._out_dims), dtype=x.dtype)
        uniq = np.unique(flat[rows])
        xf = x.reshape(-1, 1, 1, x.shape[-1])  # one row per token
        cap = cache.capacity
        groups = [uniq[i : i + cap] for i in range(0, len(uniq), cap)]
        if len(groups) > 1:
            self._times.grouped_calls += 1
        pieces, order = [], []
        for group in groups:
            r = rows if len(groups) == 1 else rows[np.isin(flat[rows], group)]
            slots = cache.ensure(self._layer, group)
            lut = np.zeros(self._num_experts, dtype=np.int64)
            lut[group] = slots
            y = self._run_slots(xf[mx.array(r // k)], lut[flat[r]].reshape(-1, 1))  # (P, 1, D)
            if len(groups) > 1:
                mx.eval(y)  # before the next group may reuse these slots
            pieces.append(y.reshape(len(r), -1))
            order.append(r)
        where = np.zeros(flat.size, dtype=np.int32)
        where[np.concatenate(order)] = np.arange(1, rows.size + 1, dtype=np.int32)
        table = mx.concatenate([mx.zeros((1, self._out_dims), dtype=pieces[0].dtype), *pieces])
        return table[mx.array(where)].reshape(*host.shape, self._out_dims)


# ---------------------------------------------------------------- the side channel


def _timeout_s() -> float:
    text = os.environ.get(ENV_TIMEOUT)
    if not text:
        return DEFAULT_TIMEOUT_S
    try:
        return parse_seconds(text, ENV_TIMEOUT)
    except BadValueError as e:
        raise DistributedError(str(e)) from None


def _root_host() -> str:
    """Rank 0's address as the launch describes it (ring hostfile, NCCL), else its name."""
    hostfile = os.environ.get("MLX_HOSTFILE")
    if hostfile:
        try:
            with open(hostfile) as f:
                hosts = json.load(f)
            first = hosts[0][0] if isinstance(hosts[0], list) else hosts[0]
            return str(first).rsplit(":", 1)[0]
        except (OSError, ValueError, IndexError, KeyError, TypeError):
            pass
    if os.environ.get("NCCL_HOST_IP"):
        return os.environ["NCCL_HOST_IP"]
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"


@dataclass
class _Peer:
    rank: int
    sock: socket.socket
    done: bool = False  # said BYE: its end of the connection is expected
    lock: threading.Lock = field(default_factory=threading.Lock)

    def send(self, line: str) -> bool:
        try:
            with self.lock:
                self.sock.sendall((line + "\n").encode())
            return True
        except OSError:
            return False


class Watchdog:
    """Star of TCP connections to rank 0, heartbeats both ways.

    rank 0 sees a follower's error (`ERR`), its end (EOF without `BYE`) or its silence
    (no heartbeat for `timeout` s); a follower sees the same of rank 0. The first
    verdict prints one line (on rank 0; on a follower only when rank 0 is the one lost)
    and exits the process with status 1 from this thread, even while the main thread
    is blocked in a collective."""

    def __init__(self, rank: int, size: int, timeout: float) -> None:
        self.rank = rank
        self.size = size
        self.timeout = timeout
        self.peers: list[_Peer] = []
        self._stopping = threading.Event()
        self._verdict = threading.Lock()
        self._failing = False
        self._finished = False
        self._root_gone = threading.Event()  # a follower's connection to rank 0 ended

    # -------------------------------------------------------- setup
    def connect(self, dist: Distributed, sigterm: bool = True) -> None:
        if self.rank == 0:
            override = os.environ.get(ENV_CONTROL, "")
            host, _, port = override.partition(":")
            srv = socket.create_server(("", int(port) if port else 0))
            srv.settimeout(CONNECT_TIMEOUT_S)
            addr = [host or _root_host(), srv.getsockname()[1]]
        else:
            srv = None
            addr = None
        addr = dist.broadcast_json(addr)
        if srv is not None:
            try:
                for _ in range(self.size - 1):
                    conn, _ = srv.accept()
                    conn.settimeout(self.timeout)
                    rank = int(_readline(conn).split()[1])  # "HELLO <rank>"
                    self.peers.append(_Peer(rank, conn))
            except (OSError, ValueError, IndexError) as e:
                raise DistributedError(
                    f"rank 0: not every rank reached the side channel on port {addr[1]} ({e})"
                ) from None
            finally:
                srv.close()
        else:
            try:
                conn = socket.create_connection((addr[0], addr[1]), timeout=CONNECT_TIMEOUT_S)
            except OSError as e:
                raise DistributedError(
                    f"rank {self.rank}: cannot reach rank 0's side channel at "
                    f"{addr[0]}:{addr[1]} ({e}); set {ENV_CONTROL}=host to rank 0's address"
                ) from None
            conn.settimeout(self.timeout)
            self.peers.append(_Peer(0, conn))
            self.peers[0].send(f"HELLO {self.rank}")
        for p in self.peers:
            threading.Thread(target=self._listen, args=(p,), daemon=True, name="ssdmoe-dist-watch").start()  # fmt: skip
        threading.Thread(target=self._beat, daemon=True, name="ssdmoe-dist-beat").start()
        if sigterm:
            self._watch_sigterm()

    def _watch_sigterm(self) -> None:
        """`mlx.launch` sends SIGTERM to the other ranks as soon as one exits with an
        error, often before this rank's side channel has seen why. So SIGTERM is handled
        on a thread (through the signal wakeup fd, which works while the main thread is
        blocked in a collective): give the side channel a moment to name the lost rank,
        then exit without a line of our own."""
        import signal

        if threading.current_thread() is not threading.main_thread():
            return
        r, w = socket.socketpair()
        w.setblocking(False)
        try:
            signal.set_wakeup_fd(w.fileno(), warn_on_full_buffer=False)
            signal.signal(signal.SIGTERM, lambda *_: None)
        except (ValueError, OSError):
            return

        def wait() -> None:
            while True:
                data = r.recv(64)
                if not data:
                    return
                if signal.SIGTERM in data:
                    time.sleep(1.0)  # a verdict from the side channel exits first
                    if self.rank == 0:
                        for p in self.peers:
                            p.send("ERR stopped")
                    os._exit(128 + signal.SIGTERM)

        threading.Thread(target=wait, daemon=True, name="ssdmoe-dist-sigterm").start()

    def _beat(self) -> None:
        while not self._stopping.wait(HEARTBEAT_S):
            for p in self.peers:
                p.send("HB")

    def _listen(self, p: _Peer) -> None:
        buf = b""
        sock = p.sock
        while True:
            try:
                chunk = sock.recv(4096)
            except TimeoutError:
                if self._stopping.is_set() or p.done:
                    return
                self._lost(
                    p.rank,
                    f"rank {p.rank} sent no heartbeat for {self.timeout:g} s "
                    "(hung, or its host or the link is down)",
                )
                return
            except OSError:
                chunk = b""
            if not chunk:
                self._root_gone.set()
                if not (p.done or self._stopping.is_set()):
                    self._lost(
                        p.rank,
                        f"rank {p.rank} exited unexpectedly (its process ended without "
                        "reporting an error: killed, crashed or out of memory)",
                    )
                return
            buf += chunk
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                text = line.decode(errors="replace")
                if text == "BYE":
                    p.done = True
                elif text.startswith("ERR "):
                    self._root_gone.set()
                    self._remote_error(p.rank, text[4:])
                    return

    # -------------------------------------------------------- verdicts
    def _exit(self, line: str | None) -> None:
        """Print `line` (if any) once, tell the others, and end this process."""
        if not self._verdict.acquire(blocking=False):
            return  # another verdict is already ending the process
        self._failing = True
        if self.rank == 0:
            for p in self.peers:
                p.send(f"ERR {line or 'stopped'}")
        if line:
            print(f"ssdmoe: error: {line}", file=sys.stderr, flush=True)
        with contextlib.suppress(Exception):
            sys.stdout.flush()
        os._exit(1)

    def _lost(self, rank: int, line: str) -> None:
        if self._finished and self.rank != 0:
            return
        # A follower stays silent when rank 0 is alive to say it; rank 0 always speaks.
        self._exit(line)

    def _remote_error(self, rank: int, line: str) -> None:
        if line == "stopped":
            self._exit(None)  # rank 0 was stopped from outside: nothing failed
        elif self.rank == 0:
            self._exit(line)  # a follower's own error, named by it
        else:
            self._exit(None)  # rank 0 printed the line

    def local_failure(self, line: str, comm_error: bool = False) -> None:
        """The main thread failed with `line`. A collective that failed because a peer
        went away waits briefly so the side channel's verdict (naming the lost rank)
        comes first. rank 0 returns (its caller raises the error, the CLI prints it);
        another rank reports to rank 0 and exits."""
        if comm_error:
            time.sleep(min(2.0, self.timeout))
        if self.rank == 0:
            if not self._verdict.acquire(blocking=False):
                time.sleep(5)  # the watchdog is already exiting the process
                return
            self._failing = True
            for p in self.peers:
                p.send(f"ERR {line}")
            return
        if not self._verdict.acquire(blocking=False):
            time.sleep(5)
            return
        self._failing = True
        self.peers[0].send(f"ERR {line}")
        # rank 0 prints it and exits; if it does not within a few seconds, say it here.
        if not self._root_gone.wait(5.0):
            print(f"ssdmoe: error: {line}", file=sys.stderr, flush=True)
        with contextlib.suppress(Exception):
            sys.stdout.flush()
        os._exit(1)

    def finish(self) -> None:
        """A clean end: tell the others, stop beating."""
        if self._finished:
            return
        self._finished = True
        for p in self.peers:
            p.send("BYE")
        self._stopping.set()


def _readline(sock: socket.socket) -> str:
    buf = b""
    while not buf.endswith(b"\n"):
        chunk = sock.recv(1)
        if not chunk:
            raise OSError("connection closed during the handshake")
        buf += chunk
    return buf.decode().strip()


# ---------------------------------------------------------------- start


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
        wd = Watchdog(dist.rank, dist.size, _timeout_s())
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


# ---------------------------------------------------------------- stats


class DecodeMeter:
    """Counters at the start, at the first token (end of prefill) and now."""

    def __init__(self, dist: Distributed, sm) -> None:
        self.dist, self.sm = dist, sm
        self._start = self._read()
        self._first: dict | None = None

    def _read(self) -> dict:
        from ssdmoe_tui.engine import iostats

        c, d = self.sm.cache.counters, self.dist.counters
        return {
            "hits": c.hits,
            "misses": c.misses,
            "requested_bytes": c.bytes_read,
            "device_bytes": iostats.device_read_bytes(),
            "read_s": c.read_s,
            "all_sum_s": d.all_sum_s,
            "all_sum_calls": d.all_sum_calls,
            "expert_compute_s": d.expert_compute_s,
        }

    def on_token(self, generated: int) -> None:
        if generated == 1:
            self._first = self._read()

    def window(self) -> dict:
        """decode_*: from the first token on; the rest: the whole run."""
        end = self._read()
        first = self._first or end

        def diff(a: dict, b: dict, key: str):
            if a[key] is None or b[key] is None:
                return None
            v = b[key] - a[key]
            return round(v, 6) if isinstance(v, float) else v

        out = {f"decode_{k}": diff(first, end, k) for k in end}
        out.update({k: diff(self._start, end, k) for k in end})
        return out


def _decode_payload_bytes(sm) -> int:
    """One decode step's per-layer all_sum: K rows of the hidden size."""
    c = sm.cache.banks[0]
    name = "down_proj.weight" if "down_proj.weight" in c else "fc2.weight"
    return int(c[name].shape[1]) * max(sm.times.last_k, 1) * sm.dtype.size


def rank_stats(dist: Distributed, sm, window: dict | None = None) -> dict:
    """This rank's numbers for the run's stats (bytes, hits, all_sum time, owned share)."""
    m = dist.partition(sm.index).map
    c = dist.counters
    out = {
        "rank": dist.rank,
        "owned_experts": m.owned_count(dist.rank),
        "owned_fraction": round(m.owned_count(dist.rank) / (m.num_layers * m.num_experts), 4),
        "expert_cache_slots": sm.cache.capacity,
        "expert_cache_budget_bytes": sm.cache.budget_bytes,
        "all_sum_s": round(c.all_sum_s, 6),
        "all_sum_calls": c.all_sum_calls,
        "all_sum_bytes": c.all_sum_bytes,
        "expert_compute_s": round(c.expert_compute_s, 6),
    }
    if window:
        out.update(window)
    return out


def summarize(per_rank: list[dict], steps: int, emap: ExpertMap, latency_s: float | None) -> dict:
    """Per-rank and total numbers for bench JSON / `generate --json`."""
    steps = max(steps, 1)

    def total(key: str):
        vals = [r.get(key) for r in per_rank]
        return None if any(v is None for v in vals) else sum(vals)

    hits, misses = total("decode_hits") or 0, total("decode_misses") or 0
    out = {
        "ranks": len(per_rank),
        "expert_map": emap.as_dict(),
        "per_rank": per_rank,
        "total_requested_mib_per_token": _mib(total("decode_requested_bytes"), steps),
        "total_device_mib_per_token": _mib(total("decode_device_bytes"), steps),
        "hit_rate": round(hits / (hits + misses), 4) if hits + misses else None,
        "all_sum_ms_per_token": round(
            max(r.get("decode_all_sum_s", 0.0) for r in per_rank) * 1e3 / steps, 4
        ),
        "all_sum_calls_per_token": round(
            max(r.get("decode_all_sum_calls", 0) for r in per_rank) / steps, 2
        ),
        "all_sum_latency_us": None if latency_s is None else round(latency_s * 1e6, 1),
        "note": "all_sum time = transfer + waiting for the slower rank; "
        "all_sum_latency_us = one decode-sized all_sum alone (median)",
    }
    for r in per_rank:
        r["requested_mib_per_token"] = _mib(r.get("decode_requested_bytes"), steps)
        r["device_mib_per_token"] = _mib(r.get("decode_device_bytes"), steps)
        h, mi = r.get("decode_hits", 0), r.get("decode_misses", 0)
        r["hit_rate"] = round(h / (h + mi), 4) if h + mi else None
        r["all_sum_ms_per_token"] = round(r.get("decode_all_sum_s", 0.0) * 1e3 / steps, 4)
    return out


def _mib(b, steps: int):
    return None if b is None else round(b / steps / 2**20, 4)


def summary_line(s: dict) -> str:
    """One line for the terminal: per-rank MiB/token and hit rate, the all_sum cost."""
    ranks = " | ".join(
        f"rank {r['rank']}: {r['owned_fraction']:.0%} of experts, "
        f"{r['requested_mib_per_token'] or 0:.2f} MiB/tok, hit {r['hit_rate'] or 0:.1%}"
        for r in s["per_rank"]
    )
    lat = s.get("all_sum_latency_us")
    return (
        f"[{s['ranks']} ranks | {ranks} | total {s['total_requested_mib_per_token'] or 0:.2f} "
        f"MiB/tok | all_sum {s['all_sum_ms_per_token']:.2f} ms/tok"
        + (f", {lat:.0f} us each alone" if lat is not None else "")
        + "]"
    )


def check_args(args) -> None:
    """Options that do not combine with --distributed, as one line before anything starts."""
    from ssdmoe_tui.errors import BadValueError

    for name, flag in (
        ("prefetch", "--prefetch"),
        ("trace", "--trace"),
        ("routing_trace", "--routing-trace"),
    ):
        value = getattr(args, name, None)
        if value not in (None, False, "off"):
            raise BadValueError(f"{flag} does not combine with --distributed")


# ---------------------------------------------------------------- the engine service


def _encode_command(cmd) -> dict:
    from dataclasses import asdict

    return {"type": type(cmd).__name__, "fields": asdict(cmd)}


def _decode_command(data: dict):
    from ssdmoe_tui.engine import protocol as P

    cls = {c.__name__: c for c in (P.LoadModel, P.Generate, P.SetExpertCache, P.Shutdown)}.get(
        data["type"]
    )
    if cls is None:
        raise DistributedError(f"rank 0 sent an unknown engine command {data['type']!r}")
    fields = dict(data["fields"])
    if cls is P.Generate:
        fields["messages"] = tuple(P.Message(**m) for m in fields.get("messages") or ())
        if fields.get("prompt_tokens") is not None:
            fields["prompt_tokens"] = tuple(fields["prompt_tokens"])
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

    def __init__(self, dist: Distributed) -> None:
        self.dist = dist
        self._pending_k: int | None = None
        self.lock_here = dist.first_on_host()  # takes the machine-wide model lock

    def attach(self, service) -> None:
        service.link = self
        service.use_model_lock = self.lock_here

    def service_factory(self, options):
        """rank 0: `make(post)` for the server, an EngineService linked to the others."""

        def make(post):
            from ssdmoe_tui.engine.service import EngineService

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
            print(f"ssdmoe: error: {line}", file=sys.stderr, flush=True)
            os._exit(1)
        if not self.dist.is_root:
            wd.local_failure(line, comm_error=_looks_like_comm_error(exc))  # exits
        if _looks_like_comm_error(exc):
            time.sleep(min(2.0, wd.timeout))  # the side channel names the lost rank first
        wd._exit(line)
        time.sleep(5)  # another verdict is ending the process
        os._exit(1)


def follow(dist: Distributed, options, link: ServiceLink | None = None) -> int:
    """A rank other than 0 of `serve --distributed`: run rank 0's engine commands until
    it shuts down (rank 0 alone serves HTTP)."""
    import signal

    from ssdmoe_tui.engine.service import EngineService

    if threading.current_thread() is threading.main_thread():
        # Ctrl-C reaches every process of the launch: rank 0 stops the server and then
        # sends Shutdown here; a follower that left first would look like a failure.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    service = EngineService(lambda _event: None, options=options)
    (link or ServiceLink(dist)).attach(service)
    service.start()
    service.shutdown(timeout=threading.TIMEOUT_MAX)  # returns once rank 0 sent Shutdown
    return 0

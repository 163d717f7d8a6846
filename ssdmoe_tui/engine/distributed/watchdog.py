"""The side channel: one TCP connection from each rank to rank 0, heartbeats both ways,
so a lost, crashed or hung rank becomes one line and an exit on every rank."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import sys
import threading
import time
from dataclasses import dataclass, field

from ssdmoe_tui.engine.distributed import exit_status
from ssdmoe_tui.engine.distributed.failure import DistributedError
from ssdmoe_tui.errors import BadValueError
from ssdmoe_tui.options import parse_seconds

ENV_TIMEOUT = "SSDMOE_DIST_TIMEOUT"  # seconds without a heartbeat before a rank counts as hung
ENV_CONTROL = "SSDMOE_DIST_CONTROL"  # host[:port] of rank 0's side channel (default: from launch)
DEFAULT_TIMEOUT_S = 30.0
HEARTBEAT_S = 1.0
CONNECT_TIMEOUT_S = 60.0  # ranks reach the side channel within this of each other
FINISH_WAIT_S = 10.0  # rank 0 waits this long at a clean end for the others' BYE


def timeout_s() -> float:
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
        self._finished = False
        self._root_gone = threading.Event()  # a follower's connection to rank 0 ended
        # rank 0: how each other rank ended, as the side channel told (0: said BYE;
        # 1: reported an error or vanished), for `ssdmoe launch`'s exit status
        self.outcomes: dict[int, int] = {}
        self._all_done = threading.Event()
        # called (once, on the watchdog's thread) before a verdict ends the process: the
        # chat app restores the terminal there
        self.before_exit = None

    # -------------------------------------------------------- setup
    def connect(self, dist, sigterm: bool = True) -> None:
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
                    self._before_exit()
                    self.record(exit_status.STOPPED)
                    os._exit(exit_status.STOPPED)

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
                if not p.done:
                    self._outcome(p.rank, 1)
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
                    self._outcome(p.rank, 0)
                elif text.startswith("ERR "):
                    self._root_gone.set()
                    self._outcome(p.rank, 1)
                    self._remote_error(p.rank, text[4:])
                    return

    # -------------------------------------------------------- exit status
    def _outcome(self, rank: int, status: int) -> None:
        if self.rank != 0:
            return
        self.outcomes.setdefault(rank, status)
        if len(self.outcomes) >= self.size - 1:
            self._all_done.set()

    def _before_exit(self) -> None:
        hook, self.before_exit = self.before_exit, None
        if hook is not None:
            with contextlib.suppress(Exception):
                hook()

    def record(self, status: int) -> None:
        """This rank's exit status for `ssdmoe launch` (rank 0 adds the others')."""
        exit_status.write(self.rank, status, dict(self.outcomes) if self.rank == 0 else None)

    # -------------------------------------------------------- verdicts
    def _exit(self, line: str | None, status: int = 1) -> None:
        """Print `line` (if any) once, tell the others, and end this process."""
        if not self._verdict.acquire(blocking=False):
            return  # another verdict is already ending the process
        if self.rank == 0:
            for p in self.peers:
                p.send(f"ERR {line or 'stopped'}")
        self._before_exit()
        if line:
            print(f"ssdmoe: error: {line}", file=sys.stderr, flush=True)
        with contextlib.suppress(Exception):
            sys.stdout.flush()
        self.record(status)
        os._exit(status)

    def _lost(self, rank: int, line: str) -> None:
        if self._finished and self.rank != 0:
            return
        # A follower stays silent when rank 0 is alive to say it; rank 0 always speaks.
        self._exit(line)

    def _remote_error(self, rank: int, line: str) -> None:
        if line == "stopped":
            self._exit(None, exit_status.STOPPED)  # rank 0 was stopped from outside
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
            for p in self.peers:
                p.send(f"ERR {line}")
            return
        if not self._verdict.acquire(blocking=False):
            time.sleep(5)
            return
        self.peers[0].send(f"ERR {line}")
        # rank 0 prints it and exits; if it does not within a few seconds, say it here.
        if not self._root_gone.wait(5.0):
            print(f"ssdmoe: error: {line}", file=sys.stderr, flush=True)
        with contextlib.suppress(Exception):
            sys.stdout.flush()
        status = 130 if line.endswith(": interrupted") else 1
        self.record(status)
        os._exit(status)

    def finish(self) -> None:
        """A clean end: tell the others, stop beating. Under `ssdmoe launch`, rank 0
        first waits (bounded) for every other rank's own end, so its status file can
        speak for ranks on other machines."""
        if self._finished:
            return
        self._finished = True
        for p in self.peers:
            p.send("BYE")
        if self.rank == 0 and self.size > 1 and exit_status.status_dir() is not None:
            self._all_done.wait(min(self.timeout, FINISH_WAIT_S))
        self._stopping.set()


def _readline(sock: socket.socket) -> str:
    buf = b""
    while not buf.endswith(b"\n"):
        chunk = sock.recv(1)
        if not chunk:
            raise OSError("connection closed during the handshake")
        buf += chunk
    return buf.decode().strip()

"""Loopback ports for tests that start more than one listener."""

from __future__ import annotations

import socket


def free_port(avoid: tuple[int, ...] = ()) -> int:
    """A port p with p and p+1 free (the ring backend takes one per rank), not near `avoid`."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            p = s.getsockname()[1]
        if p >= 65000 or any(abs(p - a) <= 1 for a in avoid):
            continue
        with socket.socket() as s2:
            try:
                s2.bind(("127.0.0.1", p + 1))
            except OSError:
                continue
        return p
    raise RuntimeError("no free port pair")

"""A rank's failure, as one line naming the rank."""

from __future__ import annotations

from ssdmoe_tui.errors import SsdmoeError


class DistributedError(SsdmoeError):
    """A rank failed; the message names it."""


def looks_like_comm_error(e: BaseException) -> bool:
    text = str(e).lower()
    return isinstance(e, RuntimeError) and any(
        w in text for w in ("[ring]", "[nccl]", "[mpi]", "peer", "connection", "socket")
    )

"""How numbers look on screen; one place so the panel, header and tests agree."""

from __future__ import annotations

from ssdmoe_tui.checkpoint.layout import mib_per_token
from ssdmoe_tui.units import human_bytes


def fmt_bytes(n: int | float | None) -> str:
    return "—" if n is None else human_bytes(n, digits=None)


def fmt_rate(tok_s: float | None) -> str:
    return "—" if tok_s is None else f"{tok_s:.1f} tok/s"


def fmt_mib(mib: float | None) -> str:
    return "—" if mib is None else f"{mib:.2f} MiB"


def fmt_pct(fraction: float | None) -> str:
    return "—" if fraction is None else f"{fraction * 100:.1f} %"


def fmt_count(n: int) -> str:
    return f"{n:,}"


# mib_per_token is re-exported: its one definition lives with the expert layout.
__all__ = ["fmt_bytes", "fmt_count", "fmt_mib", "fmt_pct", "fmt_rate", "mib_per_token"]

"""Byte counts as text: the one formatter, for one-line messages, CLI tables and the
app's panels (`ui/fmt.fmt_bytes`, which asks for live-number precision)."""

from __future__ import annotations


def human_bytes(n: float, digits: int | None = 1) -> str:
    """1536 -> "1.5 KiB"; whole bytes below 1 KiB; TiB at most.

    `digits=None` is the panels' precision: two decimals below 10 of a unit, else one,
    so a live number keeps about three significant figures as it grows."""
    unit = "TiB"
    for smaller in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024:
            unit = smaller
            break
        n /= 1024
    if unit == "B":
        return f"{n:.0f} B"
    if digits is None:
        digits = 2 if abs(n) < 10 else 1
    return f"{n:.{digits}f} {unit}"

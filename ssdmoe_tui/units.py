"""Byte counts as text for one-line messages and CLI tables (the app's panels use
ui/fmt.py, whose precision suits live numbers)."""

from __future__ import annotations


def human_bytes(n: float, digits: int = 1) -> str:
    """1536 -> "1.5 KiB"; whole bytes below 1 KiB; TiB at most."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.{digits}f} {unit}"
        n /= 1024
    return f"{n:.{digits}f} TiB"

"""Byte sizes as users write them ("512M", "4G", "1.5GiB"): parsed in one place, without
MLX, so the config and the app can check a value before the engine ever sees it."""

from __future__ import annotations


def parse_size(text: str | int) -> int:
    """'512M', '4G', '1.5GiB', '123456' -> bytes; ValueError (one line) otherwise."""
    if isinstance(text, int):
        return text
    t = str(text).strip().upper().removesuffix("IB").removesuffix("B")
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
    try:
        if t and t[-1] in mult:
            value = int(float(t[:-1]) * mult[t[-1]])
        else:
            value = int(float(t))
    except ValueError:
        raise ValueError(f"not a size: {text!r} (use e.g. 512M, 4G or auto)") from None
    if value < 0:
        raise ValueError(f"not a size: {text!r} (use e.g. 512M, 4G or auto)")
    return value


def check_cache_size(text: str) -> str:
    """An expert-cache budget: "auto" or a size; returned as given."""
    if str(text).strip().lower() != "auto":
        parse_size(text)
    return text

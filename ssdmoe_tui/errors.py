"""User-facing errors: every failure a user can cause becomes one line naming the culprit."""

from __future__ import annotations


class SsdmoeError(Exception):
    """Base for errors whose message is already fit for the user."""


class ModelError(SsdmoeError):
    """The model folder, a shard, a header or a tensor is missing or wrong."""


class UnsupportedModelError(ModelError):
    """The architecture or layout is not one the engine streams."""


class BadValueError(SsdmoeError, ValueError):
    """A user-supplied value (K, a size, ...) is out of range or malformed."""


# `pip install ssdmoe-tui` on Linux brings no MLX backend: the CPU and CUDA wheels both
# write mlx/lib/libmlx.so, so neither can be a default next to an extra for the other.
MLX_MISSING = (
    "MLX is not installed (or has no backend): on Linux pip install 'ssdmoe-tui[cpu]', "
    "or 'ssdmoe-tui[cuda]' for an NVIDIA GPU; on macOS pip install mlx"
)


def is_mlx_missing(exc: BaseException) -> bool:
    """MLX (not mlx-lm) could not be imported: absent, or its backend library is."""
    if not isinstance(exc, ImportError):
        return False
    name = exc.name or ""
    return name == "mlx" or name.startswith("mlx.") or "libmlx" in str(exc)


MESSAGE_LIMIT = 500
"""The longest one-line message a user is shown: room for a cache path and its copy hint.
Both ends keep to it: the server's `user_message` and the attached app's reading of an
error the server sent (chat/wire.py), so a message is not cut shorter on the way."""


def user_message(exc: BaseException) -> str:
    """One line for the user; never a traceback."""
    if isinstance(exc, SsdmoeError):
        text = str(exc)
    elif is_mlx_missing(exc):
        text = MLX_MISSING
    elif isinstance(exc, FileNotFoundError):
        text = f"file not found: {exc.filename or exc}"
    elif isinstance(exc, OSError) and exc.strerror:  # a read-only folder, no permission...
        where = f"{exc.filename}: " if exc.filename else ""
        also = f" (and {exc.filename2})" if getattr(exc, "filename2", None) else ""
        text = f"{where}{exc.strerror}{also}"
    elif isinstance(exc, MemoryError):
        text = "out of memory: lower the expert cache (--expert-cache) or K"
    else:
        text = f"{type(exc).__name__}: {exc}"
    return printable(" ".join(text.split()), MESSAGE_LIMIT)  # a name's ANSI escape is not sent raw


def printable(value: str, limit: int = 200) -> str:
    """`value` as a message may quote it: control characters (an ANSI escape in a file
    name, a newline) shown as escapes, never sent raw to a terminal; cut at `limit`."""
    out = "".join(c if c.isprintable() else ascii(c)[1:-1] for c in value)
    return out if len(out) <= limit else out[: limit - 3] + "..."

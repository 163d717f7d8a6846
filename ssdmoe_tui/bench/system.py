"""Machine conditions for `ssdmoe bench`: page-cache control, versions (the memory
limits are `ssdmoe_tui.memory`'s).

Every benchmark number is only as good as the conditions it records, so this module
says what it did (or could not do) instead of assuming: whether the page cache was
really dropped and which software measured.
"""

from __future__ import annotations

import datetime as _dt
import os
import platform
import sys
from dataclasses import dataclass
from pathlib import Path

from ssdmoe_tui.engine.experts.iostats import reset_peak_rss  # noqa: F401 - the bench's per-run reset


@dataclass(frozen=True)
class DropResult:
    """How the page cache was emptied: `method` is drop_caches, fadvise or none."""

    method: str
    note: str

    @property
    def cold(self) -> bool:
        return self.method != "none"


def drop_page_cache(files: list[Path]) -> DropResult:
    """`sync; echo 3 > /proc/sys/vm/drop_caches` as root on Linux.

    Without that right, `posix_fadvise(DONTNEED)` on `files` still evicts their clean
    pages (what the benchmark reads); where even that is impossible, say "none".
    """
    why = "not Linux"
    if sys.platform.startswith("linux"):
        os.sync()
        try:
            with open("/proc/sys/vm/drop_caches", "w") as f:
                f.write("3\n")
            return DropResult("drop_caches", "sync; echo 3 > /proc/sys/vm/drop_caches")
        except OSError as e:
            why = f"drop_caches refused ({e.strerror or e})"
    if hasattr(os, "posix_fadvise"):
        try:
            for p in files:
                fd = os.open(p, os.O_RDONLY)
                try:
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                finally:
                    os.close(fd)
            return DropResult("fadvise", f"{why}; posix_fadvise(DONTNEED) on the model's shards")
        except OSError as e:
            why = f"{why}; fadvise failed ({e.strerror or e})"
    return DropResult("none", f"could not drop the page cache: {why}; numbers are warm")


def read_through(files: list[Path], chunk: int = 64 << 20) -> int:
    """Read files sequentially once (to warm the page cache); returns bytes read."""
    total = 0
    buf = bytearray(chunk)
    view = memoryview(buf)
    for p in files:
        with open(p, "rb", buffering=0) as f:
            while n := f.readinto(view):
                total += n
    return total


def versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {"python": platform.python_version()}
    for dist, key in (("mlx", "mlx"), ("mlx-lm", "mlx_lm"), ("ssdmoe-tui", "ssdmoe")):
        try:
            out[key] = version(dist)
        except PackageNotFoundError:
            out[key] = "unknown"
    if out["ssdmoe"] == "unknown":  # running from a source tree that was not pip-installed
        out["ssdmoe"] = _source_version() or "unknown"
    try:
        import mlx.core as mx

        out["mlx"] = mx.__version__
    except (ImportError, AttributeError):
        pass
    return out


def source_state() -> dict[str, str | None]:
    """Which code measured: git HEAD (and whether the tree differs from it) when the
    package runs from a checkout, and a digest of the package's Python files always."""
    import hashlib
    import subprocess

    pkg = Path(__file__).resolve().parents[1]
    h = hashlib.sha256()
    for f in sorted(pkg.rglob("*.py")):
        h.update(f.relative_to(pkg).as_posix().encode())
        h.update(f.read_bytes())
    out: dict[str, str | None] = {"package_digest": h.hexdigest()[:16], "git_head": None}
    try:
        head = subprocess.run(
            ["git", "-C", str(pkg.parent), "rev-parse", "--short", "HEAD"],
            capture_output=True, text=True, timeout=10,
        )  # fmt: skip
        if head.returncode == 0:
            dirty = subprocess.run(
                ["git", "-C", str(pkg.parent), "status", "--porcelain", "--", "ssdmoe_tui"],
                capture_output=True, text=True, timeout=10,
            )  # fmt: skip
            out["git_head"] = head.stdout.strip() + (" (modified)" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        pass
    return out


def _source_version() -> str | None:
    import re

    pyproject = Path(__file__).resolve().parents[2] / "pyproject.toml"
    try:
        m = re.search(r'^version\s*=\s*"([^"]+)"', pyproject.read_text(), re.M)
    except OSError:
        return None
    return f"{m.group(1)} (source)" if m else None


def device_description() -> dict[str, str]:
    import mlx.core as mx

    from ssdmoe_tui.engine.model.loader import device_name

    info: dict = {}
    try:
        info = dict(mx.device_info())
    except Exception:  # noqa: BLE001 - older mlx or no device info
        info = {}
    return {
        "backend": device_name(),
        "name": str(info.get("device_name", platform.processor() or "?")),
        "machine": platform.machine(),
        "os": f"{platform.system()} {platform.release()}",
        "cpus": str(os.cpu_count() or "?"),
    }


def page_faults() -> tuple[int, int] | None:
    """The process's (minor, major) page faults so far (getrusage; None where the
    platform has no `resource` module)."""
    try:
        import resource
    except ImportError:  # not a POSIX platform
        return None
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_minflt, ru.ru_majflt


def utc_now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")

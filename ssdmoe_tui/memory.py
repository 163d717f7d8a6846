"""How much memory the OS could give this process now: one reading of /proc/meminfo
(Linux MemAvailable; elsewhere physical memory), and the memory limits of its cgroups,
with no MLX.

A base-layer leaf: the machine-wide model lock (models/lock.py) checks a second model
against it before anything is loaded, the engine's `auto` expert-cache budget and
prefill step size it, the `auto` slot placement asks whether the page cache can keep a
model's experts, and bench's fit check and conditions read it; none of them may load MLX
for it. Inside a container MemAvailable alone lies: the cgroup's limit counts.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from ssdmoe_tui.units import human_bytes

_CGROUP_V2 = Path("/sys/fs/cgroup")
_CGROUP_V1_MEM = Path("/sys/fs/cgroup/memory")
_NO_LIMIT = 1 << 60  # cgroup v1 writes ~2**63 for "no limit"

TEST_MEMORY_ENV = "SSDMOE_TEST_AVAILABLE_MEMORY"  # tests only: a fake figure, in bytes


def available_memory_bytes() -> int:
    """Memory the OS could give us now (Linux MemAvailable; elsewhere physical memory).
    `$SSDMOE_TEST_AVAILABLE_MEMORY` (bytes) replaces it: for tests only (the model lock's
    memory check on a fake small machine); never set it otherwise."""
    fake = os.environ.get(TEST_MEMORY_ENV, "")
    if fake.isdigit():
        return int(fake)
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 8 << 30


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    if text == "max":
        return None
    try:
        v = int(text)
    except ValueError:
        return None
    return None if v >= _NO_LIMIT else v


def _own_cgroup_dirs() -> list[Path]:
    """Memory cgroup folders of this process (v2 unified path and v1 memory path)."""
    out: list[Path] = []
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return out
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, rel = parts
        rel = rel.lstrip("/")
        if controllers == "":
            out.append(_CGROUP_V2 / rel)
        elif "memory" in controllers.split(","):
            out.append(_CGROUP_V1_MEM / rel)
    return out


@dataclass(frozen=True)
class MemoryLimit:
    mem_available: int  # /proc/meminfo MemAvailable (bytes)
    cgroup_limit: int | None  # memory.max / memory.limit_in_bytes of our cgroup, if set
    cgroup_usage: int | None

    @property
    def available(self) -> int:
        """What this process could still get: the smaller of the two limits."""
        avail = self.mem_available
        if self.cgroup_limit is not None:
            avail = min(avail, self.cgroup_limit - (self.cgroup_usage or 0))
        return max(avail, 0)

    @property
    def cache_room(self) -> int:
        """What the page cache may hold for this process: MemAvailable within the cgroup's
        limit (not less its usage, which counts the page cache itself)."""
        if self.cgroup_limit is None:
            return self.mem_available
        return min(self.mem_available, self.cgroup_limit)

    def describe(self) -> str:
        s = f"MemAvailable {human_bytes(self.mem_available)}"
        if self.cgroup_limit is not None:
            s += f", cgroup limit {human_bytes(self.cgroup_limit)}"
        return s

    def as_dict(self) -> dict:
        return {
            "mem_available_bytes": self.mem_available,
            "cgroup_limit_bytes": self.cgroup_limit,
            "cgroup_usage_bytes": self.cgroup_usage,
            "available_bytes": self.available,
        }


def memory_limit() -> MemoryLimit:
    """MemAvailable and the tightest memory limit of this process's cgroups (v2 or v1)."""
    limit = usage = None
    for d in _own_cgroup_dirs():
        for lim_name, use_name in (
            ("memory.max", "memory.current"),
            ("memory.limit_in_bytes", "memory.usage_in_bytes"),
        ):
            lim = _read_int(d / lim_name)
            if lim is not None and (limit is None or lim < limit):
                limit, usage = lim, _read_int(d / use_name)
    return MemoryLimit(available_memory_bytes(), limit, usage)

"""How much memory the OS could give this process now: one reading of /proc/meminfo
(Linux MemAvailable; elsewhere physical memory), with no MLX.

A base-layer leaf: the machine-wide model lock (models/lock.py) checks a second model
against it before anything is loaded, the engine's `auto` expert-cache budget and
prefill step size it, and bench's fit check reads it; none of them may load MLX for it.
"""

from __future__ import annotations

import os

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

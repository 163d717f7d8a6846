"""A full disk for the fault tests: a small tmpfs mounted where the test writes (root only;
elsewhere the test is skipped and says why)."""

from __future__ import annotations

import contextlib
import os
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest


@contextlib.contextmanager
def small_disk(where: Path, size_kib: int) -> Iterator[Path]:
    """A tmpfs of `size_kib` at `where`; skipped (with why) when it cannot be mounted."""
    if os.geteuid() != 0:
        pytest.skip("a full disk is simulated with a small tmpfs mount, which needs root")
    where.mkdir(parents=True, exist_ok=True)
    r = subprocess.run(
        [
            "mount",
            "-t",
            "tmpfs",
            "-o",
            f"size={size_kib}k",
            f"ssdmoe-{uuid.uuid4().hex[:6]}",
            str(where),
        ],
        capture_output=True,
        text=True,
    )
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()[:100]}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)

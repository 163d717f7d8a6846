"""Where MLX-CUDA keeps the GPU kernels it compiles, so a user pays the compilation once.

MLX's CUDA backend compiles its kernels at run time (NVRTC) the first time a shape needs
them: minutes for a new model on a fresh machine (docs/benchmarks.md). It keeps the PTX it
made in `MLX_PTX_CACHE_DIR`, by default `<tmp>/mlx/<version>/ptx`, which a reboot or a tmp
cleaner empties; the driver then keeps the machine code made from that PTX in its own
cache (`CUDA_CACHE_PATH`, `~/.nv/ComputeCache` by default, capped by `CUDA_CACHE_MAXSIZE`).
`keep_kernels` points MLX at a folder of ssdmoe's cache dir instead (one per MLX version:
MLX does not add its version to a folder it is given) and lets the driver keep up to
4 GiB, unless the user set either; it runs before the first kernel is compiled (the CLI's
start), and does nothing off Linux (Metal ships its kernels precompiled).
"""

from __future__ import annotations

import os
import sys
from importlib import metadata
from pathlib import Path

from ssdmoe_tui.paths import cache_dir

PTX_ENV = "MLX_PTX_CACHE_DIR"
DRIVER_CACHE_ENV = "CUDA_CACHE_MAXSIZE"
DRIVER_CACHE_BYTES = 4 << 30  # the driver's largest allowed cache


def _mlx_version() -> str:
    try:
        return metadata.version("mlx")
    except metadata.PackageNotFoundError:
        return "unknown"


def kernel_dir() -> Path:
    """The folder MLX keeps its compiled PTX in (the user's, when they set one)."""
    given = os.environ.get(PTX_ENV)
    return Path(given) if given else cache_dir() / "mlx-ptx" / _mlx_version()


def keep_kernels() -> None:
    """Default MLX's kernel cache to a folder that outlives reboots, and the driver's to
    4 GiB; a value the user set stays. Linux only."""
    if not sys.platform.startswith("linux"):
        return
    os.environ.setdefault(PTX_ENV, str(kernel_dir()))
    os.environ.setdefault(DRIVER_CACHE_ENV, str(DRIVER_CACHE_BYTES))


def kernels_cached(folder: Path | None = None) -> bool:
    """Whether MLX has compiled (and kept) any kernel in `folder` (default: the one it uses)."""
    folder = kernel_dir() if folder is None else folder
    try:
        return any(p.suffix == ".ptx" for p in folder.rglob("*.ptx"))
    except OSError:
        return False


def compiles_first(cuda: bool, folder: Path | None = None) -> bool:
    """Whether the first forward pass will compile MLX's GPU kernels: on MLX-CUDA while
    the kernel folder of this MLX version holds none. Measured on an H100 (MLX-CUDA
    0.32.4, the demo, `ssdmoe generate` 32 tokens, a new process each): 142 s with that
    folder empty (prefill 0.21 tok/s: the kernels compile during the first prefill),
    15.7-15.9 s with it kept (21 PTX files, 9.5 MiB), 125 s with only the driver's cache
    kept: the PTX folder is the one that matters. Metal and the CPU compile nothing."""
    return cuda and not kernels_cached(folder)


COMPILING_NOTE = (
    "compiling GPU kernels, once: the first replies on a new model take minutes "
    "(later runs reuse them from {folder})"
)


def first_run_note(cuda: bool) -> str:
    """What to tell a user before MLX-CUDA compiles its kernels ('' when it will not)."""
    return COMPILING_NOTE.format(folder=kernel_dir()) if compiles_first(cuda) else ""

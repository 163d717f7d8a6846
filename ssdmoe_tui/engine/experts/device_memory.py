"""Where MLX-CUDA keeps the expert-cache slots (managed memory placement hints).

MLX-CUDA allocates every array with `cudaMallocManaged`. The reader writes missed
experts into slot memory from the CPU, so by default each freshly read page
migrates host-ward on the write and back to the GPU on the first kernel that reads
it, page fault by page fault. That cost showed up as a router "sync" that grew with
the bytes read (54-129 ms per token on an H200, docs/benchmarks.md).

Placements (`SSDMOE_SLOT_PLACEMENT` or the `placement` argument):
- `managed`: leave the pages to the driver's fault-driven migration (MLX's default);
- `host`: preferred location = host, mapped for the GPU (`SetAccessedBy`): reads
  land in host RAM with no fault and kernels read the slots over the bus, once;
- `device`: the slots placed as `host` (the reader's target), and a device-resident
  mirror of each bank that the compute reads, the rows a read filled copied host ->
  mirror before use (engine/experts/mirror.py);
- `auto`: on MLX-CUDA, `device` when the cache holds under half of the expert set
  (misses dominate), the GPU has room for the mirror at its peak (`MIRROR_PEAK_FACTOR`
  times its size within `MIRROR_ROOM_SHARE` of the free memory) and the page cache can
  keep the model's experts (`PAGE_CACHE_SHARE` of the memory the process may use), else
  `host` there; `managed` from half the expert set on (hits dominate, and a slot on the
  GPU is read at HBM speed); nothing elsewhere (CPU, Metal: unified memory).

Measured on an H100 (Qwen3-30B-A3B shape, 4 GiB cache = 26 % of the experts, K = 8,
the model's routing, one process after a compile pass, docs/benchmarks.md 2026-12-06
fifth session): `device` 7.81 tok/s, `host` 6.21, `managed` 3.77 (read-ahead off; on:
6.20 / 5.65 / 4.07), the same tokens; the sync a layer 0.5 ms against host's 1.36. A
4k-token prompt (warm) under `device` 0.765-0.774x resident against host's 0.792-0.793x,
its MLX peak 13.5-13.8 GiB against 6.46; the real trace decoding cold from disk under 8
and 12 GiB caps, host ahead of `device` (docs/benchmarks.md, 2026-12-06 sixth session):
the mirror wins where the router sync bounds a token, not where the disk does. On an
H200 (seventh session), the model's routing from the page cache: `device` 7.98-8.52
tok/s against host's 6.80; cold under a 12 GiB cap (the 16 GiB of experts cannot stay
cached): host 3.41 / 3.32 tok/s (4 / 2 GiB) against `device`'s 2.68 / 2.71. Hence
`auto`'s page-cache condition: a model larger than the memory it may use (what this
project is for) reads its misses from the disk, and gets host slots.

Measured on an H200 (Qwen3.5-35B-A3B shape, bf16, docs/benchmarks.md): with a cache of
24 % of the experts (27 % hits) `host` decodes 31-41 % faster than `managed`; with 71 %
(59 % hits) they tie (110 vs 112 ms per token); a hit costs ~0.1 ms per expert more
under `host` (read over the bus instead of from HBM).

`host` slots take host RAM (allocated by the driver, so a memory cgroup does not charge
them) where `managed` ones sit in GPU memory: on a box with little host RAM and a big
GPU, `managed` leaves more room to the page cache.

Only the CUDA driver API is used (`libcuda.so.1`, present wherever the NVIDIA
driver is), through ctypes; without it the hint is skipped and says why.
"""

from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass

import mlx.core as mx

from ssdmoe_tui.errors import BadValueError
from ssdmoe_tui.memory import memory_limit

PLACEMENTS = ("auto", "managed", "host", "device")

# CUmem_advise values (cuda.h)
_SET_PREFERRED_LOCATION = 3
_SET_ACCESSED_BY = 5
# CUmemLocationType values
_LOC_DEVICE = 1
_LOC_HOST = 2
_CPU_DEVICE_ID = -1  # CU_DEVICE_CPU, for the legacy entry points


class _MemLocation(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]


@dataclass(frozen=True)
class PlacementResult:
    placement: str  # what was applied: "host", "device", "managed" or "none"
    note: str = ""  # why a requested placement was not applied


def is_cuda() -> bool:
    """True when MLX runs on its CUDA backend (managed memory)."""
    cuda = getattr(mx, "cuda", None)
    try:
        return bool(cuda is not None and cuda.is_available() and mx.default_device() == mx.gpu)
    except Exception:  # noqa: BLE001 - older MLX without the probe
        return False


def requested_placement(placement: str | None = None) -> str:
    p = (placement or os.environ.get("SSDMOE_SLOT_PLACEMENT") or "auto").strip().lower()
    if p not in PLACEMENTS:
        raise BadValueError(f"SSDMOE_SLOT_PLACEMENT={p!r}: use one of {', '.join(PLACEMENTS)}")
    return p


class _Driver:
    """The few CUDA driver calls needed, bound lazily."""

    def __init__(self) -> None:
        self.lib = ctypes.CDLL("libcuda.so.1")
        self.v2 = hasattr(self.lib, "cuMemAdvise_v2")
        if self.v2:
            f = self.lib.cuMemAdvise_v2
            f.argtypes = [ctypes.c_uint64, ctypes.c_size_t, ctypes.c_int, _MemLocation]
        else:
            f = self.lib.cuMemAdvise
            f.argtypes = [ctypes.c_uint64, ctypes.c_size_t, ctypes.c_int, ctypes.c_int]
        f.restype = ctypes.c_int
        self.advise_fn = f
        self.lib.cuCtxGetDevice.argtypes = [ctypes.POINTER(ctypes.c_int)]
        self.lib.cuCtxGetDevice.restype = ctypes.c_int

    def device(self) -> int:
        dev = ctypes.c_int(0)
        rc = self.lib.cuCtxGetDevice(ctypes.byref(dev))
        return dev.value if rc == 0 else 0

    def advise(self, ptr: int, size: int, advice: int, host: bool, device: int) -> int:
        if self.v2:
            loc = _MemLocation(_LOC_HOST, 0) if host else _MemLocation(_LOC_DEVICE, device)
            return self.advise_fn(ptr, size, advice, loc)
        return self.advise_fn(ptr, size, advice, _CPU_DEVICE_ID if host else device)


_driver: _Driver | None = None


def _get_driver() -> _Driver:
    global _driver
    if _driver is None:
        _driver = _Driver()
    return _driver


HOST_BELOW_SHARE = 0.5  # `auto`: host-side slots below this share of the expert set
# `auto` mirrors the slots on the device only where the mirror at its peak takes at most
# this share of the GPU's free memory at load: the rest stays for the KV cache,
# activations and kernels.
MIRROR_ROOM_SHARE = 0.5
# The mirror's peak over its own size: on the H100 a 4k-token prompt under `device` peaked
# 7.2 GiB above `host` placement's peak for a 4 GiB mirror (13.5-13.8 against 6.46 GiB of
# MLX memory), 10.7 GiB with its long chunks staged ahead (17.2), i.e. the mirror and
# transient copies of 1.8-2.7 times it (docs/benchmarks.md, 2026-12-06 sixth session).
# One mirror size and one prompt length measured, the extra's source not yet known (its
# activations are in the peak too): a cautious factor, to be revised by the
# `prefill_peak_mlx_memory_bytes` runs.
MIRROR_PEAK_FACTOR = 3.0


# `auto` mirrors the slots only where the model's experts fit in this share of the memory
# the process may use (MemAvailable, within its cgroup's limit): there the misses come
# from the page cache once warm, where the mirror measured ahead; otherwise from the disk,
# where host slots did (module docstring). The rest stays for the banks, the KV cache and
# what else the machine runs.
PAGE_CACHE_SHARE = 0.8


def choose_placement(
    want: str, share: float, cuda: bool, mirror_fits: bool = False, cached: bool = False
) -> str:
    """The placement to apply: "none" off MLX-CUDA; `auto` resolved by the cache's share
    of the expert set, whether a device mirror of it fits (`mirror_fits`) and whether the
    page cache can keep the model's experts (`cached`)."""
    if not cuda:
        return "none"
    if want == "auto":
        if share >= HOST_BELOW_SHARE:
            return "managed"
        return "device" if mirror_fits and cached else "host"
    return want


def page_cache_keeps(expert_bytes: int, room: int) -> bool:
    """Whether `expert_bytes` of experts stay in a page cache of `room` bytes."""
    return expert_bytes <= PAGE_CACHE_SHARE * room


def gpu_free_bytes() -> int | None:
    """The GPU's free memory as MLX reports it (MLX-CUDA's `device_info`), or None."""
    try:
        info = dict(mx.device_info())
    except Exception:  # noqa: BLE001 - older MLX, or no device info
        return None
    free = info.get("free_memory")
    return int(free) if isinstance(free, int) and free > 0 else None


def mirror_fits(nbytes: int, free: int | None) -> bool:
    """Whether a device mirror of `nbytes` of slots, at its measured peak, leaves the GPU
    room (unknown: no)."""
    return free is not None and MIRROR_PEAK_FACTOR * nbytes <= MIRROR_ROOM_SHARE * free


def host_note(
    cached: bool, fits: bool, experts: int, room: int, nbytes: int, free: int | None
) -> str:
    """Why `auto` kept the slots on the host and mirrored nothing (each reason that held)."""
    why = []
    if not cached:
        why.append(
            f"the model's {experts / 2**30:.1f} GiB of experts would not stay in the page"
            f" cache ({room / 2**30:.1f} GiB of memory to use): misses come from the disk,"
            " where host slots measured ahead of a device mirror"
        )
    if not fits:
        gpu = "unknown" if free is None else f"{free / 2**30:.1f} GiB"
        why.append(
            f"no GPU room for a device mirror of {nbytes / 2**30:.1f} GiB (its copies at"
            f" their peak: {MIRROR_PEAK_FACTOR:g}x; free: {gpu})"
        )
    return "; ".join(why)


def place_slots(
    buffers: list[tuple[int, int]], placement: str | None = None, share: float = 0.0
) -> PlacementResult:
    """Apply the placement to slot buffers given as (address, bytes).

    `share`: the cache's slots over all experts of the model (1.0: holds them all).
    `device` advises the slots as `host` does; the mirror is the cache's (mirror.py)."""
    want = requested_placement(placement)
    cuda = is_cuda()
    nbytes = sum(size for _, size in buffers)
    asks = cuda and want == "auto"
    free = gpu_free_bytes() if asks else None
    fits = mirror_fits(nbytes, free)
    experts = int(nbytes / share) if share > 0 else 0  # the whole expert set, in slot bytes
    room = max(memory_limit().cache_room - nbytes, 0) if asks else 0  # less the host banks
    cached = asks and page_cache_keeps(experts, room)
    got = choose_placement(want, share, cuda, fits, cached)
    if got == "none":
        return PlacementResult("none", "" if want == "auto" else "not on MLX-CUDA")
    if got == "managed":
        return PlacementResult("managed")
    note = ""
    if want == "auto" and got == "host":
        note = host_note(cached, fits, experts, room, nbytes, free)
    try:
        drv = _get_driver()
    except (OSError, AttributeError) as e:
        return PlacementResult("managed", f"CUDA driver API unavailable ({e})")
    dev = drv.device()
    for ptr, size in buffers:
        rc = drv.advise(ptr, size, _SET_PREFERRED_LOCATION, True, dev)
        if rc == 0:
            rc = drv.advise(ptr, size, _SET_ACCESSED_BY, False, dev)
        if rc != 0:
            return PlacementResult("managed", f"cuMemAdvise failed (CUresult {rc})")
    return PlacementResult(got, note)

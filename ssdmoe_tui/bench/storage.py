"""Where the model's bytes live, for `ssdmoe bench`'s conditions: the drive (model and
interface), the file system of the model folder, and how much of the model's files the
OS file cache already holds before a run.

A streamed decode is as fast as the drive behind the expert reads, and a "warm" number
is only warm if the pages were resident: so the bench records these instead of assuming
them. Every probe is guarded by platform (Linux: /sys and /proc/self/mountinfo; macOS:
`df` and `diskutil`; residency through `mincore` on both) and answers "unknown" with a
note rather than failing: a condition nobody can read must not stop a benchmark.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import plistlib
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

UNKNOWN = "unknown"
_SYS_DEV_BLOCK = Path("/sys/dev/block")
_MOUNTINFO = Path("/proc/self/mountinfo")
_WINDOW = 1 << 30  # mincore maps a file this many bytes at a time
_TIMEOUT_S = 10  # any helper program (df, diskutil)


@dataclass(frozen=True)
class Drive:
    """The block device under the model folder."""

    device: str = UNKNOWN  # e.g. nvme0n1, sda, vda, disk3
    model: str = UNKNOWN  # what the drive reports (absent for virtio disks)
    interface: str = UNKNOWN  # NVMe, SATA/ATA, SCSI/SAS, USB, virtio, MMC/SD, virtual (..)
    rotational: bool | None = None  # None: unknown
    note: str = ""

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class FileSystem:
    type: str = UNKNOWN  # ext4, xfs, btrfs, apfs, overlay, ...
    mount_point: str = UNKNOWN
    source: str = UNKNOWN  # /dev/nvme0n1p2, overlay, ...

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Residency:
    """The share of `files`' bytes in the OS file cache (mincore), or unknown and why."""

    method: str  # "mincore" or "unknown"
    files: int
    file_bytes: int
    resident_bytes: int | None = None
    note: str = ""

    @property
    def share(self) -> float | None:
        if self.resident_bytes is None:
            return None
        return self.resident_bytes / self.file_bytes if self.file_bytes else 0.0

    def as_dict(self) -> dict:
        d = asdict(self)
        d["resident_share"] = None if self.share is None else round(self.share, 4)
        return d

    def describe(self) -> str:
        if self.share is None:
            return f"unknown ({self.note})" if self.note else UNKNOWN
        return f"{self.share:.0%} of {self.file_bytes / 2**20:.1f} MiB resident"


# --------------------------------------------------------------------------- file system


def _unescape(field: str) -> str:
    """mountinfo writes space, tab, newline and backslash as octal escapes."""
    for esc, ch in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        field = field.replace(esc, ch)
    return field


def _mount_of(path: Path, mountinfo: Path = _MOUNTINFO) -> tuple[FileSystem, str] | None:
    """Linux: the mount holding `path` (the longest mount point above it, the later of
    equal ones) and its device number "major:minor"; None when mountinfo is unreadable."""
    try:
        lines = mountinfo.read_text().splitlines()
    except OSError:
        return None
    best: tuple[int, FileSystem, str] | None = None
    target = str(path)
    for line in lines:
        left, sep, right = line.partition(" - ")
        a, b = left.split(), right.split()
        if not sep or len(a) < 5 or len(b) < 2:
            continue
        mp = _unescape(a[4])
        inside = target == mp or target.startswith(mp.rstrip("/") + "/")
        if inside and (best is None or len(mp) >= best[0]):
            best = (len(mp), FileSystem(b[0], mp, _unescape(b[1])), a[2])
    return None if best is None else (best[1], best[2])


def file_system(path: Path) -> FileSystem:
    """The file system holding `path` (Linux mountinfo, macOS `diskutil`)."""
    path = Path(path).resolve()
    if sys.platform.startswith("linux"):
        found = _mount_of(path)
        return found[0] if found else FileSystem()
    if sys.platform == "darwin":
        info = _diskutil(_df_mount_point(path) or "")
        if info:
            return FileSystem(
                str(info.get("FilesystemType") or UNKNOWN),
                str(info.get("MountPoint") or UNKNOWN),
                str(info.get("DeviceNode") or UNKNOWN),
            )
    return FileSystem()


# --------------------------------------------------------------------------- drive


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip() or None
    except (OSError, UnicodeDecodeError):
        return None


def _interface(sys_path: str) -> str:
    """The bus, from the device's place in the sysfs tree (USB before SCSI: USB storage
    sits behind a SCSI host)."""
    for marker, name in (
        ("/nvme", "NVMe"),
        ("/usb", "USB"),
        ("/virtio", "virtio"),
        ("/mmc", "MMC/SD"),
        ("/ata", "SATA/ATA"),
        ("/host", "SCSI/SAS"),
    ):
        if marker in sys_path:
            return name
    return UNKNOWN


def _whole_disk(node: Path, depth: int = 0) -> tuple[Path, str]:
    """A partition's disk, and a device-mapper / md device's first member (bounded)."""
    note = ""
    if (node / "partition").exists():
        node = node.parent
    slaves = sorted((node / "slaves").glob("*")) if (node / "slaves").is_dir() else []
    if slaves and depth < 8:
        inner, inner_note = _whole_disk(slaves[0].resolve(), depth + 1)
        note = f"{node.name} over {inner.name}" + (f"; {inner_note}" if inner_note else "")
        return inner, note
    return node, note


def _linux_drive(path: Path, sys_dev_block: Path = _SYS_DEV_BLOCK) -> Drive:
    try:
        dev = os.stat(path).st_dev
    except OSError as e:
        return Drive(note=f"cannot stat {path}: {e.strerror or e}")
    numbers = f"{os.major(dev)}:{os.minor(dev)}"
    if os.major(dev) == 0:  # anonymous device (btrfs, overlay, tmpfs): ask the mount
        found = _mount_of(path)
        src = found[0].source if found else ""
        try:
            rdev = os.stat(src).st_rdev if src.startswith("/dev/") else 0
        except OSError:
            rdev = 0
        if not rdev:
            fs = found[0].type if found else UNKNOWN
            return Drive(note=f"{fs} file system on no block device this process can see")
        numbers = f"{os.major(rdev)}:{os.minor(rdev)}"
    node = sys_dev_block / numbers
    if not node.exists():
        return Drive(note=f"no {node}")
    disk, note = _whole_disk(node.resolve())
    where = str(disk)
    interface = _interface(where)
    if "/devices/virtual/" in where and interface == UNKNOWN:
        interface = f"virtual ({disk.name.rstrip('0123456789')})"
    model = _read(disk / "device" / "model")
    rot = _read(disk / "queue" / "rotational")
    if model is None and interface == "virtio":
        note = "; ".join(x for x in (note, "a virtio disk does not report its model") if x)
    return Drive(
        device=disk.name,
        model=model or UNKNOWN,
        interface=interface,
        rotational=None if rot is None else rot == "1",
        note=note,
    )


def _run(argv: list[str]) -> str | None:
    try:
        out = subprocess.run(argv, capture_output=True, timeout=_TIMEOUT_S, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.decode(errors="replace") if out.returncode == 0 else None


def _df_mount_point(path: Path) -> str | None:
    out = _run(["df", "-P", str(path)])
    lines = (out or "").strip().splitlines()
    return lines[-1].split(None, 5)[-1] if len(lines) >= 2 else None


def _diskutil(target: str) -> dict | None:
    """macOS `diskutil info -plist TARGET` as a dict (None when it cannot say)."""
    if not target:
        return None
    out = _run(["diskutil", "info", "-plist", target])
    if out is None:
        return None
    try:
        info = plistlib.loads(out.encode())
    except (plistlib.InvalidFileException, ValueError, TypeError):
        return None
    return info if isinstance(info, dict) else None


def _mac_drive(path: Path) -> Drive:
    vol = _diskutil(_df_mount_point(path) or "")
    if vol is None:
        return Drive(note="diskutil gave no answer")
    phys = vol
    stores = vol.get("APFSPhysicalStores") or []
    if stores and isinstance(stores[0], dict):  # an APFS volume: ask its physical store
        phys = _diskutil(str(stores[0].get("APFSPhysicalStore", ""))) or vol
    solid = phys.get("SolidState")
    return Drive(
        device=str(phys.get("ParentWholeDisk") or phys.get("DeviceIdentifier") or UNKNOWN),
        model=str(phys.get("MediaName") or phys.get("IORegistryEntryName") or UNKNOWN),
        interface=str(phys.get("BusProtocol") or UNKNOWN),
        rotational=None if solid is None else not bool(solid),
    )


def drive(path: Path) -> Drive:
    """The drive holding `path`: Linux sysfs, macOS diskutil, else unknown."""
    path = Path(path).resolve()
    if sys.platform.startswith("linux"):
        return _linux_drive(path)
    if sys.platform == "darwin":
        return _mac_drive(path)
    return Drive(note=f"not probed on {sys.platform}")


# --------------------------------------------------------------------------- residency


class _Mincore:
    """libc's mmap / mincore / munmap through ctypes (Linux, macOS): Python's `os` has
    no mincore, and its `mmap` objects give no address for a read-only map."""

    def __init__(self) -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        self.mmap, self.munmap, self.mincore = libc.mmap, libc.munmap, libc.mincore
        self.mmap.restype = ctypes.c_void_p
        self.mmap.argtypes = [
            ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int,
            ctypes.c_int64,
        ]  # fmt: skip
        self.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        self.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
        self.page = mmap.PAGESIZE
        self.failed = ctypes.c_void_p(-1).value
        self.bit0 = bytes(b & 1 for b in range(256))  # macOS sets other state bits too

    def resident(self, path: Path) -> int:
        """Bytes of `path` in the file cache (whole pages, capped at the size)."""
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        try:
            size = os.fstat(fd).st_size
            pages = 0
            for off in range(0, size, _WINDOW):
                length = min(_WINDOW, size - off)
                addr = self.mmap(None, length, mmap.PROT_READ, mmap.MAP_SHARED, fd, off)
                if addr in (None, self.failed):
                    raise OSError(ctypes.get_errno(), "mmap failed")
                try:
                    vec = ctypes.create_string_buffer((length + self.page - 1) // self.page)
                    if self.mincore(addr, length, vec) != 0:
                        raise OSError(ctypes.get_errno(), "mincore failed")
                    pages += vec.raw.translate(self.bit0).count(1)
                finally:
                    self.munmap(addr, length)
            return min(pages * self.page, size)
        finally:
            os.close(fd)


def residency(files: list[Path]) -> Residency:
    """How much of `files` the OS file cache holds now (measured, not assumed)."""
    files = [Path(f) for f in files]
    total = 0
    for f in files:
        try:
            total += f.stat().st_size
        except OSError:
            pass
    if not (sys.platform.startswith("linux") or sys.platform == "darwin"):
        return Residency(UNKNOWN, len(files), total, note=f"no mincore on {sys.platform}")
    try:
        probe = _Mincore()
    except (OSError, AttributeError) as e:
        return Residency(UNKNOWN, len(files), total, note=f"mincore unavailable ({e})")
    resident = 0
    for f in files:
        try:
            resident += probe.resident(f)
        except OSError as e:
            why = e.strerror or str(e)
            return Residency(UNKNOWN, len(files), total, note=f"{f}: {why}")
    return Residency("mincore", len(files), total, resident)


def storage_conditions(folder: Path) -> dict:
    """The bench's `storage` condition: drive and file system of the model folder."""
    return {"drive": drive(folder).as_dict(), "file_system": file_system(folder).as_dict()}

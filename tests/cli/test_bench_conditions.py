"""The bench's storage and thermal conditions on this machine's real files and /sys."""

from __future__ import annotations

import os
import sys

import pytest

from ssdmoe_tui.bench import storage, thermal

linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux /proc and /sys")


def _write(path, size: int) -> None:
    with open(path, "wb") as f:
        f.write(os.urandom(size))
        f.flush()
        os.fsync(f.fileno())  # clean pages: DONTNEED can then evict them


@linux
def test_file_cache_share_after_reading_and_after_dontneed(tmp_path):
    """mincore sees a file read into the page cache, and sees it gone after fadvise."""
    f = tmp_path / "shard.safetensors"
    _write(f, 8 << 20)
    fd = os.open(f, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        dropped = storage.residency([f])
        while os.read(fd, 1 << 20):
            pass
        read = storage.residency([f])
    finally:
        os.close(fd)
    assert dropped.method == read.method == "mincore"
    assert dropped.file_bytes == read.file_bytes == 8 << 20
    assert dropped.share < 0.1, dropped
    assert read.share > 0.9, read
    # two files, one of them empty: the share is over all their bytes
    empty = tmp_path / "empty"
    empty.write_bytes(b"")
    both = storage.residency([f, empty])
    assert both.files == 2 and both.file_bytes == 8 << 20 and both.share > 0.9


def test_residency_of_a_missing_file_is_unknown_naming_it(tmp_path):
    gone = tmp_path / "gone.safetensors"
    r = storage.residency([gone])
    assert r.share is None and r.method == "unknown" and str(gone) in r.note
    assert r.as_dict()["resident_share"] is None and "unknown" in r.describe()


@linux
def test_file_system_and_drive_of_this_machine(tmp_path):
    """The mount of the temp folder as /proc/self/mountinfo has it; the drive from
    /sys/dev/block (a virtio, NVMe or other disk), or unknown with a note (tmpfs)."""
    fs = storage.file_system(tmp_path)
    assert fs.type != "unknown" and str(tmp_path.resolve()).startswith(fs.mount_point)
    with open("/proc/self/mountinfo") as m:
        assert any(f" {fs.mount_point} " in line and f" - {fs.type} " in line for line in m)
    d = storage.drive(tmp_path)
    if d.device == "unknown":
        assert d.note  # says why (no block device under a tmpfs or overlay)
    else:
        assert (storage._SYS_DEV_BLOCK.parent / "block" / d.device).exists() or d.note
        assert d.interface != "" and isinstance(d.rotational, (bool, type(None)))


@linux
def test_drive_of_a_tmpfs_says_why_it_is_unknown():
    if not os.path.isdir("/dev/shm"):
        pytest.skip("no /dev/shm")
    d = storage.drive("/dev/shm")
    fs = storage.file_system("/dev/shm")
    assert fs.type == "tmpfs"
    assert d.device == "unknown" and "tmpfs" in d.note


@linux
def test_mountinfo_escapes_and_the_longest_mount_wins(tmp_path):
    info = tmp_path / "mountinfo"
    info.write_text(
        "27 1 254:0 / / rw - ext4 /dev/vda rw\n"
        "40 27 259:2 / /mnt/my\\040models rw - xfs /dev/nvme0n1p2 rw\n"
        "41 27 0:30 / /mnt rw - tmpfs tmpfs rw\n"
    )
    fs, dev = storage._mount_of(storage.Path("/mnt/my models/qwen"), info)
    assert (fs.type, fs.mount_point, fs.source, dev) == (
        "xfs", "/mnt/my models", "/dev/nvme0n1p2", "259:2",
    )  # fmt: skip
    assert storage._mount_of(storage.Path("/mnt/x"), info)[0].type == "tmpfs"
    assert storage._mount_of(storage.Path("/srv"), tmp_path / "none") is None


def test_interface_from_the_sysfs_path():
    cases = {
        "/sys/devices/pci0000:00/0000:00:1d.0/0000:3d:00.0/nvme/nvme0/nvme0n1": "NVMe",
        "/sys/devices/pci0000:00/0000:00:02.0/virtio1/block/vda": "virtio",
        "/sys/devices/pci0000:00/0000:00:17.0/ata1/host0/target0:0:0/0:0:0:0/block/sda": "SATA/ATA",
        "/sys/devices/pci0000:00/0000:00:14.0/usb2/2-1/2-1:1.0/host6/target6:0:0/block/sdb": "USB",
        "/sys/devices/virtual/block/loop0": "unknown",
    }
    for path, want in cases.items():
        assert storage._interface(path) == want, path


@linux
def test_thermal_state_of_this_machine_and_of_a_sysfs_tree(tmp_path):
    """This machine's /sys/class/thermal (a VM has none: unknown with the reason), and a
    tree laid out as the kernel's: temperatures in millidegrees, cooling in use."""
    here = thermal.thermal_state()
    assert here["state"] and (here["state"] != "unknown" or here["note"])
    z = tmp_path / "thermal_zone0"
    z.mkdir()
    (z / "type").write_text("x86_pkg_temp\n")
    (z / "temp").write_text("71500\n")
    c = tmp_path / "cooling_device0"
    c.mkdir()
    (c / "type").write_text("Processor\n")
    (c / "cur_state").write_text("2\n")
    (c / "max_state").write_text("10\n")
    t = thermal.linux_thermal(tmp_path)
    assert t["zones"] == [{"type": "x86_pkg_temp", "temp_c": 71.5}] and t["max_temp_c"] == 71.5
    assert t["state"] == "cooling active"
    (c / "cur_state").write_text("0\n")
    assert thermal.linux_thermal(tmp_path)["state"] == "no cooling active"
    assert thermal.linux_thermal(tmp_path / "none")["state"] == "unknown"


def test_pmset_therm_output_parsed():
    text = (
        "Note: No thermal warning level has been recorded\n"
        "Note: No performance warning level has been recorded\n"
        "2026-12-02 01:00:00 +0000 CPU Power notify\n"
        "\tCPU_Scheduler_Limit \t= 100\n\tCPU_Available_CPUs \t= 10\n\tCPU_Speed_Limit \t= 73\n"
    )
    t = thermal.parse_pmset_therm(text)
    assert t["limits"]["CPU_Speed_Limit"] == 73 and t["limits"]["CPU_Available_CPUs"] == 10
    assert t["state"] == "throttled (CPU speed limit 73%)" and len(t["notes"]) == 2
    quiet = thermal.parse_pmset_therm("Note: No thermal warning level has been recorded\n")
    assert quiet["state"] == "No thermal warning level has been recorded"

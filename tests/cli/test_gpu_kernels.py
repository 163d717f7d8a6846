"""MLX-CUDA's compiled kernels are kept in ssdmoe's cache dir (gpu_kernels.py), and a
first run says it compiles them. The folder logic runs on any Linux machine; the CUDA
compile itself is measured on the H200 (docs/benchmarks.md)."""

from __future__ import annotations

import sys

import pytest

from ssdmoe_tui import gpu_kernels

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux's CUDA cache")


def test_kernels_default_to_the_cache_dir_and_a_users_choice_stays(monkeypatch, tmp_path):
    monkeypatch.setenv("SSDMOE_HOME", str(tmp_path / "home"))
    monkeypatch.delenv(gpu_kernels.PTX_ENV, raising=False)
    monkeypatch.delenv(gpu_kernels.DRIVER_CACHE_ENV, raising=False)
    gpu_kernels.keep_kernels()
    import os

    folder = os.environ[gpu_kernels.PTX_ENV]
    assert folder.startswith(str(tmp_path / "home")) and "mlx-ptx" in folder
    assert os.environ[gpu_kernels.DRIVER_CACHE_ENV] == str(4 << 30)
    monkeypatch.setenv(gpu_kernels.PTX_ENV, str(tmp_path / "mine"))
    monkeypatch.setenv(gpu_kernels.DRIVER_CACHE_ENV, "1000")
    gpu_kernels.keep_kernels()
    assert os.environ[gpu_kernels.PTX_ENV] == str(tmp_path / "mine")
    assert os.environ[gpu_kernels.DRIVER_CACHE_ENV] == "1000"


def test_the_first_run_note_until_a_kernel_is_kept(monkeypatch, tmp_path):
    monkeypatch.setenv(gpu_kernels.PTX_ENV, str(tmp_path / "ptx"))
    note = gpu_kernels.first_run_note(cuda=True)
    assert "compiling GPU kernels, once" in note and str(tmp_path / "ptx") in note
    assert gpu_kernels.first_run_note(cuda=False) == ""  # the CPU and Metal compile nothing
    (tmp_path / "ptx" / "sub").mkdir(parents=True)
    (tmp_path / "ptx" / "sub" / "gemv.ptx").write_text("// ptx")
    assert gpu_kernels.first_run_note(cuda=True) == ""


def test_compiles_first_decides_on_the_device_and_this_versions_folder(tmp_path):
    """A CUDA device with no PTX kept in the folder compiles first; a folder that holds
    other files (or is missing) counts as empty; the CPU never compiles."""
    folder = tmp_path / "mlx-ptx" / "0.32.4"
    assert gpu_kernels.compiles_first(True, folder)  # missing
    folder.mkdir(parents=True)
    (folder / "notes.txt").write_text("not a kernel")
    assert gpu_kernels.compiles_first(True, folder)
    assert not gpu_kernels.compiles_first(False, folder)
    (folder / "rms_norm.ptx").write_text("// ptx")
    assert not gpu_kernels.compiles_first(True, folder)

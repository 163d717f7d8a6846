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
    note = gpu_kernels.first_run_note()
    assert "compiling GPU kernels, once" in note and str(tmp_path / "ptx") in note
    (tmp_path / "ptx" / "sub").mkdir(parents=True)
    (tmp_path / "ptx" / "sub" / "gemv.ptx").write_text("// ptx")
    assert gpu_kernels.first_run_note() == ""

from __future__ import annotations

import os

import pytest

from tests.helpers import pace
from tests.helpers.checkpoints import build


@pytest.fixture(autouse=True)
def ssdmoe_home(tmp_path_factory, monkeypatch):
    """Every test runs against a throwaway data/cache/config tree."""
    home = tmp_path_factory.mktemp("ssdmoe-home")
    monkeypatch.setenv("SSDMOE_HOME", str(home))
    # The model lock is machine-wide (not under SSDMOE_HOME): each test gets its own, so
    # parallel test runs on one machine never see each other's lock.
    monkeypatch.setenv("SSDMOE_LOCK_DIR", str(home / "locks"))
    return home


@pytest.fixture(autouse=True)
def engine_pace(monkeypatch):
    """SSDMOE_TEST_PACE=slow|fast runs the suite on a slowed or a fast-reporting engine
    (tests/helpers/pace.py): the app tests must pass both ways."""
    pace.apply(monkeypatch, os.environ.get("SSDMOE_TEST_PACE", ""))


@pytest.fixture
def mid_stream(monkeypatch):
    """For a test that acts while a reply streams: a stream that lasts, however fast the
    machine (each token at least MID_STREAM_TOKEN_S after the previous one)."""
    pace.floor(monkeypatch, pace.MID_STREAM_TOKEN_S)


@pytest.fixture(scope="session")
def checkpoints(tmp_path_factory):
    """arch -> folder of a small random checkpoint, built once per test session."""
    root = tmp_path_factory.mktemp("ckpt")
    cache: dict = {}

    def get(arch: str):
        if arch not in cache:
            cache[arch] = build(arch, root / arch)
        return cache[arch]

    return get


@pytest.fixture(scope="session")
def demo_model(tmp_path_factory):
    """The random-weight demo (the shipped demo is trained and ends its replies early;
    the app's long-generation tests need a model that keeps going)."""
    from ssdmoe_tui.models.demo import write_random_demo

    return write_random_demo(tmp_path_factory.mktemp("demo") / "demo-model")

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.helpers import pace
from tests.helpers.checkpoints import build
from tests.helpers.real_shapes import build_real

TESTS = Path(__file__).resolve().parent
# Folders and modules whose tests start the app (pilot), a server, other processes or a
# real-shape model: `heavy`, left out of `make test-fast` (the edit-test loop), with every
# test that takes a model fixture (HEAVY_FIXTURES). Tune both with `pytest --durations=40`:
# the fast set stays under two minutes on 2 quiet CPU cores.
HEAVY = (
    "app/",
    "server/",
    "tools/test_ui_tools.py",
    "tools/test_attach_tools.py",
    "tools/test_hostile_text.py",  # the app, a pty'd `ssdmoe generate`
    "tools/test_hostile_servers.py",  # MCP servers that stall for their startup timeout
    "tools/test_server_deaths.py",  # MCP servers killed, the app
    "cli/test_bench.py",  # benchmarks on built checkpoints
    "cli/test_requant_fit.py",
    "engine/test_distributed.py",
    "engine/test_real_shapes.py",
    "engine/test_trace_routing.py",  # the engine on trace-shaped checkpoints
    "engine/test_reuse_policy.py",  # replays of held-out traces
    "engine/test_trace_defects.py",
    "faults/test_fault_kill.py",  # kill -9 trials in subprocesses
    "faults/test_fuzz.py",
    "models/test_demo_trained.py",  # the trained demo on held-out prose
)


# Fixtures that load a model or build a checkpoint: a test that takes one is heavy too.
HEAVY_FIXTURES = {"checkpoints", "real_checkpoints", "demo_model", "tool_model", "models"}


def pytest_collection_modifyitems(config, items) -> None:  # noqa: ANN001 - pytest's hook
    for item in items:
        where = Path(item.fspath).resolve().relative_to(TESTS).as_posix()
        if where.startswith(HEAVY) or HEAVY_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.heavy)


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


def _once_per_arch(root, make):  # noqa: ANN001, ANN202
    """arch -> make(arch, root / arch), made on first use and kept for the session."""
    made: dict = {}

    def get(arch: str):
        if arch not in made:
            made[arch] = make(arch, root / arch)
        return made[arch]

    return get


@pytest.fixture(scope="session")
def checkpoints(tmp_path_factory):
    """arch -> folder of a small random checkpoint, built once per test session."""
    return _once_per_arch(tmp_path_factory.mktemp("ckpt"), build)


@pytest.fixture(scope="session")
def real_checkpoints(tmp_path_factory):
    """arch -> (folder, real config) of a real-shape checkpoint (tests/helpers/real_shapes.py),
    built once per test session: tens of seconds each, shared by every module."""
    return _once_per_arch(tmp_path_factory.mktemp("real"), build_real)


@pytest.fixture(scope="session")
def demo_model(tmp_path_factory):
    """The random-weight demo (the shipped demo is trained and ends its replies early;
    the app's long-generation tests need a model that keeps going)."""
    from ssdmoe_tui.models.demo import write_random_demo

    return write_random_demo(tmp_path_factory.mktemp("demo") / "demo-model")

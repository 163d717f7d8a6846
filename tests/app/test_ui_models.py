"""The model picker (F4): what scan_models finds, unsupported ones disabled with the reason,
switching with the real engine, and the lock error of a second instance."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from huggingface_hub import constants

from ssdmoe_tui.engine.run.protocol import ModelInfo, PhaseChanged
from ssdmoe_tui.ui.app import ChatSettings, SsdmoeApp
from ssdmoe_tui.ui.fmt import fmt_bytes
from ssdmoe_tui.ui.screens.models import DEMO
from tests.helpers.pilot import (
    SIZE,
    errors,
    loaded,
    open_picker,
    option_text,
    send,
    wait_until,
)

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def model_dirs(tmp_path, monkeypatch, checkpoints):
    """SSDMOE_MODEL_DIRS: the tiny qwen3_5_moe and an incomplete copy (the demo model is
    found as the loaded model's folder)."""
    qwen = checkpoints("qwen3_5_moe")
    broken = tmp_path / "half-downloaded"
    broken.mkdir()
    (broken / "config.json").write_text((qwen / "config.json").read_text())
    index = {"weight_map": {"x.weight": "model-00001-of-00002.safetensors"}}
    (broken / "model.safetensors.index.json").write_text(json.dumps(index))
    dirs = os.pathsep.join(map(str, (qwen, broken)))
    monkeypatch.setenv("SSDMOE_MODEL_DIRS", dirs)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "no-hub"))
    return qwen, broken


async def test_picker_lists_models_and_switches_to_another(model_dirs, demo_model):
    qwen, broken = model_dirs
    app = SsdmoeApp(ChatSettings(model=str(demo_model), max_tokens=20))
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot, app)
        screen = await open_picker(pilot, app)
        by_path = {e.path: e for e in screen.entries}
        assert set(by_path) == {str(qwen), str(demo_model), str(broken)}
        q = by_path[str(qwen)]
        assert q.supported and q.architecture == "qwen3_5_moe"
        text = option_text(screen, str(qwen))
        for part in (
            "qwen3_5_moe",
            fmt_bytes(q.size_bytes),
            f"× {q.num_experts} experts",
            f"trained K {q.trained_k}",
            f"{q.mib_per_token:,.2f} MiB/token",
        ):
            assert part in text, (part, text)
        assert "(loaded)" in option_text(screen, str(demo_model))
        assert screen.option_list.highlighted == screen.option_list.get_option_index(
            str(demo_model)
        )
        bad = screen.option_list.get_option(str(broken))
        assert bad.disabled and "not supported: incomplete" in str(bad.prompt)
        # The built-in demo model (not written under this SSDMOE_HOME yet) is offered too.
        assert "built-in demo model" in option_text(screen, DEMO)

        events: list[ModelInfo] = []
        phases: list[PhaseChanged] = []
        model_loaded, show_phase = app.chat.model_loaded, app.panel.show_phase
        app.chat.model_loaded = lambda info, tok=None: (
            events.append(info),
            model_loaded(info, tok),
        )[1]
        app.panel.show_phase = lambda event: (phases.append(event), show_phase(event))[1]
        screen.option_list.highlighted = screen.option_list.get_option_index(str(qwen))
        await pilot.press("enter")
        await wait_until(pilot, lambda: events, 60, "ModelLoaded")
        info = events[-1]
        # The engine panel saw the switch: the old model unloaded, the new one indexed.
        assert phases[0].phase == "loading"
        assert any(p.phase == "loading" and "unloading" in p.detail for p in phases)
        assert any(p.phase == "indexing" and p.detail == str(qwen) for p in phases)
        assert info.model_type == "qwen3_5_moe" and info.path == str(qwen)
        await wait_until(pilot, lambda: app.chat.model is info, what="the app to take it")
        bar = str(app.status_bar.render())
        assert qwen.name in bar and fmt_bytes(info.expert_cache_budget) in bar
        assert app.panel.shown["mem_resident"] == fmt_bytes(info.resident_bytes)
        assert "K 4/16" in bar
        await send(pilot, "hi")
        assert app.chat.last_done.finish_reason in ("stop", "length") and app.chat.last_done.text
        # Picking the loaded model again does not reload it.
        screen = await open_picker(pilot, app)
        await pilot.press("enter")
        await wait_until(
            pilot,
            lambda: any("already loaded" in n.message for n in app._notifications),
            what="the 'already loaded' notice",
        )
        assert len(events) == 1


HOLDER = """
import sys, time
from ssdmoe_tui.models.lock import acquire_model_lock
lock = acquire_model_lock("/models/held-elsewhere")
print("held", flush=True)
sys.stdin.read()
"""


@contextlib.contextmanager
def lock_holder(script: str, *args: str) -> Iterator[subprocess.Popen]:
    """Another process holding a model claim (`script` prints "held", then waits on its
    stdin); killed on the way out."""
    holder = subprocess.Popen(
        [sys.executable, "-c", script, *args],
        cwd=REPO,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        yield holder
    finally:
        holder.kill()
        holder.wait()


async def test_second_instance_gets_the_lock_error_and_stays_usable(model_dirs, demo_model):
    qwen, _ = model_dirs
    with lock_holder(HOLDER) as holder:
        app = SsdmoeApp(ChatSettings(model=str(demo_model), max_tokens=20))
        async with app.run_test(size=SIZE) as pilot:
            await wait_until(pilot, lambda: errors(app), 60, "the lock error")
            (message,) = errors(app)
            assert "another ssdmoe is running" in message and f"pid {holder.pid}" in message
            assert "/models/held-elsewhere" in message and "\n" not in message
            assert app.chat.model is None
            # Still usable: the picker works, and once the other one quits, loading does.
            screen = await open_picker(pilot, app)
            screen.option_list.highlighted = screen.option_list.get_option_index(str(qwen))
            await pilot.press("enter")
            await wait_until(pilot, lambda: len(errors(app)) == 2, 60, "the second lock error")
            holder.stdin.close()
            holder.wait(10)
            screen = await open_picker(pilot, app)
            screen.option_list.highlighted = screen.option_list.get_option_index(str(qwen))
            await pilot.press("enter")
            await loaded(pilot, app)
            assert app.chat.model.model_type == "qwen3_5_moe"
            await send(pilot, "hi", what="a reply")
            assert app.chat.last_done.finish_reason in ("stop", "length")


MEMORY_HOLDER = """
import sys
from ssdmoe_tui.models.lock import acquire_model_lock
lock = acquire_model_lock("/models/held-elsewhere", need_bytes=int(sys.argv[1]))
print("held", flush=True)
sys.stdin.read()
"""


async def test_a_model_that_does_not_fit_beside_another_gets_the_numbers(demo_model, monkeypatch):
    """Issue 22 item 8: a holder declared 600 MiB on a (fake) 700 MiB machine; the app's
    demo load does not fit beside it: one line with the numbers, and the app stays up."""
    monkeypatch.setenv("SSDMOE_TEST_AVAILABLE_MEMORY", str(700 << 20))
    with lock_holder(MEMORY_HOLDER, str(600 << 20)) as holder:
        app = SsdmoeApp(ChatSettings(model=str(demo_model), max_tokens=20))
        async with app.run_test(size=SIZE) as pilot:
            await wait_until(pilot, lambda: errors(app), 60, "the memory error")
            (message,) = errors(app)
            assert "not enough memory for a second model: needs" in message, message
            assert f"600.0 MiB held by pid {holder.pid} (/models/held-elsewhere)" in message
            assert "700.0 MiB available" in message and "\n" not in message
            assert app.chat.model is None

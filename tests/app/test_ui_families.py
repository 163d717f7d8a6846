"""Every MoE family the engine streams, in the app (issue 44 item 7): the model picker
(F4) lists each with its size and MiB per token, and the engine panel's router mass
follows the family's routing function (a softmax, DeepSeek-V3's biased sigmoid, or none
measured: then it says "n/a" and why, not a "—" that never fills). Tiny random-weight
checkpoints of each family (tests/helpers/checkpoints.py), the real app and engine.
Thinking apart and tool calls per family's format: tests/app/test_ui_harmony.py
(gpt-oss, end to end), tests/prompting/test_reply_formats.py (DeepSeek-V3/R1, GLM, Kimi,
MiniMax templates: the app's split_reply)."""

from __future__ import annotations

import pytest
from huggingface_hub import constants
from textual.widgets import Sparkline

from ssdmoe_tui.checkpoint import arch
from ssdmoe_tui.commands.chat import engine_factory
from ssdmoe_tui.models.scan import read_config
from ssdmoe_tui.ui.app import ChatSettings, SsdmoeApp
from ssdmoe_tui.ui.fmt import fmt_bytes, fmt_pct
from tests.helpers.checkpoints import CONFIGS
from tests.helpers.pilot import SIZE, loaded, open_picker, option_text, send

STREAMED = sorted(f for f in CONFIGS if arch.family(CONFIGS[f]) is not None and f in arch.STREAMED)


async def test_f4_lists_every_streamed_family_with_its_size_and_mib_per_token(
    checkpoints, monkeypatch, tmp_path
):
    folders = {family: checkpoints(family) for family in STREAMED}  # ~0.05 s each
    monkeypatch.setenv("SSDMOE_MODEL_DIRS", ":".join(str(f) for f in folders.values()))
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "no-hub"))
    app = SsdmoeApp(ChatSettings(), engine_factory=None)
    async with app.run_test(size=(160, 50)) as pilot:
        screen = await open_picker(pilot, app)
        by_path = {e.path: e for e in screen.entries}
        for family, folder in folders.items():
            entry = by_path[str(folder)]
            assert entry.supported, (family, entry.reason)
            # the type the checkpoint names (gemma4_text's says gemma4) is this family's
            named = entry.architecture
            assert arch.family(read_config(folder)) is arch.ARCHITECTURES[family], named
            assert entry.mib_per_token > 0 and entry.num_experts > 0, family
            text = option_text(screen, str(folder))
            for part in (
                named,
                fmt_bytes(entry.size_bytes),
                f"trained K {entry.trained_k}",
                f"{entry.mib_per_token:,.2f} MiB/token",
            ):
                assert part in text, (family, part, text)
        assert len(folders) == len(arch.STREAMED) == 41


@pytest.mark.parametrize("family", ["deepseek_v3", "minimax"])
async def test_the_panels_router_mass_follows_the_familys_routing_function(checkpoints, family):
    """A sigmoid family (deepseek_v3) shows the mass the engine measured, below 100 %
    under the trained K, as a softmax one does (tests/engine/test_routing_mass.py, on
    qwen3_moe); a family with no routing function the meter computes (minimax) shows
    "n/a", says why, and draws no sparkline."""
    routing = arch.ARCHITECTURES[family].routing
    app = SsdmoeApp(
        ChatSettings(model=str(checkpoints(family)), k=1, max_tokens=8),
        engine_factory=engine_factory,
    )
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot, app)
        samples = []
        show = app.panel.show_sample
        app.panel.show_sample = lambda s: (samples.append(s), show(s))[1]
        await send(pilot, "hi")
        await pilot.pause(0.1)
        last = samples[-1]
        panel = app.panel
        spark = panel.query_one("#spark-mass", Sparkline)
        tip = str(panel.query_one("#row-mass").tooltip)
        if routing == "none":
            assert last.routing_mass is None and panel.shown["mass"] == "n/a"
            assert f"Not measured for {family}" in tip and not spark.data
        else:
            assert routing == "sigmoid"
            assert last.k == 1 and last.routing_mass is not None and 0 < last.routing_mass < 1
            assert panel.shown["mass"] == fmt_pct(last.routing_mass)
            assert "Not measured" not in tip and spark.data

"""Speculative decoding in the app: F9 sets it per conversation (a bad value named on
the screen), the palette's entries set it too, a reply speculates and the engine panel
shows its acceptance, tokens per pass and cost per token; greedy replies are unchanged."""

from __future__ import annotations

import pytest

from ssdmoe_tui.commands.chat import engine_factory
from ssdmoe_tui.ui.actions import gen_settings
from ssdmoe_tui.ui.app import ChatSettings, SsdmoeApp
from tests.helpers.pilot import (
    SIZE,
    loaded,
    open_settings,
    save_settings,
    settings_error,
    type_and_send,
    wait_until,
)


async def _reply(pilot, app, before):
    await wait_until(
        pilot, lambda: app.inflight is None and app.chat.last_done is not before, 60, "a reply"
    )
    return app.chat.last_done


async def test_f9_speculation_per_conversation_and_the_panel(demo_model):
    app = SsdmoeApp(
        ChatSettings(model=str(demo_model), max_tokens=24), engine_factory=engine_factory
    )
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot, app)
        await type_and_send(pilot, "say it again: one two three, one two three")
        plain = await _reply(pilot, app, None)
        assert plain.stats.get("speculation") is None
        assert not app.panel.query_one("#spec-title").display

        screen = await open_settings(pilot)
        # F9 says what speculation promises where (issue 44 item 2): the hint's tooltip
        tips = [str(h.tooltip) for h in screen.query(".setting-hint") if h.tooltip]
        assert any("MLX-CUDA" in t and "near-ties may flip" in t for t in tips), tips
        await save_settings(pilot, screen, speculate="7")
        assert app.screen is screen
        assert "Speculate: '7'" in settings_error(screen)
        await save_settings(pilot, screen, speculate="ngram")
        assert app.chat.gen.speculate == "ngram"

        # The same prompt again, greedy: the same reply, now speculating.
        await pilot.press("ctrl+g")
        spec = await _reply(pilot, app, plain)
        assert spec.token_ids == plain.token_ids
        sp = spec.stats["speculation"]
        assert sp["mode"] == "ngram" and sp["tokens_per_pass"] >= 1.0
        panel = app.panel
        await wait_until(pilot, lambda: panel.query_one("#spec-title").display, what="panel")
        assert panel.shown.get("spec_pass") == f"{sp['tokens_per_pass']:.2f}"
        assert "ms" in panel.shown.get("spec_cost", "")
        # the speed it bought (issue 44 item 2): a plain step's measured time over the
        # reply's own time per token
        assert sp["plain_ms_per_token"] > 0 and sp["speedup"] > 0
        assert sp["speedup"] == pytest.approx(
            sp["plain_ms_per_token"] / sp["ms_per_token"], rel=0.01
        )
        assert panel.shown.get("spec_gain") == f"≈{sp['speedup']:.2f}x"
        assert "What speculation bought" in str(panel.query_one("#row-spec_gain").tooltip)
        assert "near-ties may flip" in str(panel.query_one("#row-spec_accept").tooltip)

        gen_settings.set_speculate(app, "off")
        assert app.chat.gen.speculate == "off"

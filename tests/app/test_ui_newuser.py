"""What a new user tripped on (issue 22), each through the pilot on fixed engine events
(no engine thread: fast) unless it needs the real one."""

from __future__ import annotations

import shutil

import pytest

from ssdmoe_tui import paths
from ssdmoe_tui.ui.app import ChatSettings, SsdmoeApp
from ssdmoe_tui.ui.widgets.transcript import Notice
from tests.app.test_ui_app import loaded, wait_until
from tests.app.test_ui_snapshot import setup


async def test_page_keys_scroll_the_transcript_while_the_prompt_has_focus():
    app = SsdmoeApp(ChatSettings(), engine_factory=None)
    async with app.run_test(size=(80, 24)) as pilot:
        await setup(pilot)
        transcript = app.chat_pane.transcript
        for i in range(12):
            await transcript.add_user(f"question {i}\n" * 3)
        transcript.action_pin()
        await pilot.pause()
        await wait_until(pilot, lambda: transcript.scroll_y == transcript.max_scroll_y > 0, 5)
        bottom = transcript.scroll_y
        assert app.focused is app.chat_pane.prompt
        await pilot.press("pageup")
        assert app.focused is app.chat_pane.prompt
        await wait_until(pilot, lambda: transcript.scroll_y < bottom, 5, "PageUp to scroll")
        await pilot.press("ctrl+home")
        await wait_until(pilot, lambda: transcript.scroll_y == 0, 5, "ctrl+home to the top")
        await pilot.press("pagedown")
        await wait_until(pilot, lambda: transcript.scroll_y > 0, 5, "PageDown to scroll")
        await pilot.press("ctrl+end")
        await wait_until(pilot, lambda: transcript.scroll_y == transcript.max_scroll_y, 5)


def screen_text(app: SsdmoeApp) -> str:
    """What the terminal shows now, as plain text."""
    return "\n".join(strip.text for strip in app.screen._compositor.render_strips())


FIRST_SCREEN = ("demo model: random weights", "word salad", "A real model: F4 here", "--model")


@pytest.mark.parametrize("size", [(80, 24), (200, 60)])
async def test_the_first_screen_says_what_the_demo_is_and_how_to_open_a_real_model(
    demo_model, size
):
    shutil.copytree(demo_model, paths.demo_model_dir())  # the embedded demo, written once
    app = SsdmoeApp(ChatSettings())
    async with app.run_test(size=size) as pilot:
        await pilot.pause()
        first = screen_text(app)
        for part in FIRST_SCREEN:
            assert part in first, (part, first)
        await loaded(pilot, app)
        notices = app.chat_pane.transcript.query(Notice)
        await wait_until(pilot, lambda: any("Loaded" in str(n.render()) for n in notices), 5)
        await pilot.pause(0.2)
        after = screen_text(app)
        for part in (*FIRST_SCREEN, "demo-model is ready"):
            assert part in after, (part, after)

"""What a new user tripped on (issue 22), each through the pilot on fixed engine events
(no engine thread: fast) unless it needs the real one."""

from __future__ import annotations

from ssdmoe_tui.ui.app import ChatSettings, SsdmoeApp
from tests.app.test_ui_app import wait_until
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

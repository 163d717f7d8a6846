"""Widgets on their own: the prompt box, the K control, the transcript (no engine needed)."""

from __future__ import annotations

from textual import events
from textual.app import App, ComposeResult
from textual.widget import Widget
from textual.widgets.markdown import MarkdownFence

from ssdmoe_tui.config import load_config
from ssdmoe_tui.ui.app import ChatSettings, SsdmoeApp
from ssdmoe_tui.ui.fmt import mib_per_token
from ssdmoe_tui.ui.widgets.k_slider import KSlider
from ssdmoe_tui.ui.widgets.prompt_input import PromptInput
from ssdmoe_tui.ui.widgets.transcript import AssistantMessage, Transcript, code_blocks
from tests.helpers.pilot import wait_until


class Alone(App):
    """One widget alone in an app; `got` keeps what its messages carried, in order."""

    def __init__(self, widget: Widget) -> None:
        super().__init__()
        self.widget = widget
        self.got: list = []

    def compose(self) -> ComposeResult:
        yield self.widget


class PromptApp(Alone):
    """The prompt box; `got`: the texts it sent (each clears it, as the chat pane does)."""

    def __init__(self) -> None:
        super().__init__(PromptInput(id="prompt"))

    def on_prompt_input_submitted(self, event: PromptInput.Submitted) -> None:
        self.got.append(event.text)
        event.prompt.clear()


async def test_enter_sends_and_newline_keys_insert_newlines():
    app = PromptApp()
    async with app.run_test() as pilot:
        prompt = app.query_one(PromptInput)
        prompt.focus()
        await pilot.press("a", "ctrl+j", "b", "shift+enter", "c")
        assert prompt.text == "a\nb\nc"
        await pilot.press("enter")
        assert app.got == ["a\nb\nc"] and prompt.text == ""
        await pilot.press("enter")  # empty prompts are not sent
        assert app.got == ["a\nb\nc"]


async def test_paste_keeps_newlines():
    app = PromptApp()
    async with app.run_test() as pilot:
        prompt = app.query_one(PromptInput)
        prompt.focus()
        app.post_message(events.Paste("line one\nline two\n\nline four"))
        await pilot.pause()
        assert prompt.text == "line one\nline two\n\nline four"
        assert app.got == []  # a pasted newline is not Enter


async def test_up_and_down_walk_the_prompt_history_from_first_and_last_line():
    app = PromptApp()
    async with app.run_test() as pilot:
        prompt = app.query_one(PromptInput)
        prompt.focus()
        for text in ("first", "second"):
            await pilot.press(*text, "enter")
        await pilot.press("d", "r", "a", "f", "t")
        await pilot.press("up")
        assert prompt.text == "second"
        await pilot.press("up")
        assert prompt.text == "first"
        await pilot.press("up")  # stays at the oldest
        assert prompt.text == "first"
        await pilot.press("down")
        assert prompt.text == "second"
        await pilot.press("down")
        assert prompt.text == "draft"  # back to what was being typed
        # Inside a multi-line prompt, up/down move the cursor instead.
        prompt.load_text("x\ny")
        prompt.move_cursor((1, 1))
        await pilot.press("up")
        assert prompt.text == "x\ny" and prompt.cursor_location[0] == 0


class SliderApp(Alone):
    """The K control; `got`: each K it announced."""

    def __init__(self) -> None:
        super().__init__(KSlider(id="k"))

    def on_kslider_changed(self, event: KSlider.Changed) -> None:
        self.got.append(event.k)


async def test_k_slider_keys_click_range_and_labels():
    app = SliderApp()
    async with app.run_test(size=(42, 6)) as pilot:
        slider = app.query_one(KSlider)
        assert "no model" in str(slider.render())
        slider.configure(num_experts=32, trained_k=4, k=4, expert_bytes=122880, num_layers=6)
        slider.focus()
        await pilot.pause()
        text = str(slider.render())
        assert "K 4 of 32" in text and "= trained K" in text
        assert f"{mib_per_token(122880, 4, 6):.2f} MiB/token" in text
        await pilot.press("right", "plus", "equals_sign")
        assert slider.k == 7 and "above trained K" in str(slider.render())
        await pilot.press("left", "minus", "minus", "minus", "minus")
        assert slider.k == 2
        assert "speed/quality trade-off" in str(slider.render())
        await pilot.press("home")
        assert slider.k == 1
        await pilot.press("left")  # clamped
        assert slider.k == 1
        await pilot.press("end")
        assert slider.k == 32
        assert app.got == [5, 6, 7, 6, 5, 4, 3, 2, 1, 32]
        # A click on the track sets K from the position: the left end is 1, the right end 32.
        await pilot.click(KSlider, offset=(1, 1))
        assert slider.k == 1
        width = slider.content_size.width - 2
        await pilot.click(KSlider, offset=(width, 1))
        assert slider.k == 32
        await pilot.click(KSlider, offset=(1 + width // 2, 1))
        assert 14 <= slider.k <= 18


class TranscriptApp(App):
    def compose(self) -> ComposeResult:
        yield Transcript()


REPLY = "Here:\n\n```python\nprint('hi')\n```\n\nand\n\n```\nls -l\n```\n"


async def test_streamed_reply_code_blocks_copy_by_key_and_click():
    app = TranscriptApp()
    async with app.run_test(size=(80, 30)) as pilot:
        transcript = app.query_one(Transcript)
        reply = await transcript.add_assistant("r1", "demo")
        for i in range(0, len(REPLY), 7):
            await reply.append(REPLY[i : i + 7])
        await reply.finish(REPLY, "stop")
        await pilot.pause()
        assert code_blocks(reply.text) == ["print('hi')\n", "ls -l\n"]
        reply.focus()
        await pilot.press("b")
        assert app.clipboard == "print('hi')\n"
        await pilot.press("b")
        assert app.clipboard == "ls -l\n"
        await pilot.press("c")
        assert app.clipboard == REPLY
        fences = list(reply.query(MarkdownFence))
        assert len(fences) == 2
        app.copy_to_clipboard("")
        await pilot.click(fences[1])
        assert app.clipboard == "ls -l"
        await pilot.click(reply.query_one(".copy"))
        assert app.clipboard == REPLY


async def test_transcript_follows_until_scrolled_up_and_end_repins():
    app = TranscriptApp()
    async with app.run_test(size=(60, 12)) as pilot:
        transcript = app.query_one(Transcript)
        reply = await transcript.add_assistant("r1", "demo")
        for i in range(40):
            await reply.append(f"line {i}\n\n")
        await pilot.pause(0.5)
        assert transcript.max_scroll_y > 0
        assert transcript.scroll_y == transcript.max_scroll_y  # following
        transcript.focus()
        await pilot.press("pageup", "pageup")
        await pilot.pause(0.2)
        held = transcript.scroll_y
        assert held < transcript.max_scroll_y
        for i in range(10):
            await reply.append(f"more {i}\n\n")
        await pilot.pause(0.2)
        assert transcript.scroll_y == held  # the user's position is kept
        await pilot.press("end")
        await pilot.pause(0.2)
        for i in range(10):
            await reply.append(f"again {i}\n\n")
        await pilot.pause(0.2)
        assert transcript.scroll_y == transcript.max_scroll_y  # following again
        assert isinstance(reply, AssistantMessage) and reply.appends == 60


async def test_theme_choice_is_remembered_in_config(ssdmoe_home):
    settings = ChatSettings(config=load_config())
    app = SsdmoeApp(settings, engine_factory=None)
    async with app.run_test() as pilot:
        assert app.theme == "ssdmoe-dark"
        app.theme = "ssdmoe-light"
        await pilot.pause()
    assert load_config().config.theme == "ssdmoe-light"


async def test_bad_config_is_reported_and_not_overwritten(ssdmoe_home):
    path = ssdmoe_home / "config" / "config.toml"
    path.parent.mkdir(parents=True)
    path.write_text("theme = [\n")
    loaded = load_config()
    app = SsdmoeApp(ChatSettings(config=loaded, warnings=loaded.warnings), engine_factory=None)
    async with app.run_test() as pilot:
        notes = [n.message for n in app._notifications]
        assert any("bad TOML" in n and str(path) in n for n in notes)
        app.theme = "ssdmoe-light"
        # The notice follows the save attempt (a step of its own): waited for, not assumed.
        await wait_until(
            pilot, lambda: any("not saved" in n.message for n in app._notifications), what="notice"
        )
    assert path.read_text() == "theme = [\n"


async def test_end_in_the_prompt_repins_the_transcript():
    app = SsdmoeApp(ChatSettings(), engine_factory=None)
    async with app.run_test(size=(100, 24)) as pilot:
        for i in range(30):
            await app.chat_pane.transcript.add_notice(f"note {i}")
        await pilot.pause(0.2)
        transcript = app.chat_pane.transcript
        assert transcript.scroll_y == transcript.max_scroll_y > 0
        transcript.scroll_home(animate=False)  # as a user scrolling up would
        transcript.release_anchor()
        await pilot.pause(0.1)
        assert transcript.scroll_y == 0
        app.chat_pane.prompt.focus()
        await pilot.press("a", "b", "left", "end")  # first End: to the line end
        assert app.chat_pane.prompt.cursor_location == (0, 2) and transcript.scroll_y == 0
        await pilot.press("end")  # already there: follow the conversation again
        await pilot.pause(0.2)
        assert transcript.scroll_y == transcript.max_scroll_y
        await app.chat_pane.transcript.add_notice("one more")
        await pilot.pause(0.2)
        assert transcript.scroll_y == transcript.max_scroll_y


async def test_k_slider_without_a_model_ignores_keys():
    app = SliderApp()
    async with app.run_test(size=(42, 6)) as pilot:
        slider = app.query_one(KSlider)
        slider.configure(num_experts=8, trained_k=2, k=2, expert_bytes=1, num_layers=1)
        slider.configure(num_experts=0, trained_k=0, k=1, expert_bytes=0, num_layers=0)
        slider.focus()
        await pilot.press("right")
        assert "no model" in str(slider.render()) and app.got == []

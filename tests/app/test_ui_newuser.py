"""What a new user tripped on (issue 22), each through the pilot on fixed engine events
(no engine thread: fast) unless it needs the real one."""

from __future__ import annotations

import shutil
import threading
from pathlib import Path

import pytest
from textual.widgets import Input, Label, TextArea

from ssdmoe_tui import paths
from ssdmoe_tui.chat.progress import PrefillClock
from ssdmoe_tui.commands.chat import engine_factory
from ssdmoe_tui.engine.run.protocol import EngineError, GenerationDone, PhaseChanged
from ssdmoe_tui.models.demo import ensure_demo_model
from ssdmoe_tui.prompting.message import Message
from ssdmoe_tui.sessions.app_sessions import AppSessions
from ssdmoe_tui.sessions.store import SessionStore
from ssdmoe_tui.ui.app import ChatSettings, SsdmoeApp, screenshots_dir
from ssdmoe_tui.ui.commands import SsdmoeCommands
from ssdmoe_tui.ui.screens.dialogs import ConfirmScreen
from ssdmoe_tui.ui.screens.gen_settings import GenSettingsScreen
from ssdmoe_tui.ui.widgets.transcript import AssistantMessage, Notice
from tests.helpers.pilot import loaded, record_notifications, screen_text, wait_until
from tests.helpers.ui_events import open_by_key, setup


async def test_page_keys_scroll_the_transcript_while_the_prompt_has_focus():
    app = SsdmoeApp(ChatSettings(), engine_factory=None)
    async with app.run_test(size=(80, 24)) as pilot:
        await setup(pilot)
        transcript = app.chat_pane.transcript
        for i in range(12):
            await transcript.add_user(f"question {i}\n" * 3)
        transcript.action_pin()
        await pilot.pause()
        await wait_until(pilot, lambda: transcript.scroll_y == transcript.max_scroll_y > 0)
        bottom = transcript.scroll_y
        assert app.focused is app.chat_pane.prompt
        await pilot.press("pageup")
        assert app.focused is app.chat_pane.prompt
        await wait_until(pilot, lambda: transcript.scroll_y < bottom, what="PageUp to scroll")
        await pilot.press("ctrl+home")
        await wait_until(pilot, lambda: transcript.scroll_y == 0, what="ctrl+home to the top")
        await pilot.press("pagedown")
        await wait_until(pilot, lambda: transcript.scroll_y > 0, what="PageDown to scroll")
        await pilot.press("ctrl+end")
        await wait_until(pilot, lambda: transcript.scroll_y == transcript.max_scroll_y)


FIRST_SCREEN = (
    "demo model: tiny, trained here",
    "knows little",
    "A real model: F4 here",
    "--model",
)


@pytest.mark.parametrize("size", [(80, 24), (200, 60)])
async def test_the_first_screen_says_what_the_demo_is_and_how_to_open_a_real_model(
    demo_model, size
):
    ensure_demo_model(paths.demo_model_dir())  # the embedded (trained) demo
    app = SsdmoeApp(ChatSettings())
    async with app.run_test(size=size) as pilot:
        await pilot.pause()
        first = screen_text(app)
        for part in FIRST_SCREEN:
            assert part in first, (part, first)
        await loaded(pilot, app)
        notices = app.chat_pane.transcript.query(Notice)
        await wait_until(pilot, lambda: any("Loaded" in str(n.render()) for n in notices))
        await pilot.pause(0.2)
        after = screen_text(app)
        for part in (*FIRST_SCREEN, "demo-model is ready"):
            assert part in after, (part, after)


async def test_f9_starts_on_the_system_prompt_and_every_line_fits():
    app = SsdmoeApp(ChatSettings(), engine_factory=None)
    async with app.run_test(size=(80, 24)) as pilot:
        await open_by_key(pilot, "f9", GenSettingsScreen)
        screen = app.screen
        box = screen.query_one("#set-system_prompt", TextArea)
        assert app.focused is box  # typing goes to the system prompt
        await pilot.press("h", "i")
        assert box.text == "hi"
        assert box.styles.border_top[0] not in ("", "none")  # it can be seen
        text = screen_text(app)
        dialog = screen.query_one("#gen-settings")
        for label in screen.query(Label):
            words = str(label.render()).split()
            if words and label.display:  # every word of every line is on screen, inside
                assert words[-1] in text, (words, text)
                assert label.region.right <= dialog.region.right, str(label.render())
        # Top-p 0 is "off", not "keep nothing"; an empty field saves 0.
        top_p = screen.query_one("#set-top_p", Input)
        assert top_p.value == "" and "off" in text
        await pilot.press("ctrl+s")
        await wait_until(pilot, lambda: not isinstance(app.screen, GenSettingsScreen))
        assert app.chat.gen.top_p == 0.0 and app.chat.gen.system_prompt == "hi"
        # The delete confirmation's question wraps too.
        question = "Delete “" + "a long conversation title " * 3 + "”? This cannot be undone."
        app.push_screen(ConfirmScreen(question, yes="Delete"))
        await pilot.pause(0.2)
        assert "undone." in screen_text(app)


async def test_a_new_chat_starts_from_the_configs_k():
    app = SsdmoeApp(ChatSettings(), engine_factory=None)
    async with app.run_test(size=(120, 40)) as pilot:
        await setup(pilot)
        control = app.panel.k_control
        assert control.k == 6  # the model reported K 6 (trained 8)
        await pilot.press("ctrl+up")
        assert control.k == 7
        await pilot.press("ctrl+n")
        await wait_until(pilot, lambda: control.k == 8, what="the trained K")
        assert app.status_bar.k == 8


def test_prefill_clock_moves_between_reports_and_never_claims_done():
    clock = PrefillClock()
    clock.report(0, 1261, now=100.0)
    assert clock.text(now=103.0) == "0/1,261 · 3 s"  # no rate known yet: the time moves
    clock.report(1261, 1261, now=110.0)  # the engine's end of prefill: 126 tok/s
    clock.report(0, 1261, now=200.0)  # the next prefill, one chunk, no report until done
    assert clock.estimate(now=205.0) == (630, True)
    assert clock.text(now=205.0) == "≈630/1,261 · 126 tok/s · ~5 s left"
    assert clock.estimate(now=300.0) == (1260, True)  # only the engine says it is done
    clock.learn({"not": "a rate"})
    assert clock.rate == 126.1


async def test_prefill_progress_moves_with_its_rate_and_time_left():
    app = SsdmoeApp(ChatSettings(), engine_factory=None)
    async with app.run_test(size=(120, 40)) as pilot:
        await setup(pilot)
        app.feed(PhaseChanged("prefill", 0, 40))
        await pilot.pause(0.5)
        app.feed(PhaseChanged("decoding", 40, 40))  # a first prefill: its rate is known
        await pilot.pause(0.1)
        app.feed(PhaseChanged("prefill", 0, 100_000))  # one chunk: no report until done
        await wait_until(pilot, lambda: "prefill" in app.panel.shown["phase"])
        shown = [app.panel.shown["phase"]]
        bar = app.panel.query_one("#phase-progress")
        first = bar.progress
        for _ in range(3):
            await pilot.pause(0.3)
            shown.append(app.panel.shown["phase"])
        assert len(set(shown)) > 1, shown  # it moves
        assert "≈" in shown[-1] and "tok/s" in shown[-1] and "left" in shown[-1], shown
        assert bar.progress > first
        assert "≈" in str(app.status_bar.render())
        app.feed(PhaseChanged("decoding", 100_000, 100_000))
        await wait_until(pilot, lambda: app.status_bar.phase == "decoding")


async def test_restored_replies_keep_hit_max_tokens_and_kv_hit_on_one_header_line():
    sessions = AppSessions(SessionStore())
    sid, _ = sessions.open(None)
    stats = {"decode_tok_s": 12.5, "kv_hit_rate": 0.97}
    done = GenerationDone(
        "r1", "Hello " * 30, (1, 2, 3), tuple(range(60)), "length", (4,) * 60, stats
    )
    sessions.record(
        sid, [Message("user", "Hi"), Message("assistant", done.text)], done, "Qwen3-30B-A3B-4bit"
    )
    assert "hit max tokens" in sessions.store.export_markdown(sid)
    app = SsdmoeApp(ChatSettings(resume=sid), engine_factory=None, session_store=sessions)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        (reply,) = app.query(AssistantMessage)
        header = str(reply.header_text())
        for part in ("[hit max tokens]", "60 tokens", "12.5 tok/s", "K 4", "KV hit 97%"):
            assert part in header, (part, header)
        title = reply.query_one(".message-title")
        # Every figure on screen, the copy button beside it: wrapped where it does not fit
        # on one line (issue 33 N21: it was cut with "…").
        assert 1 <= title.region.height <= 2
        assert reply.query_one(".copy").region.y == title.region.y


async def test_screenshot_says_where_it_saved_or_where_it_could_not(ssdmoe_home):
    app = SsdmoeApp(ChatSettings(), engine_factory=None)
    async with app.run_test(size=(80, 24)) as pilot:
        said = record_notifications(app)
        commands = {c.title: c for c in app.get_system_commands(app.screen)}
        assert str(screenshots_dir()) in commands["Screenshot"].help
        app.save_screenshot_here()
        (saved,) = screenshots_dir().glob("*.svg")
        assert said[-1] == ("information", f"Screenshot saved: {saved} (path copied)")
        shutil.rmtree(screenshots_dir())
        screenshots_dir().write_text("in the way")  # the folder cannot be made
        app.save_screenshot_here()
        severity, line = said[-1]
        assert severity == "error" and str(screenshots_dir()) in line and "\n" not in line
        await pilot.pause()


async def test_app_errors_use_the_apps_words_and_the_palette_agrees_with_the_readme():
    app = SsdmoeApp(ChatSettings(), engine_factory=None)
    async with app.run_test(size=(120, 40)) as pilot:
        await setup(pilot)
        said = record_notifications(app)
        app.feed(EngineError("--model /no/such: no such file or folder"))
        await wait_until(pilot, lambda: said, what="the error")
        assert said[-1][1] == "model /no/such: no such file or folder"
        notices = [str(n.render()) for n in app.chat_pane.transcript.query(Notice)]
        assert not any("--model" in n for n in notices), notices
        helps = {title: text for title, text, _ in SsdmoeCommands(app.screen)._static()}
    docs = (Path(__file__).resolve().parents[2] / "docs" / "app.md").read_text()
    assert "new chat (the conversation stays saved)" in docs  # what the palette now says too
    assert "stays saved" in helps["New chat"] and "= New chat" in helps["Clear conversation"]


async def test_the_first_frame_comes_before_the_engine_is_built(demo_model):
    """Issue 22, defect 6: building the engine imports MLX, mlx-lm and transformers
    (seconds); the screen is drawn and answers keys first."""
    ensure_demo_model(paths.demo_model_dir())
    release, built = threading.Event(), threading.Event()

    def slow_factory(post):
        release.wait(20)  # as a slow import would: the app must not wait for it
        engine = engine_factory(post)
        built.set()
        return engine

    app = SsdmoeApp(ChatSettings(), engine_factory=slow_factory)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause(0.2)
        assert not built.is_set()
        assert "demo model: tiny, trained here" in screen_text(app)
        assert "starting the engine" in screen_text(app)
        await pilot.press("h", "i")
        assert app.chat_pane.prompt.text == "hi"  # keys work meanwhile
        said = record_notifications(app)
        await pilot.press("enter")
        assert said[-1] == ("warning", "The engine is starting; send again in a moment.")
        release.set()
        await loaded(pilot, app)
        assert built.is_set()

"""Issue 14's app bugs and issue 10's lifecycle bugs, each driven through the pilot.

The first two tests feed fixed engine events (no engine thread: fast); the last one runs
the real engine on the demo model once and tries every bad input on it.
"""

from __future__ import annotations

import argparse
from dataclasses import replace

from textual.widgets import Input, Label, Static

from ssdmoe_tui.commands import chat
from ssdmoe_tui.config import DEFAULT_THEME, config_path, ensure_config_file, load_config
from ssdmoe_tui.engine.run.protocol import GenerationDone
from ssdmoe_tui.prompting.message import Message
from ssdmoe_tui.sessions.app_sessions import AppSessions
from ssdmoe_tui.sessions.store import SessionStore
from ssdmoe_tui.ui.app import ChatSettings, SsdmoeApp
from ssdmoe_tui.ui.screens.dialogs import AskScreen
from ssdmoe_tui.ui.screens.models import OTHER, ModelsScreen
from ssdmoe_tui.ui.widgets.engine_panel import ROWS, Row
from ssdmoe_tui.ui.widgets.transcript import AssistantMessage
from tests.helpers.pilot import (
    SIZE,
    loaded,
    record_notifications,
    send,
    wait_until,
)
from tests.helpers.ui_events import INFO, REPLY, setup


async def test_80x24_shows_every_figure_and_f8_copies_from_the_prompt():
    app = SsdmoeApp(ChatSettings(), engine_factory=None)
    async with app.run_test(size=(80, 24)) as pilot:
        await setup(pilot)
        panel = app.panel
        # Every figure of the panel is on screen: nothing to scroll, the panel ends
        # above the footer, and each label keeps a gap before its value.
        assert panel.max_scroll_y == 0, panel.virtual_size
        assert panel.region.bottom <= app.screen.region.bottom - 1
        for row in panel.query(Row):
            if row.key.startswith("spec_"):  # shown only while a reply speculates: below
                assert not row.display
                continue
            label = row.query_one(".row-label", Label)
            value = row.query_one(f"#v-{row.key}", Static)
            assert row.region.height == 1 and row.region.bottom <= panel.region.bottom
            assert label.content_region.right < value.region.x, row.key
            assert str(value.render()) != "—", row.key
        assert {row.key for row in panel.query(Row)} == set(ROWS)
        # A reply that speculates: its rows show (the panel may scroll to them).
        sp = {"accepted": 33, "drafted": 46, "acceptance": 0.7174, "tokens_per_pass": 1.26,
              "bytes_per_token": 0, "ms_per_token": 28.0}  # fmt: skip
        panel.show_sample(replace(panel.last_sample, speculation=sp))
        await pilot.pause()
        assert "(33/46)" in panel.shown["spec_accept"]
        assert panel.shown["spec_pass"] == "1.26" and "28.0 ms" in panel.shown["spec_cost"]
        assert all(panel.query_one(f"#row-{k}").display for k in ("spec_accept", "spec_pass"))
        panel.show_sample(replace(panel.last_sample, speculation=None))
        await pilot.pause()
        assert panel.max_scroll_y == 0
        meter = panel.query_one("#context-meter")
        assert meter.region.bottom <= panel.region.bottom and meter.region.height == 1
        # Device bytes and page-cache bytes are told apart (the sample read 486 MiB a
        # token, 48 of them from the SSD).
        assert panel.shown["ssd"] == "48.00 MiB" and panel.shown["page_cache"] == "438.00 MiB"
        # The header keeps the model, K, the cache budget and the phase.
        header = str(app.status_bar.render())
        assert app.status_bar.render().cell_len <= app.status_bar.content_size.width
        for part in (INFO.name, "K 6/128", "cache 4.00 GiB", "idle"):
            assert part in header, (part, header)
        # The prompt's hint fits its box.
        prompt = app.chat_pane.prompt
        assert len(prompt.placeholder) <= prompt.content_size.width
        # F8 copies the last reply while the prompt has focus (ctrl+y is the prompt's redo).
        assert app.focused is prompt
        await pilot.press("f8")
        assert app.clipboard == REPLY
        assert f"({len(REPLY)} characters)" in list(app._notifications)[-1].message


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    chat.add_arguments(parser)
    return parser.parse_args(list(argv))


async def test_resume_keeps_model_stats_and_k_range_and_a_bad_theme_only_warns(ssdmoe_home):
    # First run: the commented template is written, never over an existing file.
    path = config_path()
    assert ensure_config_file() is None
    template = path.read_text()
    assert "# k = 4" in template and "f4" not in template.lower()
    assert load_config().config == load_config(path).config and not load_config().warnings
    mine = 'theme = "no-such-theme"\n# my notes\n'
    path.write_text(mine)
    ensure_config_file()
    assert path.read_text() == mine
    # A reply during which K went from 4 to 6, saved by the app's session hook.
    store = SessionStore()
    sessions = AppSessions(store)
    sid, _ = sessions.open(None)
    done = GenerationDone(
        "r1", "Hello there", (1, 2, 3), (5, 6, 7, 8), "stop", (4, 4, 6, 6), {"decode_tok_s": 7.5}
    )
    chat_so_far = [Message("user", "Hi"), Message("assistant", "Hello there")]
    sessions.record(sid, chat_so_far, done, "demo-model")
    assert "(K=4–6)" in store.export_markdown(sid)

    settings = chat.build_settings(parse("--resume"), load_config())
    app = SsdmoeApp(settings, engine_factory=None, session_store=sessions)
    # Every notification as posted: a toast expires after its 10 s, which a loaded
    # machine can pass before the assertions below run.
    posted: list[tuple[str, str]] = []
    notify = app.notify
    app.notify = lambda message, **kw: (  # type: ignore[method-assign]
        posted.append((kw.get("severity", "information"), str(message))),
        notify(message, **kw),
    )[1]
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        (reply,) = app.query(AssistantMessage)
        header = str(reply.header_text())
        for part in ("demo-model", "4 tokens", "7.5 tok/s", "K 4–6"):
            assert part in header, (part, header)
        assert app.chat.history == chat_so_far
        assert app.theme == DEFAULT_THEME
        (warning,) = [m for sev, m in posted if sev == "warning" and "no-such-theme" in m]
        assert "\n" not in warning
    assert path.read_text() == mine  # the user's config is never rewritten


async def palette(pilot, text: str) -> None:
    await pilot.press("ctrl+p")
    await pilot.press(*text)
    await pilot.pause(0.3)
    await pilot.press("enter")
    await pilot.pause(0.1)


async def test_bad_values_and_typos_keep_the_loaded_model(demo_model):
    """k = 999 from the config/CLI, `cache banana` and `open <typo>` from the palette, and
    a typo in F4's "Other folder…" dialog: one line each, the model stays loaded and
    usable, and no bad value is kept in the settings."""
    app = SsdmoeApp(ChatSettings(model=str(demo_model), k=999, max_tokens=12))
    said = record_notifications(app)

    def errors(app) -> list[str]:
        return [message for severity, message in said if severity == "error"]

    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot, app)
        info = app.chat.model
        await wait_until(pilot, lambda: said, what="the K warning")
        (k_warning,) = [m for severity, m in said if "999" in m and severity == "warning"]
        assert "\n" not in k_warning and f"1..{info.num_experts}" in k_warning
        assert app.panel.k_control.k == info.trained_k and app.settings.k is None

        def one_line(n: int, needle: str) -> None:
            assert len(errors(app)) == n, errors(app)
            message = errors(app)[-1]
            assert needle in message and "\n" not in message and "Traceback" not in message

        def still_loaded() -> None:
            assert app.chat.model is info and app.chat.loading is None
            assert info.name in str(app.status_bar.render())
            assert app.settings.expert_cache == "auto"

        await palette(pilot, "cache banana")
        one_line(1, "banana")
        still_loaded()

        await palette(pilot, "open /nonexistent/typo-one")
        await wait_until(pilot, lambda: len(errors(app)) == 2, 60, "the open error")
        await wait_until(pilot, lambda: app.chat.loading is None, what="the load to end")
        one_line(2, "typo-one")
        still_loaded()

        # F4 → "Other folder or Hugging Face repo id…": Enter in its dialog opens it.
        await pilot.press("f4")
        await wait_until(pilot, lambda: isinstance(app.screen, ModelsScreen), what="F4")
        screen = app.screen
        await wait_until(pilot, lambda: screen.entries is not None, 30, "the scan")
        screen.option_list.highlighted = screen.option_list.get_option_index(OTHER)
        await pilot.press("enter")
        await wait_until(pilot, lambda: isinstance(app.screen, AskScreen), what="the dialog")
        app.screen.query_one(Input).value = "/nonexistent/typo-two"
        await pilot.press("enter")
        await wait_until(pilot, lambda: len(errors(app)) == 3, 60, "the second open error")
        await wait_until(pilot, lambda: app.chat.loading is None, what="the load to end")
        one_line(3, "typo-two")
        still_loaded()

        await send(pilot, "hi")
        assert app.chat.last_done.finish_reason in ("stop", "length") and app.chat.last_done.text
        header = str(app.query(AssistantMessage).last().header_text())
        assert info.name in header and f"K {info.trained_k}" in header and "tok/s" in header


def test_load_progress_steps_and_hub_download():
    """The load bar's share, step and estimate, from the engine's phase events."""
    from ssdmoe_tui.chat.progress import LoadProgress

    p = LoadProgress(started=0.0)
    p.update("loading", 0, 0, "/models/x")  # a path: not a step, nothing moves
    p.update("loading", 0, 0, "/data/reindexed/tokenizer-fix-resident")  # words in a path
    assert p.fraction == 0.0 and p.eta_s is None
    p.update("loading", 512, 1024, "downloading 512 MiB of 1.0 GiB")
    assert p.fraction == 0.3 and "Hugging Face" in p.label and "30%" in p.text()
    assert "s left" in p.text() or "min left" in p.text()
    p.update("indexing", 0, 0, "/models/x")
    assert p.fraction == 0.6 and p.label == "indexing experts"
    p.update("loading", 0, 0, "loading resident weights")
    p.update("loading", 0, 0, "wrote model-00001-of-00008.safetensors (1/8, 3 MiB, 0 s)")
    assert p.fraction == 0.7 and p.label == "loading resident weights"  # never goes back
    # MLX-CUDA's first run: the loader's note (gpu_kernels.first_run_note) names the wait
    from ssdmoe_tui.gpu_kernels import COMPILING_NOTE

    p.update("loading", 0, 0, COMPILING_NOTE.format(folder="/c/mlx-ptx/0.32.4"))
    assert p.fraction == 0.97 and p.label.startswith("compiling GPU kernels, once")

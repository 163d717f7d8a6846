"""What a new user tripped on (issue 33, N1-N21): each through the real app (the pilot,
real files, the real demo where a model is needed)."""

from __future__ import annotations

import argparse
import io

import pytest
from rich.console import Console

from ssdmoe_tui import paths
from ssdmoe_tui.commands.chat import add_arguments, build_settings, engine_factory
from ssdmoe_tui.config import config_path, ensure_config_file, keymap_problems, load_config
from ssdmoe_tui.models.demo import ensure_demo_model
from ssdmoe_tui.sessions.app_sessions import AppSessions
from ssdmoe_tui.sessions.store import SessionStore
from ssdmoe_tui.ui.actions.keys import app_bindings
from ssdmoe_tui.ui.app import ChatSettings, SsdmoeApp
from ssdmoe_tui.ui.screens.dialogs import ConfirmScreen
from tests.helpers import pace
from tests.helpers.pilot import loaded, record_notifications, wait_until
from tests.helpers.ui_events import open_by_key, setup


def settings(*argv: str):
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return build_settings(parser.parse_args(list(argv)))


def _uncomment_keymap(text: str) -> str:
    """What a user does with the template's keymap example: uncomment the block."""
    lines = text.splitlines()
    at = next(i for i, s in enumerate(lines) if s.startswith("# [keymap]"))
    return "\n".join(lines[:at] + [s.removeprefix("# ") for s in lines[at:]]) + "\n"


async def test_n1_n2_a_theme_chosen_in_the_app_stays_a_setting_once_keymap_is_uncommented(
    ssdmoe_home,
):
    assert ensure_config_file() is None  # the commented template, as on a first run
    app = SsdmoeApp(settings(), engine_factory=None)
    async with app.run_test(size=(120, 40)) as pilot:
        await setup(pilot)
        app.theme = "ssdmoe-light"  # what the palette's theme picker does
        await wait_until(pilot, lambda: "ssdmoe-light" in config_path().read_text())
    path = config_path()
    path.write_text(_uncomment_keymap(path.read_text()))
    loaded = load_config()
    assert loaded.warnings == ()
    assert loaded.config.theme == "ssdmoe-light"  # N1: not swallowed by [keymap]
    keymap = loaded.config.keymap
    assert keymap and "app.k_up" in keymap
    assert keymap_problems(app_bindings(SsdmoeApp), keymap) == []  # N2: no key it shadows
    # A file an older version wrote (the theme appended under the commented table) is
    # mended by the next theme the app saves: one theme line, above the table.
    path.write_text(ensure_template_with('theme = "ssdmoe-light"'))
    app = SsdmoeApp(settings(), engine_factory=None)
    async with app.run_test(size=(120, 40)) as pilot:
        await setup(pilot)
        app.theme = "ssdmoe-dark"
        await wait_until(pilot, lambda: 'theme = "ssdmoe-dark"' in path.read_text())
    text = path.read_text()
    assert [s for s in text.splitlines() if s.startswith("theme =")] == ['theme = "ssdmoe-dark"']
    path.write_text(_uncomment_keymap(text))
    assert load_config().config.theme == "ssdmoe-dark" and load_config().warnings == ()


def ensure_template_with(line: str) -> str:
    from ssdmoe_tui.config import template

    return template() + line + "\n"


# ---------------------------------------------------------------- N4, N5, N12: the real demo

LONG = " ".join(f"streaming expert {i} from the disk" for i in range(220))  # ~2,900 tokens


def demo_app(store: SessionStore) -> SsdmoeApp:
    demo = ensure_demo_model(paths.demo_model_dir())  # the trained demo
    return SsdmoeApp(
        ChatSettings(model=str(demo)),
        engine_factory=engine_factory,
        session_store=AppSessions(store),
    )


def slow_prefill(monkeypatch) -> None:
    """Each prefill chunk at least 0.15 s after the last: the ~2,900-token prompt then
    prefills for seconds on any machine (a fast one could finish it before the test's
    poll sees the prefill), with the same tokens (tests/helpers/pace.py)."""
    pace.floor(monkeypatch, 0.0, per_chunk_s=0.15)


async def send_during_prefill(pilot, app: SsdmoeApp, text: str) -> None:
    """Send `text` and return once its prefill has started (and is far from done: the
    caller slows its chunks with `slow_prefill`)."""
    await loaded(pilot, app)
    app.chat_pane.prompt.load_text(text)
    await pilot.press("enter")
    panel = app.panel
    await wait_until(pilot, lambda: panel.phase == "prefill", 30, "the prefill")


async def test_n5_quitting_during_the_first_prefill_keeps_the_prompt_and_its_file(
    tmp_path, monkeypatch
):
    slow_prefill(monkeypatch)
    notes = tmp_path / "notes.txt"
    notes.write_text(LONG + "\n")
    store = SessionStore()
    app = demo_app(store)
    async with app.run_test(size=(120, 40)) as pilot:
        await send_during_prefill(pilot, app, f"summarise @{notes}")
        await pilot.press("ctrl+q")
        await wait_until(pilot, lambda: isinstance(app.screen, ConfirmScreen), what="the question")
        await pilot.press("y")
        await wait_until(pilot, lambda: not app.is_running, 30, "the app to exit")
    assert app.return_code == 0
    [summary] = store.list()  # N4: one conversation, not an empty one
    conv = store.get(summary.id)
    [turn] = conv.turns
    assert turn.role == "user" and turn.stopped
    assert turn.text.startswith("summarise") and "streaming expert 219" in turn.text
    md = store.export_markdown(conv.id)
    assert "streaming expert 219" in md and "stopped before its first token" in md
    # Resumed, the prompt is there and the next one goes on from it.
    app = SsdmoeApp(
        ChatSettings(model=str(paths.demo_model_dir()), resume=""),
        engine_factory=None,
        session_store=AppSessions(store),
    )
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        assert [m.text for m in app.chat_pane.transcript.messages()] == [turn.text]


async def test_n12_a_reply_stopped_in_its_prefill_says_so_and_stays_in_the_export(monkeypatch):
    slow_prefill(monkeypatch)
    store = SessionStore()
    app = demo_app(store)
    async with app.run_test(size=(120, 40)) as pilot:
        await send_during_prefill(pilot, app, LONG)
        await pilot.press("escape")
        await wait_until(pilot, lambda: app.inflight is None, 30, "the stop")
        [reply] = [m for m in app.chat_pane.transcript.messages() if m.ROLE == "assistant"]
        header = str(reply.header_text())
        assert "stopped before its first token" in header and "tok/s" not in header, header
        # N4: the conversation list has it once, with its prompt
        [summary] = store.list()
        md = store.export_markdown(summary.id)
        assert LONG in md and "## Assistant (stopped before its first token)" in md


async def test_n4_a_first_prompt_longer_than_the_context_leaves_no_empty_conversation():
    store = SessionStore()
    app = demo_app(store)
    async with app.run_test(size=(120, 40)) as pilot:
        await loaded(pilot, app)
        said = record_notifications(app)
        app.chat_pane.prompt.load_text(LONG * 2)  # over the demo's 4,096 tokens
        await pilot.press("enter")
        await wait_until(pilot, lambda: said and app.inflight is None, 30, "the refusal")
        assert any("context" in m or "long" in m for _, m in said), said
    assert store.list() == [] and store.ids() == []


# ---------------------------------------------------------------- N7, N14: the panel


async def test_n14_n7_the_panel_shows_no_figure_before_it_is_measured_nor_a_previous_chats():
    from ssdmoe_tui.ui.actions.conversations import open_conversation
    from ssdmoe_tui.ui.actions.model import open_model

    store = SessionStore()
    app = demo_app(store)
    async with app.run_test(size=(120, 40)) as pilot:
        await loaded(pilot, app)
        panel = app.panel
        await wait_until(
            pilot, lambda: "mem_rss" in panel.shown and panel.shown["mem_rss"] != "—", 30
        )
        shown = panel.shown
        for key in ("prefill", "cache_hit", "kv_hit", "ssd", "page_cache", "decode", "mass"):
            assert shown[key] == "—", (key, shown)  # N14: nothing ran yet
        assert shown["context"] == "0 / 4,096"
        app.chat_pane.prompt.load_text("Explain how a program reads a file.")
        await pilot.press("enter")
        await wait_until(pilot, lambda: app.inflight is None and app.chat.last_done, 60)
        await wait_until(pilot, lambda: shown["context"] != "0 / 4,096")
        assert shown["prefill"].endswith("tok/s") and shown["kv_hit"].endswith("%")
        assert shown["mass"] == "100.0 %" and list(panel.decode_history)
        first = app.chat.session_id
        # N7: ctrl+n: the previous chat's context, KV hit, router mass and lines go.
        await pilot.press("ctrl+n")
        await wait_until(pilot, lambda: shown["context"] == "0 / 4,096", what="ctrl+n")
        assert shown["kv_hit"] == shown["mass"] == "—" and not panel.decode_history
        # ctrl+o (the same call): the opened conversation's context is not the last one's.
        app.panel.shown["context"] = "stale"
        assert await open_conversation(app, first)
        assert shown["context"] == "— / 4,096" and shown["kv_hit"] == "—"
        # F4 to another model (here the same folder again): its sparklines start empty.
        app.chat_pane.prompt.load_text("And then?")
        await pilot.press("enter")
        await wait_until(pilot, lambda: app.inflight is None and panel.decode_history, 60)
        assert shown["context"] != "— / 4,096"  # measured by this turn
        open_model(app, str(paths.demo_model_dir()))
        await wait_until(pilot, lambda: app.chat.loading is None and not panel.decode_history, 60)
        assert shown["mass"] == "—"
    # --resume: the context is unknown until the next turn, not "0".
    app = SsdmoeApp(
        ChatSettings(model=str(paths.demo_model_dir()), resume=first),
        engine_factory=engine_factory,
        session_store=AppSessions(store),
    )
    async with app.run_test(size=(120, 40)) as pilot:
        await loaded(pilot, app)
        await pilot.pause(0.5)
        assert app.panel.shown["context"] == "— / 4,096"
        assert app.panel.shown["kv_hit"] == "—"


@pytest.mark.parametrize("size", [(80, 24), (120, 40)])
async def test_n13_the_welcome_cards_commands_wrap_between_arguments_only(size):
    from ssdmoe_tui.ui.widgets.welcome import COMMANDS, CommandLine

    ensure_demo_model(paths.demo_model_dir())
    app = SsdmoeApp(ChatSettings())
    async with app.run_test(size=size) as pilot:
        await pilot.pause(0.3)
        welcome = app.chat_pane.welcome
        assert "<folder-or-repo-id>" in str(welcome.query_one("#welcome-real").render())
        shown = list(welcome.query(CommandLine))
        assert [w.command for w in shown] == list(COMMANDS)
        for widget in shown:  # as drawn at this width (the card may scroll at 80x24)
            width = widget.content_region.width
            lines = [s.text.rstrip() for s in widget.render_lines(widget.region.reset_offset)]
            lines = [ln for ln in lines if ln.strip()]
            assert all(len(ln) <= width for ln in lines), (lines, width)
            assert all(ln.endswith(" \\") for ln in lines[:-1]), lines
            joined = " ".join(ln.removesuffix("\\").strip() for ln in lines)
            assert joined == widget.command, (lines, width)  # cut between arguments only
        await loaded(pilot, app)


async def test_n15_a_bad_theme_names_where_it_came_from(ssdmoe_home):
    from ssdmoe_tui.config import config_path

    for argv, where in ((("--theme", "nope"), "--theme nope"), ((), "config.toml: theme")):
        if not argv:
            config_path().parent.mkdir(parents=True, exist_ok=True)
            config_path().write_text('theme = "nope"\n')
        app = SsdmoeApp(settings(*argv), engine_factory=None)
        said = []
        async with app.run_test(size=(100, 30)) as pilot:
            await wait_until(pilot, lambda: any("nope" in n.message for n in app._notifications))  # noqa: B023
            said = [n.message for n in app._notifications if n.severity == "warning"]
        [line] = [m for m in said if "nope" in m]
        assert where in line and "ssdmoe-light" in line and "\n" not in line, line
        if argv:
            assert "config.toml is not changed" in line


async def test_n19_f1_lists_the_keys_the_prompt_handles_itself():
    from ssdmoe_tui.ui.screens.keys import KeysScreen

    app = SsdmoeApp(ChatSettings(), engine_factory=None)
    async with app.run_test(size=(120, 40)) as pilot:
        await open_by_key(pilot, "f1", KeysScreen)
        console = Console(width=200, record=True, file=io.StringIO())
        console.print(app.screen.table)  # the whole table (the screen scrolls it)
        text = console.export_text()
        for part in ("pageup", "pagedown", "previous / next prompt", "tab", "@path", "(fixed)"):
            assert part in text, (part, text)


@pytest.mark.parametrize("size", [(100, 30), (120, 40), (80, 24)])
async def test_n21_a_reply_header_keeps_every_figure_at_any_width(size):
    app = SsdmoeApp(ChatSettings(), engine_factory=None)
    async with app.run_test(size=size) as pilot:
        await setup(pilot)
        reply = await app.chat_pane.transcript.add_assistant("r2", "Qwen3.5-35B-A3B-4bit-DWQ")
        detail = "1,024 tokens (312 thinking) · 12.5 tok/s · K 4–6 · KV hit 97%"
        await reply.finish("ok", "length", detail)
        await pilot.pause(0.2)
        title = reply.query_one(".message-title")
        shown = " ".join(strip.text for strip in title.render_lines(title.region.reset_offset))
        for part in ("Qwen3.5-35B-A3B-4bit-DWQ", "[hit max tokens]", "K 4–6", "KV hit 97%"):
            assert part in " ".join(shown.split()), (part, shown)
        assert "…" not in shown


async def test_n8_an_at_path_that_names_no_file_is_said_before_and_when_it_is_sent(tmp_path):
    store = SessionStore()
    app = demo_app(store)
    async with app.run_test(size=(120, 40)) as pilot:
        await loaded(pilot, app)
        said = record_notifications(app)
        chips = app.chat_pane.query_one("#attachments")
        missing = tmp_path / "notes" / "todo.md"
        app.chat_pane.prompt.load_text(f"what is in @{missing} and @alice")
        await wait_until(pilot, lambda: chips.display and "no file" in str(chips.render()))
        assert f"@{missing} names no file: sent as text" in str(chips.render())
        assert "alice" not in str(chips.render())  # no '/': a mention, nothing said
        await pilot.press("enter")
        await wait_until(pilot, lambda: any("names no file" in m for _, m in said))
        await wait_until(pilot, lambda: app.inflight is None, 60, "the reply")
        assert app.chat.history[0].content == f"what is in @{missing} and @alice"  # as text


async def test_n11_other_folder_prefilled_with_the_loaded_model_asks_before_reloading():
    from ssdmoe_tui.ui.actions.model import ask_model
    from ssdmoe_tui.ui.screens.dialogs import AskScreen

    store = SessionStore()
    app = demo_app(store)
    async with app.run_test(size=(120, 40)) as pilot:
        await loaded(pilot, app)
        for answer in ("n", "y"):
            loads = app.events_seen.get("ModelLoaded", 0)
            ask_model(app)  # F4 -> "Other folder or Hugging Face repo id…" (and the palette)
            await wait_until(pilot, lambda: isinstance(app.screen, AskScreen), what="the dialog")
            await pilot.press("enter")  # as prefilled: the loaded model's folder
            await wait_until(pilot, lambda: isinstance(app.screen, ConfirmScreen), what="asked")
            assert "already loaded" in app.screen.question
            await pilot.press(answer)
            if answer == "y":  # reloaded: one more ModelLoaded
                want = loads + 1
                await wait_until(pilot, lambda: app.events_seen["ModelLoaded"] == want, 60)  # noqa: B023
            else:
                await pilot.pause(1.0)
                assert app.chat.loading is None and app.events_seen["ModelLoaded"] == loads


async def test_n3_attached_the_panel_shows_the_servers_weights_and_context(tmp_path, monkeypatch):
    """Issue 33 N3 saw weights '9' and context '0' for a whole session after --attach
    (2 of 4 launches); not reproduced here (4 of 4 in a first run, at 80x24 to 120x40):
    this keeps it checked, two launches, after the attach and after a reply."""
    from tests.helpers.serve_process import start_server, stop

    monkeypatch.delenv("SSDMOE_API_KEY", raising=False)
    served = start_server(ensure_demo_model(paths.demo_model_dir()), tmp_path)
    try:
        for size in ((80, 24), (100, 30)):
            await _attach_once(served.url, size)
    finally:
        stop(served.proc)


async def _attach_once(url: str, size: tuple[int, int]) -> None:
    from ssdmoe_tui.units import human_bytes
    from tests.helpers.pilot import type_and_send

    app = SsdmoeApp(ChatSettings(attach=url, max_tokens=8), engine_factory=None)
    async with app.run_test(size=size) as pilot:
        await wait_until(pilot, lambda: app.chat.model is not None, what="the attach")
        shown = app.panel.shown
        weights = human_bytes(app.chat.model.resident_bytes, digits=None)
        assert app.chat.model.resident_bytes > 1 << 19 and shown["mem_resident"] == weights
        assert shown["context"] == "0 / 4,096"
        await type_and_send(pilot, "hi")
        await wait_until(pilot, lambda: app.chat.last_done is not None, 60, "the reply")
        prompt = len(app.chat.last_done.prompt_token_ids) if app.chat.last_done else 0
        await wait_until(pilot, lambda: shown["context"] != "0 / 4,096", what="a sample")
        used = int(shown["context"].split(" / ")[0].replace(",", ""))
        assert used > 0 and shown["mem_resident"] == weights, shown
        assert prompt == 0 or used >= prompt

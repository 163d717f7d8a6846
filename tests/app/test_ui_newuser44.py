"""What a new user met in the app (issue 44, item 5: M3, M5, M6, M8-M10, M12, M15-M17,
N3, N21; item 6), each through the real app (Textual's pilot, the real engine on the
demo where a model is needed, real files)."""

from __future__ import annotations

import os
import re
import shutil
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import replace
from pathlib import Path

import pytest
from textual.widgets import Label, Static, TextArea

from ssdmoe_tui import paths
from ssdmoe_tui.commands.chat import engine_factory
from ssdmoe_tui.models.demo import ensure_demo_model
from ssdmoe_tui.sessions.app_sessions import AppSessions
from ssdmoe_tui.sessions.store import SessionStore, Turn
from ssdmoe_tui.ui.app import ChatSettings, SsdmoeApp
from ssdmoe_tui.ui.fmt import fmt_bytes, fmt_mib, fmt_pct, fmt_rate
from ssdmoe_tui.ui.screens.conversations import ConversationsScreen
from ssdmoe_tui.ui.screens.dialogs import ConfirmScreen
from ssdmoe_tui.ui.widgets.engine_panel import Row, used_of
from ssdmoe_tui.ui.widgets.transcript import Notice
from ssdmoe_tui.ui.widgets.welcome import Welcome
from tests.helpers import pace
from tests.helpers.pilot import (
    loaded,
    next_reply,
    open_settings,
    record_notifications,
    save_settings,
    send,
    wait_until,
)

SIZE = (120, 40)
LONG = " ".join(f"streaming expert {i} from the disk" for i in range(220))  # ~2,900 tokens


def demo_app(store: SessionStore, **settings) -> SsdmoeApp:
    demo = ensure_demo_model(paths.demo_model_dir())  # the trained demo
    return SsdmoeApp(
        ChatSettings(model=str(demo), **settings),
        engine_factory=engine_factory,
        session_store=AppSessions(store),
    )


def slow_prefill(monkeypatch) -> None:
    """Each prefill chunk at least 0.15 s after the last: the ~2,900-token prompt then
    prefills for seconds on any machine, with the same tokens (tests/helpers/pace.py)."""
    pace.floor(monkeypatch, 0.0, per_chunk_s=0.15)


def notices(app: SsdmoeApp) -> list[str]:
    return [str(n.render()) for n in app.query(Notice)]


async def test_m6_ctrl_n_during_the_first_prefill_keeps_the_prompt_in_its_conversation(
    monkeypatch,
):
    slow_prefill(monkeypatch)
    store = SessionStore()
    app = demo_app(store)
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot, app)
        panel = app.panel
        app.chat_pane.prompt.load_text(LONG)
        await pilot.press("enter")
        await wait_until(pilot, lambda: panel.phase == "prefill", 30, "the prefill")
        first = app.chat.session_id
        await pilot.press("ctrl+n")
        await wait_until(pilot, lambda: "New chat." in notices(app), 30, "the new chat")
        assert app.chat.session_id != first and app.inflight is None
        assert app.chat.history == [] and not app.chat_pane.transcript.messages()
        # The engine's sample for the stopped prefill can come after its end (under load
        # it did): fed again here, it leaves the new chat's figures alone.
        late = replace(panel.last_sample, context_tokens=2754, expert_cache_hit_rate=0.85)
        app.feed(late)
        await wait_until(pilot, lambda: panel.last_sample is late, what="the late sample")
        shown = panel.shown
        assert shown["context"] == "0 / 4,096", shown
        assert shown["prefill"] == shown["decode"] == shown["kv_hit"] == "—", shown
        assert shown["cache_hit"] == "—", shown
        assert not panel.decode_history
    [summary] = store.list()  # the first conversation, with its prompt; no empty one
    conv = store.get(summary.id)
    assert conv.id == first and summary.n_turns >= 1
    [turn] = conv.turns
    assert turn.role == "user" and turn.text == LONG and turn.stopped


def resume_app(store: SessionStore, **settings) -> SsdmoeApp:
    """The app as plain `ssdmoe --resume` starts it: no model asked for."""
    return SsdmoeApp(
        ChatSettings(resume="", **settings),
        engine_factory=engine_factory,
        session_store=AppSessions(store),
    )


async def test_m3_plain_resume_reopens_the_conversations_own_model_or_says_why_not(tmp_path):
    own = tmp_path / "my-model"
    shutil.copytree(ensure_demo_model(paths.demo_model_dir()), own)
    store = SessionStore()
    app = SsdmoeApp(
        ChatSettings(model=str(own), max_tokens=8, k=2),
        engine_factory=engine_factory,
        session_store=AppSessions(store),
    )
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot, app)
        await send(pilot, "hello there")
        conv_id = app.chat.session_id
        await wait_until(pilot, lambda: not app.chat.engine.busy, what="the saves")
    assert store.get(conv_id).model_path == str(own)

    app = resume_app(store)
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot, app)
        assert app.chat.session_id == conv_id and app.chat.model.path == str(own)
        assert "Reopened on this conversation's own model, my-model." in notices(app)
        assert app.chat.gen.k == 2  # its own K, on its own model

    shutil.rmtree(own)  # the folder is gone: the demo, said, at the demo's own K
    app = resume_app(store)
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot, app)
        assert app.chat.model.path == str(paths.demo_model_dir())
        said = [n for n in notices(app) if "written by my-model" in n]
        assert said == [
            f"This conversation was written by my-model, which is not found here ({own}): "
            "it goes on with the demo model (F4 picks another)."
        ]
        assert app.chat.gen.k is None and app.chat.model.k == app.chat.model.trained_k


@asynccontextmanager
async def after_hello(store: SessionStore) -> AsyncIterator[tuple[SsdmoeApp, object]]:
    """(app, pilot) on the demo, its first exchange ("hello there") done."""
    app = demo_app(store, max_tokens=8)
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot, app)
        await send(pilot, "hello there")
        yield app, pilot


async def test_m10_ctrl_l_then_esc_gives_the_box_back_its_draft():
    async with after_hello(SessionStore()) as (app, pilot):
        prompt = app.chat_pane.prompt
        prompt.load_text("a draft")
        await pilot.press("ctrl+l")
        await wait_until(pilot, lambda: prompt.text == "hello there", what="the last prompt")
        await pilot.press("escape")
        await wait_until(pilot, lambda: prompt.text == "a draft", what="the draft back")
        assert not app.chat_pane.editing
        before = app.chat.last_done
        await pilot.press("enter")  # a new message, not a resend of the last one
        await next_reply(pilot, app, before)
        assert [m.content for m in app.chat.history if m.role == "user"] == [
            "hello there",
            "a draft",
        ]


async def test_m17_ctrl_l_after_a_prompt_refused_for_length_brings_it_back():
    store = SessionStore()
    app = demo_app(store, max_tokens=8)
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot, app)
        said = record_notifications(app)
        too_long = LONG * 2  # over the demo's 4,096 tokens
        app.chat_pane.prompt.load_text(too_long)
        await pilot.press("enter")
        await wait_until(pilot, lambda: said and app.inflight is None, 30, "the refusal")
        await pilot.press("ctrl+l")
        prompt = app.chat_pane.prompt
        await wait_until(pilot, lambda: prompt.text == too_long, what="the refused prompt")
        assert not any("No prompt to edit" in m for _, m in said), said
        prompt.load_text("short now")
        before = app.chat.last_done
        await pilot.press("enter")  # sent as a new message
        await next_reply(pilot, app, before)
        assert [m.content for m in app.chat.history if m.role == "user"] == ["short now"]


async def test_m9_a_conversations_title_is_the_prompt_as_typed(tmp_path, monkeypatch):
    notes = tmp_path / "notes.txt"
    notes.write_text("the expert cache keeps hot experts in memory\n")
    monkeypatch.chdir(tmp_path)
    store = SessionStore()
    app = demo_app(store, max_tokens=8)
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot, app)
        await send(pilot, "summarise @notes.txt")
        await wait_until(pilot, lambda: not app.chat.engine.busy, what="the saves")
        assert "<attached" in app.chat.history[0].content  # the model got the file
    [summary] = store.list()
    assert summary.title == "summarise @notes.txt"
    md = store.export_markdown(summary.id)
    assert md.startswith("# summarise @notes.txt\n")


async def test_m16_the_welcome_says_each_thing_once():
    app = SsdmoeApp(ChatSettings(), engine_factory=None)
    async with app.run_test(size=SIZE) as pilot:
        await app.chat_pane.transcript.mount(Welcome())  # what the demo's first frame shows
        await pilot.pause()
        text = " ".join(str(s.render()) for s in app.query_one(Welcome).query(Static))
    assert text.count("A real model") == 1, text
    assert text.count("Tools:") == 1 and text.count("approve") == 1, text


async def test_m16_deleting_a_one_turn_conversation_says_1_turn():
    store = SessionStore()
    conv = store.create("demo-model")
    store.add_turn(conv, Turn("user", "hello there"))
    app = SsdmoeApp(ChatSettings(), engine_factory=None, session_store=AppSessions(store))
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("ctrl+o")
        await wait_until(pilot, lambda: isinstance(app.screen, ConversationsScreen), what="F3")
        await pilot.pause(0.3)
        await pilot.press("f8")
        await wait_until(pilot, lambda: isinstance(app.screen, ConfirmScreen), what="the question")
        assert "(1 turn)?" in app.screen.question, app.screen.question


# The widest figure each panel row shows on a large model (a 256k context, a 128 GiB
# expert cache, speculation with thousands of drafts).
WIDEST = {
    "decode": fmt_rate(9999.9),
    "prefill": fmt_rate(99999.9),
    "ssd": fmt_mib(9999.99),
    "page_cache": fmt_mib(9999.99),
    "mass": fmt_pct(1.0),
    "cache_hit": fmt_pct(1.0),
    "cache_used": used_of(int(127.9 * 2**30), 128 * 2**30),
    "mem_resident": fmt_bytes(999.9 * 2**30),
    "mem_kv": fmt_bytes(999.9 * 2**30),
    "mem_rss": fmt_bytes(999.9 * 2**30),
    "mem_peak": fmt_bytes(999.9 * 2**30),
    "kv_hit": fmt_pct(1.0),
    "context": "262,144 / 262,144",
}


async def test_m16_every_panel_label_stays_whole_at_80_columns():
    app = SsdmoeApp(ChatSettings(), engine_factory=None)
    async with app.run_test(size=(80, 24)) as pilot:
        panel = app.panel
        for key, text in WIDEST.items():
            panel._set(key, text)
        spec = {"acceptance": 1.0, "accepted": 9999, "drafted": 9999, "tokens_per_pass": 16.0}
        spec |= {"bytes_per_token": 999.99 * 2**20, "ms_per_token": 999.9, "speedup": 99.99}
        panel._show_spec(spec)
        await pilot.pause(0.3)
        assert panel.shown["spec_gain"] == "≈99.99x"
        for row in panel.query(Row):
            label = row.query_one(".row-label", Label)
            value = row.query_one(".row-value", Static)
            if not row.display:
                continue
            need = len(row.label) + 1 + len(str(value.render()))
            assert need <= row.size.width, (row.label, str(value.render()), row.size.width)
            assert label.size.width >= len(row.label), row.label


async def test_item6_finishing_a_reply_no_longer_on_screen_mounts_nothing():
    """The step that raised: a restored reply's `finish` on a message the teardown (or a
    new chat) already removed mounted its Markdown into a detached widget."""
    app = SsdmoeApp(ChatSettings(), engine_factory=None)
    async with app.run_test(size=SIZE) as pilot:
        transcript = app.chat_pane.transcript
        message = await transcript.add_assistant("", "demo-model")
        await message.remove()
        await pilot.pause()
        assert not message.is_attached
        await message.finish("**an answer**\n\n```\ncode\n```", "stop", "3 tokens")
        assert message.text == "**an answer**\n\n```\ncode\n```"  # kept, not shown


async def test_n21_a_system_prompt_set_later_is_exported_where_it_was_set():
    store = SessionStore()
    async with after_hello(store) as (app, pilot):
        screen = await open_settings(pilot)
        screen.query_one("#set-system_prompt", TextArea).text = "Be brief."
        await save_settings(pilot, screen)
        await wait_until(pilot, lambda: app.chat.gen.system_prompt == "Be brief.", what="F9")
        await send(pilot, "and then?")
        conv_id = app.chat.session_id
        await wait_until(pilot, lambda: not app.chat.engine.busy, what="the saves")
    md = store.export_markdown(conv_id)
    first, second = md.index("## User\n\nhello there"), md.index("## User\n\nand then?")
    system = md.index("## System (set after 1 turn)\n\nBe brief.")
    assert first < system < second, md
    assert md.count("## System") == 1
    conv = SessionStore().get(conv_id)  # read back from its file
    assert (conv.system_since, conv.earlier_systems) == (2, [[0, ""]])


@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")
def test_n3_attached_in_a_real_terminal_the_panel_shows_weights_and_context_whole(tmp_path):
    """`ssdmoe --attach` in tmux showed 'weights 9' and 'context 0' (the width of the '—'
    before them) in 2 of 8 launches, both at 120x40; the pilot never did (8 of 8 whole).
    A value set before its widget had mounted kept the width Textual had cached for the
    '—' (Widget.refresh skips clear_cached_dimensions then); the panel now sets each
    value's width with its text. A race: six launches here, each must show both whole."""
    from tests.helpers.serve_process import start_server, stop
    from tests.helpers.tmux import tmux, wait_pane

    served = start_server(ensure_demo_model(paths.demo_model_dir()), tmp_path)
    bin_ = Path(sys.executable).parent
    env = f"SSDMOE_HOME='{os.environ['SSDMOE_HOME']}' SSDMOE_LOCK_DIR='{tmp_path}/app-locks'"
    cmd = f"{env} TERM=xterm-256color '{bin_}/ssdmoe' --attach {served.url}; sleep 60"
    seen = []
    try:
        for launch in range(6):
            sock = f"ssdmoe-n3-{os.getpid()}-{launch}"
            tmux(sock, "new-session", "-d", "-s", "t", "-x", "120", "-y", "40", cmd)
            try:
                pane = wait_pane(sock, "Attached to the server", 60)
                time.sleep(1.0)  # the panel's first figures drawn
                pane = tmux(sock, "capture-pane", "-p", "-t", "t")
                rows = [
                    " ".join(r.split("▏")[-1].split()).rstrip(" ▁▂▃▄▅▆▇█")
                    for r in pane.splitlines()
                ]
                seen.append([r for r in rows if r.startswith(("weights", "context "))])
            finally:
                tmux(sock, "kill-server")
    finally:
        stop(served.proc)
    whole = re.compile(r"weights \d+(\.\d+)? [KMG]iB\|context 0 / \d+(,\d{3})*")
    assert all(whole.fullmatch("|".join(rows)) for rows in seen), seen


async def test_item3_a_first_run_on_mlx_cuda_says_the_kernels_compile(monkeypatch, tmp_path):
    """MLX-CUDA compiles its kernels during the first reply (142 s for the demo on an H100
    against 16 s once kept): the loader decides it (a CUDA device, no PTX kept for this
    MLX version; forced here on the CPU: the device said CUDA, the kernel folder empty),
    and the welcome card, a notice, and the first reply's prefill and decode phases say
    it. The second reply's do not, and its prefill estimate ignores the first's rate."""
    from ssdmoe_tui.chat.progress import COMPILING, FIRST_REPLY_NOTE
    from ssdmoe_tui.engine.model import loader

    monkeypatch.setenv("MLX_PTX_CACHE_DIR", str(tmp_path / "ptx"))  # none kept
    monkeypatch.setattr(loader, "is_cuda", lambda: True)
    app = SsdmoeApp(ChatSettings(max_tokens=8))  # the demo, its welcome card
    async with app.run_test(size=SIZE) as pilot:
        phases: list[str] = []
        app.watch(app.status_bar, "phase", lambda p: phases.append(p), init=False)
        await loaded(pilot, app)
        assert app.load_progress.compiling and app.compiling_kernels
        status = str(app.query_one("#welcome-status", Static).render())
        assert "is ready" in status and COMPILING in status
        await wait_until(pilot, lambda: FIRST_REPLY_NOTE in notices(app), what="the notice")

        await send(pilot, "hello")
        shown = [p for p in phases if p.startswith(("prefill", "decoding"))]
        assert any(p.startswith("prefill") and p.endswith(COMPILING) for p in shown), shown
        assert all(p.endswith(COMPILING) for p in shown), shown
        assert not app.compiling_kernels and app.prefill_clock.rate is None
        phases.clear()
        await send(pilot, "again")
        shown = [p for p in phases if p.startswith(("prefill", "decoding"))]
        assert shown and not any(COMPILING in p for p in shown), shown
        assert app.prefill_clock.rate is not None


async def test_item3_f1_says_what_a_cuda_user_meets_first():
    """F1 names the first run's compilation on MLX-CUDA and what speculation keeps exact."""
    from ssdmoe_tui.ui.screens.keys import KeysScreen
    from tests.helpers.ui_events import open_by_key

    app = SsdmoeApp(ChatSettings(), engine_factory=None)
    async with app.run_test(size=SIZE) as pilot:
        await open_by_key(pilot, "f1", KeysScreen)
        text = str(app.screen.query_one("#keys-notes", Static).render())
        for part in ("MLX-CUDA", "compiles the GPU kernels, once", "near-ties may flip"):
            assert part in text, (part, text)


@pytest.mark.parametrize("device", ["gpu/CUDA", "gpu/Metal"])
async def test_item2_choosing_speculation_on_mlx_cuda_says_what_it_does_there(device):
    """F9's save and the palette's entry say, on MLX-CUDA only, that a verify pass may
    flip near-ties (ngram) or that auto drafts nothing there; the tooltip says it always."""
    from ssdmoe_tui.engine.run.protocol import ModelLoaded
    from ssdmoe_tui.ui.actions import gen_settings
    from tests.helpers.ui_events import INFO

    app = SsdmoeApp(ChatSettings(), engine_factory=None)
    async with app.run_test(size=SIZE) as pilot:
        app.feed(ModelLoaded(replace(INFO, device=device)))
        await wait_until(pilot, lambda: app.chat.model is not None, what="the model")
        said = record_notifications(app)
        screen = await open_settings(pilot)
        await save_settings(pilot, screen, speculate="ngram")
        gen_settings.set_speculate(app, "auto")
        gen_settings.set_speculate(app, "off")
        texts = [text for _, text in said]
        cuda = device == "gpu/CUDA"
        assert texts[0].startswith("Settings saved for this conversation.")
        assert ("near-ties may flip tokens" in texts[0]) is cuda, texts
        assert ("auto drafts nothing" in texts[1]) is cuda, texts
        assert "MLX-CUDA" not in texts[2], texts  # off: nothing to say

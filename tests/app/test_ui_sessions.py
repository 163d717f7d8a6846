"""Conversations in the app (ctrl+o): resume after a restart with KV reuse, search,
rename, delete with a confirm, export, clear; real engine on the demo model, real files."""

from __future__ import annotations

import json

import pytest

from ssdmoe_tui.engine.run.protocol import StatsSample
from ssdmoe_tui.sessions.app_sessions import AppSessions
from ssdmoe_tui.sessions.store import CONVERSATION_FILE, SessionStore, Turn
from ssdmoe_tui.ui.actions import conversations
from ssdmoe_tui.ui.app import ChatSettings, SsdmoeApp
from ssdmoe_tui.ui.fmt import fmt_pct
from ssdmoe_tui.ui.screens.conversations import ConversationsScreen, exports_dir
from ssdmoe_tui.ui.screens.dialogs import AskScreen, ConfirmScreen
from ssdmoe_tui.ui.widgets.transcript import AssistantMessage, UserMessage
from tests.helpers.pilot import (
    SIZE,
    errors,
    loaded,
    next_reply,
    open_list,
    opened,
    send,
    session_app,
    tap,
    wait_until,
)

# A long first message makes the resumed turn's new tokens a small part of its prompt.
FIRST = " ".join(["the quick brown fox jumps over the lazy dog near the river bank"] * 8)


def texts(app: SsdmoeApp) -> list[tuple[str, str]]:
    return [
        ("user" if isinstance(m, UserMessage) else "assistant", m.text)
        for m in app.chat_pane.transcript.messages()
    ]


async def search(pilot, screen: ConversationsScreen, text: str) -> list[str]:
    screen.search_input.value = ""
    await pilot.press(*["space" if c == " " else c for c in text])
    await wait_until(pilot, lambda: screen.shown_query == text, what=f"results for {text!r}")
    return [s.id for s in screen.summaries]


def seed(store: SessionStore, *exchanges: tuple[str, str], title: str = "") -> str:
    conv = store.create("demo-model", "fp", "", title)
    for i, (user, reply) in enumerate(exchanges):
        store.add_turn(conv, Turn("user", user, [i + 1]))
        store.add_turn(conv, Turn("assistant", reply, [i + 2], k=4))
    return conv.id


async def test_resume_from_the_list_after_restart_reuses_the_kv_checkpoint(demo_model):
    settings = ChatSettings(model=str(demo_model), max_tokens=60)
    first = session_app(settings)
    async with first.run_test(size=SIZE) as pilot:
        await loaded(pilot, first)
        assert await first.chat_pane.send(FIRST)
        await next_reply(pilot, first, None, 60, "reply 1")
        await send(pilot, "and then")
        await wait_until(pilot, lambda: not first.chat.engine.busy, what="the KV checkpoint save")
        shown = texts(first)
        conv_id = first.chat.session_id
        await pilot.press("ctrl+q")
    assert [role for role, _ in shown] == ["user", "assistant"] * 2
    folder = SessionStore().folder(conv_id)
    assert list(folder.glob("kv-*.safetensors")), "no KV checkpoint was written"

    second = session_app(ChatSettings(model=str(demo_model), max_tokens=20))
    async with second.run_test(size=SIZE) as pilot:
        await loaded(pilot, second)
        assert second.chat.session_id != conv_id and not second.chat_pane.transcript.messages()
        screen = await open_list(pilot, second)
        (summary,) = screen.summaries
        assert summary.id == conv_id and summary.n_turns == 2
        assert summary.title == FIRST[: len(summary.title) - 1] + "…"
        assert summary.model_id == "demo-model"
        assert "demo-model · 2 turns" in str(screen.option_list.get_option_at_index(0).prompt)
        await pilot.press("enter")
        await opened(pilot, second, conv_id)
        assert not isinstance(second.screen, ConversationsScreen)
        assert texts(second) == shown  # the transcript at once, from the stored turns
        # Warm resume: the experts saved with the checkpoint are read back in the background.
        await wait_until(pilot, lambda: second.events_seen.get("ExpertsWarmed"), 30, "warm-up")
        assert_warmed(second, folder)
        notice = second.chat_pane.transcript.query("Notice").last()
        assert str(notice.render()).startswith("Resumed “the quick brown fox")
        samples: list[StatsSample] = []
        show = second.panel.show_sample
        second.panel.show_sample = lambda s: (samples.append(s), show(s))
        await send(pilot, "ok")
        done = second.chat.last_done
        assert done.finish_reason in ("stop", "length"), done.finish_reason
        # The checkpoint of the first app served all but the new message.
        assert done.stats["kv_hit_rate"] >= 0.9, done.stats
        await wait_until(pilot, lambda: samples and samples[-1].generated_tokens, what="the sample")
        assert samples[-1].kv_hit_rate == pytest.approx(done.stats["kv_hit_rate"], abs=1e-4)
        assert second.panel.shown["kv_hit"] == fmt_pct(samples[-1].kv_hit_rate)
        conv = SessionStore().get(conv_id)
        assert conv.n_turns == 3 and conv.turns[-2].text == "ok"
        assert conv.turns[-1].text == done.text
        await wait_until(pilot, lambda: not second.chat.engine.busy, what="the saves")

    # `ssdmoe --resume`: the conversation opens before the model has loaded; the warm-up
    # goes once it has.
    third = session_app(ChatSettings(model=str(demo_model), resume=""))
    async with third.run_test(size=SIZE) as pilot:
        await loaded(pilot, third)
        assert third.chat.session_id == conv_id
        await wait_until(pilot, lambda: third.events_seen.get("ExpertsWarmed"), 30, "warm-up")
        assert_warmed(third, folder)


def assert_warmed(app: SsdmoeApp, folder) -> None:
    """The cache holds every expert of the working set saved in `folder`."""
    saved = json.loads((folder / "experts.json").read_text())["layers"]
    cache = app.chat.engine._runner.sm.cache
    assert saved and all(cache.resident(layer, e) for layer, ids in saved for e in ids)


async def test_list_search_rename_export_delete(tmp_path):
    store = SessionStore()
    ssd = seed(store, ("Tell me about SSD streaming", "It reads the routed experts."))
    knock = seed(store, ("Knock knock", "Who's there?"), ("Lettuce", "Lettuce who?"))
    broken = store.folder("20200101-000000-abcdef")
    broken.mkdir(parents=True)
    (broken / CONVERSATION_FILE).write_text("{ not json")
    app = SsdmoeApp(ChatSettings(), engine_factory=None, session_store=AppSessions(store))
    async with app.run_test(size=SIZE) as pilot:
        screen = await open_list(pilot, app, "f3")
        assert [s.id for s in screen.summaries] == [knock, ssd]  # most recent first
        assert any("unreadable" in n.message for n in app._notifications)  # the broken one
        # Search as you type, in titles and messages, with the hit in context.
        assert await search(pilot, screen, "routed") == [ssd]
        assert "routed experts" in str(screen.option_list.get_option_at_index(0).prompt)
        assert await search(pilot, screen, "zebra") == []
        assert await search(pilot, screen, "lettuce") == [knock]
        assert sum("unreadable" in n.message for n in app._notifications) == 1  # told once

        # Rename (modal input).
        await pilot.press("f2")
        assert isinstance(app.screen, AskScreen)
        app.screen.query_one("#ask-input").value = ""
        await pilot.press(*"Jokes", "enter")
        await wait_until(pilot, lambda: store.get(knock).title == "Jokes", what="the rename")
        assert app.screen is screen
        await search(pilot, screen, "jokes")
        assert str(screen.option_list.get_option_at_index(0).prompt).startswith("Jokes")

        # Export to the default folder, then to a file the user names.
        await pilot.press("f5")
        assert isinstance(app.screen, AskScreen)
        await pilot.press("enter")
        md = exports_dir() / f"conversation-{knock}.md"
        await wait_until(pilot, md.exists, what="the Markdown export")
        assert "# Jokes" in md.read_text() and "Lettuce who?" in md.read_text()
        assert app.clipboard == str(md)
        target = tmp_path / "out" / "jokes.json"
        await pilot.press("f6")
        app.screen.query_one("#ask-input").value = str(target)
        await pilot.press("enter")
        await wait_until(pilot, target.exists, what="the JSON export")
        data = json.loads(target.read_text())
        assert [t["text"] for t in data["turns"]][-1] == "Lettuce who?"
        assert any(str(target) in n.message for n in app._notifications)
        # A place that cannot be written: one line, the list stays.
        blocker = tmp_path / "a-file"
        blocker.write_text("x")
        await pilot.press("f5")
        app.screen.query_one("#ask-input").value = str(blocker / "x.md")
        await pilot.press("enter")
        await wait_until(pilot, lambda: errors(app), what="the export error")
        assert errors(app)[-1].startswith("not exported:") and "\n" not in errors(app)[-1]
        assert app.screen is screen

        # Delete asks first; "n" keeps it, "y" deletes it.
        await pilot.press("f8")
        assert isinstance(app.screen, ConfirmScreen) and "Jokes" in app.screen.question
        await pilot.press("n")
        assert store.folder(knock).is_dir()
        await pilot.press("f8", "y")
        await wait_until(pilot, lambda: not store.folder(knock).exists(), what="the delete")
        await search(pilot, screen, "")
        assert [s.id for s in screen.summaries] == [ssd]

        # Open the other one: its transcript shows at once.
        await pilot.press("enter")
        await opened(pilot, app, ssd)
        assert texts(app) == [
            ("user", "Tell me about SSD streaming"),
            ("assistant", "It reads the routed experts."),
        ]
        assert app.chat.history[-1].content == "It reads the routed experts."
        assert len(app.query(AssistantMessage)) == 1
        # Deleting the open conversation (palette path) leaves a fresh chat in the window.
        conversations.delete(app)
        await pilot.pause()
        assert isinstance(app.screen, ConfirmScreen)
        await pilot.press("y")
        await wait_until(pilot, lambda: app.chat.session_id != ssd, what="the new chat")
        assert not app.chat_pane.transcript.messages() and app.chat.history == []
        assert not store.folder(ssd).exists()
        # Nothing saved yet in this chat: the palette says so instead of failing.
        conversations.export(app, "md")
        await pilot.pause()
        assert "saved after its first reply" in list(app._notifications)[-1].message


async def test_clear_and_export_the_open_chat_from_the_palette(demo_model):
    store = SessionStore()
    app = session_app(ChatSettings(model=str(demo_model), max_tokens=20), store)
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot, app)
        await send(pilot, "hello there")
        first = app.chat.session_id
        reply = app.chat.last_done.text
        await pilot.press("ctrl+p")
        await pilot.press(*"export conversation as markdown")
        await pilot.pause(0.3)
        await pilot.press("enter")
        await wait_until(pilot, lambda: isinstance(app.screen, AskScreen), what="the export ask")
        await pilot.press("enter")
        md = exports_dir() / f"conversation-{first}.md"
        await wait_until(pilot, md.exists, what="the export")
        assert "hello there" in md.read_text() and reply.strip() in md.read_text()
        # Clear: a new context in the same window; the old conversation stays listed.
        await pilot.press("ctrl+p")
        await pilot.press(*"clear conversation")
        await pilot.pause(0.3)
        await pilot.press("enter")
        await wait_until(pilot, lambda: app.chat.session_id != first, what="the clear")
        assert not app.chat_pane.transcript.messages() and app.chat.history == []
        await send(pilot, "fresh start")
        assert app.chat.last_done.stats["kv_hit_rate"] == 0.0  # a new context
        assert [s.id for s in store.list()] == [app.chat.session_id, first]
        assert store.get(first).turns[0].text == "hello there"
        # Opening the first one again swaps the transcript back.
        screen = await open_list(pilot, app)
        screen.option_list.highlighted = [s.id for s in screen.summaries].index(first)
        await tap(pilot, "enter")
        # The reopened transcript is restored after the switch: waited for, not assumed
        # (a slowed engine showed the switch before its first message: IndexError).
        await opened(pilot, app, first)
        assert texts(app)[0] == ("user", "hello there")

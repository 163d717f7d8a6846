"""Per-conversation generation settings (F9), regenerate (ctrl+g), edit and resend
(ctrl+l), and a resumed conversation going on with its own settings: the real engine on
the demo model, with the sessions store and its KV hooks, through the pilot."""

from __future__ import annotations

from textual.widgets import TextArea

from ssdmoe_tui.sessions.store import SessionStore
from ssdmoe_tui.ui.actions import model
from ssdmoe_tui.ui.app import ChatSettings
from ssdmoe_tui.ui.widgets.transcript import Notice, UserMessage
from tests.helpers.pilot import (
    SIZE,
    loaded,
    next_reply,
    open_settings,
    replies,
    save_settings,
    session_app,
    settings_error,
    tap,
    type_and_send,
    wait_until,
)


async def test_settings_regenerate_edit_and_resume(demo_model):
    store = SessionStore()
    app = session_app(ChatSettings(model=str(demo_model), max_tokens=30), store)
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot, app)
        trained = app.chat.model.trained_k
        # F9: a bad value is named on the screen and nothing applies until all are good.
        screen = await open_settings(pilot)
        screen.query_one("#set-system_prompt", TextArea).load_text("Be brief.")
        await save_settings(pilot, screen, max_tokens="many")
        assert app.screen is screen
        assert "Max tokens: 'many'" in settings_error(screen)
        await save_settings(pilot, screen, max_tokens="6", k=str(trained - 1))
        assert (app.chat.gen.max_tokens, app.chat.gen.system_prompt) == (6, "Be brief.")
        assert app.panel.k_control.k == trained - 1 and app.settings.max_tokens == 30

        await type_and_send(pilot, "hello")
        first = await next_reply(pilot, app, None)
        assert 0 < len(first.token_ids) <= 6 and set(first.k_per_token) == {trained - 1}
        sid = app.chat.session_id
        conv = store.get(sid)
        assert conv.settings["max_tokens"] == 6 and conv.system_prompt == "Be brief."

        # Regenerate, greedy, at another K: the same prompt; the KV prefix is reused.
        model.request_k(app, trained + 1)
        await tap(pilot, "ctrl+g")
        second = await next_reply(pilot, app, first)
        assert second.prompt_token_ids == first.prompt_token_ids
        assert set(second.k_per_token) == {trained + 1}
        assert second.stats["kv_hit_rate"] > 0.5, second.stats["kv_hit_rate"]
        old, new = replies(app)
        assert old.has_class("replaced") and "[replaced]" in str(old.header_text())
        header = str(new.header_text())
        assert f"K {trained + 1}" in header and "KV hit" in header and "tok/s" in header
        conv = store.get(sid)
        assert [t.text for t in conv.turns] == ["hello", second.text]
        assert [[t.text for t in g] for g in conv.replaced] == [["hello", first.text]]

        # Edit and resend the last prompt.
        await tap(pilot, "ctrl+l")
        await wait_until(
            pilot, lambda: app.chat_pane.editing and app.chat_pane.prompt.text == "hello",
            what="the last prompt back in the box",
        )  # fmt: skip
        app.chat_pane.prompt.load_text("hello again")
        await tap(pilot, "enter")
        third = await next_reply(pilot, app, second)
        assert third.stats["kv_hit_rate"] > 0  # the system prompt and turn header are reused
        users = list(app.query(UserMessage))
        assert [u.text for u in users] == ["hello", "hello again"]
        assert users[0].has_class("replaced") and not users[1].has_class("replaced")
        conv = store.get(sid)
        assert [t.text for t in conv.turns] == ["hello again", third.text]
        assert len(conv.replaced) == 2 and conv.settings["k"] == trained + 1
        assert "Replaced exchange 2" in store.export_markdown(sid)

    # Resumed later, the conversation goes on with its own settings and K.
    again = session_app(ChatSettings(model=str(demo_model), max_tokens=30, resume=""), store)
    async with again.run_test(size=SIZE) as pilot:
        await loaded(pilot, again)
        assert again.chat.session_id == sid
        notices = [str(n.render()) for n in again.query(Notice)]
        assert any("2 replaced exchanges kept" in n for n in notices), notices
        assert (again.chat.gen.max_tokens, again.chat.gen.system_prompt) == (6, "Be brief.")
        assert again.panel.k_control.k == trained + 1
        await type_and_send(pilot, "more")
        fourth = await next_reply(pilot, again, None)
        assert len(fourth.token_ids) <= 6 and set(fourth.k_per_token) == {trained + 1}

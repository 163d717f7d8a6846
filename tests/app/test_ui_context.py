"""The model's context is the conversation on screen (issue 22, defect 1): a system
prompt set in F9 mid-conversation, then regenerate, edit and resume; the real engine
on the demo model, its real tokenizer decoding every prompt the engine was given."""

from __future__ import annotations

from collections.abc import Awaitable

from transformers import AutoTokenizer

from ssdmoe_tui.sessions.store import SessionStore
from ssdmoe_tui.ui.app import ChatSettings, SsdmoeApp
from ssdmoe_tui.ui.screens.gen_settings import GenSettingsScreen
from ssdmoe_tui.ui.widgets.transcript import AssistantMessage, UserMessage
from tests.helpers.pilot import (
    SIZE,
    loaded,
    next_reply,
    open_settings,
    session_app,
    tap,
    type_and_send,
    wait_until,
)

SYSTEM = "Answer like a pirate"


def on_screen(app: SsdmoeApp) -> list[str]:
    """The texts of the turns on screen that are still in the conversation."""
    return [
        m.text
        for m in app.chat_pane.transcript.messages()
        if isinstance(m, UserMessage | AssistantMessage) and not m.has_class("replaced")
    ]


def assert_context_holds_the_screen(app: SsdmoeApp, tokenizer, system: str) -> None:
    done = app.chat.last_done
    context = tokenizer.decode(list(done.prompt_token_ids))
    shown = on_screen(app)
    assert shown, "nothing on screen"
    assert system in context, context
    *earlier, reply = shown
    for text in earlier:  # every turn before the reply is in the prompt it was made from
        assert text.strip() in context, (text, context)
    assert reply == done.text


async def reply(pilot, app: SsdmoeApp, step: Awaitable[object], what: str) -> None:
    """Run `step` (a send, a regenerate, a resend) and wait for its reply and the KV
    checkpoint saved after it: the reply's GenerationDone, not a look at `inflight`, which
    a fast regenerate has already left again when the test first looks."""
    before = app.chat.last_done
    await step
    await next_reply(pilot, app, before, 60, what)
    await wait_until(pilot, lambda: not app.chat.engine.busy, what="the KV checkpoint save")


def assert_metadata_kept(conv_id: str) -> None:
    conv = SessionStore().get(conv_id)
    replies = [t for t in conv.turns if t.role == "assistant"]
    assert replies and all(t.model == "demo-model" for t in replies), replies
    assert all(t.decode_tok_s is not None and t.k is not None for t in replies), replies
    assert all(t.token_ids for t in conv.turns), "a turn lost its token ids"
    created = [t.created for t in conv.turns]
    assert created == sorted(created) and len(set(created)) == len(created), created


async def test_system_prompt_mid_conversation_keeps_the_whole_history(demo_model):
    tokenizer = AutoTokenizer.from_pretrained(str(demo_model))
    app = session_app(ChatSettings(model=str(demo_model), max_tokens=8))
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot, app)
        await reply(pilot, app, type_and_send(pilot, "first question"), "reply 1")
        await reply(pilot, app, type_and_send(pilot, "second question"), "reply 2")
        await open_settings(pilot)
        app.screen.query_one("#set-system_prompt").load_text(SYSTEM)
        await pilot.press("ctrl+s")
        await wait_until(pilot, lambda: not isinstance(app.screen, GenSettingsScreen), what="save")
        await reply(pilot, app, type_and_send(pilot, "third question"), "reply 3")
        assert_context_holds_the_screen(app, tokenizer, SYSTEM)
        third = len(app.chat.last_done.prompt_token_ids)

        # regenerate: the same prompt, on the stored history
        await reply(pilot, app, tap(pilot, "ctrl+g"), "the regenerated reply")
        assert_context_holds_the_screen(app, tokenizer, SYSTEM)
        assert len(app.chat.last_done.prompt_token_ids) == third

        await tap(pilot, "ctrl+l")  # edit the last prompt and resend it
        await wait_until(pilot, lambda: app.chat_pane.editing, what="the edit")
        app.chat_pane.prompt.load_text("third question, edited")
        await reply(pilot, app, tap(pilot, "enter"), "the edited reply")
        assert_context_holds_the_screen(app, tokenizer, SYSTEM)
        assert len(app.chat.last_done.prompt_token_ids) >= third
        conv_id = app.chat.session_id
        await pilot.press("ctrl+q")
    assert_metadata_kept(conv_id)

    again = session_app(ChatSettings(model=str(demo_model), max_tokens=8, resume=""))
    async with again.run_test(size=SIZE) as pilot:
        await loaded(pilot, again)
        assert again.chat.session_id == conv_id
        restored = [m for m in again.chat_pane.transcript.messages() if not m.has_class("replaced")]
        details = [m.detail for m in restored if isinstance(m, AssistantMessage)]
        assert details and all("tok/s" in d and "K " in d for d in details), details
        await reply(pilot, again, type_and_send(pilot, "fourth question"), "reply 4")
        assert_context_holds_the_screen(again, tokenizer, SYSTEM)
        await reply(pilot, again, tap(pilot, "ctrl+g"), "the regenerated reply 4")
        assert_context_holds_the_screen(again, tokenizer, SYSTEM)
        await pilot.press("ctrl+q")
    assert_metadata_kept(conv_id)

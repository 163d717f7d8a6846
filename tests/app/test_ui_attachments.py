"""`@path` attachments (issue 22): Tab completes the path, a chip shows the file above
the prompt, its text reaches the model with the message and stays with the
conversation (and its export); too large or not text is one line and nothing is sent.
The real app and engine on the demo model; the prompt with the genuine Qwen3 template
and tokenizer."""

from __future__ import annotations

from dataclasses import replace

from mlx_lm.tokenizer_utils import TokenizerWrapper
from textual.widgets import Static
from transformers import AutoTokenizer

from ssdmoe_tui.chat.attachments import (
    FILE_LIMIT,
    AttachmentError,
    attachments_of,
    split_attached,
    with_attachments,
)
from ssdmoe_tui.commands.chat import engine_factory
from ssdmoe_tui.prompting.message import Message
from ssdmoe_tui.sessions.app_sessions import AppSessions
from ssdmoe_tui.sessions.store import SessionStore
from ssdmoe_tui.ui.app import ChatSettings, SsdmoeApp
from ssdmoe_tui.ui.widgets.transcript import UserMessage
from tests.app.test_ui_app import SIZE, errors, loaded, tap, wait_until
from tests.app.test_ui_snapshot import INFO
from tests.fixture_paths import MODELS

NOTES = "The launch code is 1234.\nKeep it safe."


def files(tmp_path):
    (tmp_path / "notes.txt").write_text(NOTES)
    (tmp_path / "big.log").write_text("x" * (FILE_LIMIT + 1))
    (tmp_path / "image.png").write_bytes(b"\x89PNG\r\n\x1a\n\xff\xfe")
    (tmp_path / "src").mkdir()
    return tmp_path


def test_what_is_attached_and_what_is_refused(tmp_path):
    base = files(tmp_path)
    (found,) = attachments_of("see @notes.txt, and mail me @home", base)  # @home: no file
    assert (found.name, found.text) == ("notes.txt", NOTES)
    message = with_attachments("see @notes.txt", [found])
    assert split_attached(message) == ("see @notes.txt", [found])
    assert split_attached("no files here") == ("no files here", [])
    for text, needle in (
        ("@big.log", "an attachment can be up to 256.0 KiB"),
        ("@image.png", "is not a text file"),
        ("@src", "is a folder"),
    ):
        try:
            attachments_of(text, base)
        except AttachmentError as e:
            assert needle in str(e) and "\n" not in str(e) and text in str(e), e
        else:
            raise AssertionError(f"{text} was attached")


def test_the_genuine_qwen3_prompt_carries_the_file(tmp_path):
    tok = TokenizerWrapper(AutoTokenizer.from_pretrained(str(MODELS / "qwen3-30b-a3b")))
    (note,) = attachments_of("@notes.txt", files(tmp_path))
    sessions = AppSessions(SessionStore(tmp_path / "store"))
    sid, _ = sessions.open(None)
    message = with_attachments("What does @notes.txt say?", [note])
    prompt = sessions.prompt(sid, [Message("user", message)], tok, replace(INFO, name="q"))
    text = tok.decode(prompt)
    user_turn = text[text.index("<|im_start|>user\n") : text.index("<|im_end|>")]
    assert NOTES in user_turn and "What does @notes.txt say?" in user_turn


async def test_attach_with_tab_completion_a_chip_and_the_model_sees_it(
    demo_model, tmp_path, monkeypatch
):
    monkeypatch.chdir(files(tmp_path))
    demo_tok = AutoTokenizer.from_pretrained(str(demo_model))
    app = SsdmoeApp(
        ChatSettings(model=str(demo_model), max_tokens=6),
        engine_factory=engine_factory,
        session_store=AppSessions(SessionStore()),
    )
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot, app)
        prompt = app.chat_pane.prompt
        prompt.focus()
        await pilot.press(*"what", "space", *"says", "space", "@", "n", "o", "tab")
        assert prompt.text == "what says @notes.txt"  # completed
        chips = app.chat_pane.query_one("#attachments", Static)
        await wait_until(pilot, lambda: chips.display, 5, "the chip")
        assert "📎 notes.txt" in str(chips.render())
        await tap(pilot, "enter")
        await wait_until(pilot, lambda: app.inflight is None and app.chat.last_done, 60, "reply")
        context = demo_tok.decode(list(app.chat.last_done.prompt_token_ids))
        assert NOTES in context and "what says @notes.txt" in context
        (shown,) = app.query(UserMessage)
        assert str(shown.query_one(".message-body", Static).render()) == "what says @notes.txt"
        assert "📎 notes.txt" in str(shown.query_one(".attached", Static).render())
        conv_id = app.chat.session_id
        await wait_until(pilot, lambda: not app.chat.engine.busy, 20, "the save")
        stored = SessionStore().get(conv_id)
        assert NOTES in stored.turns[0].text
        assert NOTES in SessionStore().export_markdown(conv_id)
        assert not chips.display  # the prompt was cleared with its chips

        # Too large: one line, above the prompt and on Enter; nothing is sent.
        await pilot.press("@", *"big.log")
        await wait_until(pilot, lambda: "✗" in str(chips.render()), 5, "the refusal chip")
        turns = len(app.chat.history)
        await tap(pilot, "enter")
        await wait_until(pilot, lambda: errors(app), 5, "the one line")
        assert "256.0 KiB" in errors(app)[-1] and "\n" not in errors(app)[-1]
        assert len(app.chat.history) == turns and prompt.text == "@big.log"

        # ctrl+l brings the prompt back as typed (its file is read again on resend).
        prompt.clear()
        await tap(pilot, "ctrl+l")
        await wait_until(pilot, lambda: app.chat_pane.editing, 5, "the edit")
        assert prompt.text == "what says @notes.txt"
        await pilot.press("escape")

"""Thinking shown apart (issue 22): the reasoning of templates that think is its own
collapsible block, its tokens counted in the header, and thinking on/off per
conversation reaches the template. The genuine Qwen3-30B-A3B tokenizer and template,
and the Qwen3.5 template, from tests/fixtures/models."""

from __future__ import annotations

from dataclasses import replace

import pytest
from mlx_lm.tokenizer_utils import TokenizerWrapper
from textual.widgets import Checkbox, Collapsible, Static
from transformers import AutoTokenizer

from ssdmoe_tui.chat.replies import ReplyStats, ShownTurn
from ssdmoe_tui.chat.thinking import (
    prompt_opens_thinking,
    split_thinking,
    template_kwargs,
    thinking_tokens,
)
from ssdmoe_tui.engine.run.protocol import ModelLoaded
from ssdmoe_tui.prompting.message import Message
from ssdmoe_tui.sessions.app_sessions import AppSessions
from ssdmoe_tui.sessions.store import SessionStore
from ssdmoe_tui.ui.app import ChatSettings, SsdmoeApp
from tests.helpers.fixture_paths import MODELS
from tests.helpers.pilot import open_settings, wait_until
from tests.helpers.ui_events import INFO

QWEN3 = MODELS / "qwen3-30b-a3b"
QWEN35_TEMPLATE = (MODELS / "qwen3.5-35b-a3b" / "chat_template.jinja").read_text()
REPLY = "<think>\nThe user asks for 2+2. That is 4.\n</think>\n\nThe answer is **4**."


@pytest.fixture(scope="module")
def qwen3():
    return TokenizerWrapper(AutoTokenizer.from_pretrained(str(QWEN3)))


@pytest.fixture(scope="module")
def qwen35():
    tok = AutoTokenizer.from_pretrained(str(QWEN3))  # the same vocabulary
    tok.chat_template = QWEN35_TEMPLATE
    return TokenizerWrapper(tok)


def test_split_and_count_the_reasoning_with_the_genuine_tokenizer(qwen3):
    split = split_thinking(REPLY)
    assert split.has_thinking and not split.open
    assert split.thinking == "The user asks for 2+2. That is 4."
    assert split.answer == "The answer is **4**."
    assert split_thinking("The answer is 4.") == split_thinking("The answer is 4.", False)
    assert not split_thinking("The answer is 4.").has_thinking
    # Streaming: a tag still arriving is held back, an open block is reasoning so far.
    assert split_thinking("<thi", False).answer == ""
    assert split_thinking("<think>\nHmm, so</thi", False).thinking == "Hmm, so"
    assert split_thinking("<think>\nHmm", False).open
    # Qwen3.5 / Nemotron open the block in the prompt: the reply only closes it.
    inside = split_thinking("Hmm.\n</think>\n\nYes.")
    assert (inside.thinking, inside.answer) == ("Hmm.", "Yes.")
    ids = qwen3._tokenizer.encode(REPLY, add_special_tokens=False)
    close = ids.index(qwen3._tokenizer.convert_tokens_to_ids("</think>"))
    assert thinking_tokens(ids + [151645], qwen3, REPLY) == close + 1
    assert thinking_tokens(ids, qwen3, "The answer is 4.") == 0
    cut = "<think>\nStill going"
    cut_ids = qwen3._tokenizer.encode(cut, add_special_tokens=False)
    assert thinking_tokens(cut_ids, qwen3, cut) == len(cut_ids)  # cut while thinking
    stats = ReplyStats("Qwen3", 40, 9.5, 8, 8, None, 12)
    assert stats.detail().startswith("40 tokens (12 thinking) · 9.5 tok/s")


def test_thinking_on_and_off_reach_the_template(tmp_path, qwen3, qwen35):
    info = replace(INFO, name="qwen3")
    for thinking in (True, False):
        sessions = AppSessions(SessionStore(tmp_path / str(thinking)))
        sid, _ = sessions.open(None)
        kw = template_kwargs(thinking)
        prompt = sessions.prompt(sid, [Message("user", "What is 2+2?")], qwen3, info, kw)
        text = qwen3.decode(prompt)
        assert text.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n") != thinking
        assert not prompt_opens_thinking(prompt, qwen3)  # Qwen3 lets the model open it
        # Qwen3.5 opens the block in the prompt when thinking is on.
        opened = qwen35.apply_chat_template(
            [{"role": "user", "content": "Hi"}], add_generation_prompt=True, **kw
        )
        assert prompt_opens_thinking(opened, qwen35) == thinking
    # A later turn with thinking off: the exact-history delta ends in the empty block.
    sessions = AppSessions(SessionStore(tmp_path / "later"))
    sid, _ = sessions.open(None)
    first = sessions.prompt(sid, [Message("user", "Hi")], qwen3, info, template_kwargs(True))
    reply_ids = qwen3._tokenizer.encode(REPLY, add_special_tokens=False) + [151645]
    from ssdmoe_tui.engine.run.protocol import GenerationDone

    done = GenerationDone(
        "r1", REPLY, tuple(first), tuple(reply_ids), "stop", (8,) * len(reply_ids)
    )
    sessions.record(sid, [Message("user", "Hi"), Message("assistant", REPLY)], done, "qwen3")
    chat = [Message("user", "Hi"), Message("assistant", REPLY), Message("user", "And 3+3?")]
    second = sessions.prompt(sid, chat, qwen3, info, template_kwargs(False))
    assert second[: len(first) + len(reply_ids)] == list(first) + reply_ids  # exact history
    assert qwen3.decode(second).endswith(
        "And 3+3?<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
    )


async def test_the_reasoning_is_a_collapsed_block_a_key_toggles(qwen3):
    app = SsdmoeApp(ChatSettings(), engine_factory=None)
    async with app.run_test(size=(120, 40)) as pilot:
        app.feed(ModelLoaded(INFO, tokenizer=qwen3))
        await pilot.pause()
        reply = await app.chat_pane.transcript.add_assistant("r1", INFO.name)
        for piece in (
            "<thi",
            "nk>\nThe user asks",
            " for 2+2. That is 4.\n</th",
            "ink>\n\nThe answer",
            " is **4**.",
        ):
            await reply.append(piece)
            await pilot.pause()
            if piece == " for 2+2. That is 4.\n</th":
                block = reply.query_one(Collapsible)
                assert block.display and block.collapsed and block.title == "thinking…"
                assert not reply.answer
        await reply.finish(
            REPLY, "stop", ReplyStats(INFO.name, 30, 9.0, 6, 6, None, 17).detail(), 17
        )
        await pilot.pause()
        block = reply.query_one(Collapsible)
        assert block.collapsed and block.title == "thinking · 17 tokens"
        assert str(block.query_one(".thinking-body", Static).render()) == (
            "The user asks for 2+2. That is 4."
        )
        assert "(17 thinking)" in str(reply.header_text())
        assert "<think>" not in reply.markdown.source and "The answer is" in reply.markdown.source
        await pilot.press("ctrl+t")  # from the prompt: the last reply's reasoning
        await wait_until(pilot, lambda: not block.collapsed, what="the block to open")
        reply.focus()
        await pilot.press("t")
        await wait_until(pilot, lambda: block.collapsed, what="the block to close")
        await pilot.press("f8")
        assert app.clipboard == "The answer is **4**."  # the answer, not the reasoning

        # A restored Qwen3.5 reply (its block opened by the prompt) is split the same way.
        stats = ReplyStats(INFO.name, 20, 8.0, 6, 6, None, 9)
        await app.chat_pane.show_turns(
            [ShownTurn("user", "Hi"), ShownTurn("assistant", "Hmm.\n</think>\n\nYes.", stats)]
        )
        restored = list(app.query("AssistantMessage"))[-1]
        assert restored.split.thinking == "Hmm." and restored.answer == "Yes."
        assert restored.query_one(Collapsible).title == "thinking · 9 tokens"


async def test_thinking_on_off_in_f9_and_the_palette():
    app = SsdmoeApp(ChatSettings(), engine_factory=None)
    async with app.run_test(size=(80, 24)) as pilot:
        app.feed(ModelLoaded(INFO))
        await pilot.pause()
        assert app.chat.gen.thinking  # the config's default
        await open_settings(pilot)
        box = app.screen.query_one("#set-thinking", Checkbox)
        assert (
            box.value and box.region.bottom <= app.screen.query_one("#gen-settings").region.bottom
        )
        box.value = False
        await pilot.press("ctrl+s")
        await wait_until(pilot, lambda: not app.chat.gen.thinking, what="thinking off")
        from ssdmoe_tui.ui.actions import gen_settings

        gen_settings.toggle_thinking(app)
        assert app.chat.gen.thinking
        assert app.chat.gen.as_dict()["thinking"] is True  # saved with the conversation

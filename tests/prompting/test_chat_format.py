"""Exact-history prompts against the genuine Qwen3 tokenizer and chat template.

The reused prefix (the previous turn's tokens) must equal what a full re-render of
the chat feeds the model, wherever the template renders history faithfully; where it
does not (Qwen3 think blocks), the difference must be exactly the think block.
"""

from __future__ import annotations

import pytest
from mlx_lm.tokenizer_utils import TokenizerWrapper
from transformers import AutoTokenizer

from ssdmoe_tui.prompting.chat_format import (
    ChatFormatError,
    encode,
    first_turn_tokens,
    next_turn_tokens,
    render,
    user_turn_delta,
)
from tests.helpers.chat_templates import CHATML, IM_END, QWEN3
from tests.helpers.fixture_paths import MODELS


@pytest.fixture(scope="module")
def tok() -> TokenizerWrapper:
    return TokenizerWrapper(AutoTokenizer.from_pretrained(str(QWEN3)))


def run_chat(tok, exchanges, system=None, stop_last=False, **kw):
    """Play a chat the way the engine does: every prompt extends the previous turn's
    tokens. Replies are 'generated' as the tokenization of their text plus <|im_end|>.
    Returns (messages, final prompt tokens, every prompt)."""
    messages = [{"role": "system", "content": system}] if system else []
    history: list[int] = []
    prompts = []
    for i, (user, reply) in enumerate(exchanges):
        if i == 0:
            prompt = first_turn_tokens(tok, messages + [{"role": "user", "content": user}], **kw)
        else:
            prompt = next_turn_tokens(tok, history, messages, user, **kw)
        prompts.append(prompt)
        messages.append({"role": "user", "content": user})
        if reply is None:
            return messages, prompt, prompts
        cut = stop_last and i == len(exchanges) - 2
        generated = encode(tok, reply) + ([] if cut else [IM_END])
        history = prompt + generated
        messages.append({"role": "assistant", "content": reply})
    return messages, history, prompts


def rerender(tok, messages, **kw) -> list[int]:
    return encode(tok, render(tok, messages, add_generation_prompt=True, **kw))


EXCHANGES = [
    ("Hi! What's 2+2?", "2 + 2 = 4."),
    ("And times three?", "That makes 12.\n\nAnything else?"),
    (
        "Write a haiku about caches.",
        "Keys kept in order,\nvalues wait for the next turn —\nno prefill today.",
    ),
    ("Thanks.", None),
]


def test_chatml_prefix_equals_full_rerender(tok):
    messages, prompt, prompts = run_chat(tok, EXCHANGES, system="Be brief.", chat_template=CHATML)
    assert prompt == rerender(tok, messages, chat_template=CHATML)
    for earlier, later in zip(prompts, prompts[1:], strict=False):
        assert later[: len(earlier)] == earlier  # each prompt extends the last one
    # the reused part really is the previous turn: its prompt + reply + <|im_end|>
    turn3 = prompts[2] + encode(tok, EXCHANGES[2][1]) + [IM_END]
    assert prompts[3][: len(turn3)] == turn3


def test_qwen3_template_non_thinking_history_equals_rerender(tok):
    messages, prompt, _ = run_chat(tok, EXCHANGES, system="You are terse.")
    expected = rerender(tok, messages)
    assert prompt == expected
    assert prompt[-3:] == encode(tok, "<|im_start|>assistant\n")


def test_first_turn_is_apply_chat_template(tok):
    msgs = [{"role": "system", "content": "S"}, {"role": "user", "content": "hello"}]
    ids = tok.apply_chat_template(msgs, add_generation_prompt=True)
    ids = ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids
    assert first_turn_tokens(tok, msgs) == list(ids)


def test_delta_keeps_text_after_end_of_turn_token(tok):
    history = (
        first_turn_tokens(tok, [{"role": "user", "content": "a"}]) + encode(tok, "b") + [IM_END]
    )
    msgs = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]
    delta = user_turn_delta(tok, history, msgs, "c")
    assert tok.decode(delta) == "\n<|im_start|>user\nc<|im_end|>\n<|im_start|>assistant\n"


def test_stopped_turn_is_closed_with_end_of_turn(tok):
    exchanges = [("Count to ten.", "1, 2, 3, 4"), ("Stop. Say hi.", None)]
    messages, prompt, prompts = run_chat(tok, exchanges, stop_last=True)
    # the reply was cut (no <|im_end|> generated): the delta closes it
    assert prompt[len(prompts[0]) + len(encode(tok, "1, 2, 3, 4"))] == IM_END
    assert prompt == rerender(tok, messages)


def test_qwen3_thinking_history_keeps_think_block(tok):
    """Qwen3's template drops <think>...</think> from earlier assistant turns; exact
    history keeps it (the model saw it when it wrote the answer, and the cache holds it)."""
    think = "<think>\nThe user wants a sum. 2+2=4.\n</think>\n\n"
    exchanges = [("What's 2+2?", think + "4."), ("Times three?", None)]
    messages, prompt, prompts = run_chat(tok, exchanges)
    full = rerender(tok, messages)
    assert prompt != full
    assert prompt[: len(prompts[0])] == prompts[0]
    text = tok.decode(prompt)
    assert think in text
    assert text.replace(think, "", 1) == tok.decode(full)


def test_qwen3_enable_thinking_false_keeps_empty_think_block(tok):
    exchanges = [("Hi", "Hello!"), ("Bye", None)]
    messages, prompt, _ = run_chat(tok, exchanges, enable_thinking=False)
    text = tok.decode(prompt)
    full = tok.decode(rerender(tok, messages, enable_thinking=False))
    empty = "<think>\n\n</think>\n\n"
    # the generation prompt put an empty think block before "Hello!"; a re-render drops it
    assert "assistant\n" + empty + "Hello!" in text
    assert text.replace(empty, "", 1) == full


@pytest.mark.parametrize("folder", ["qwen3.5-35b-a3b", "nemotron-3-nano-30b-a3b"])
def test_other_templates_delta_is_rerender_tail(tok, folder):
    """Qwen3.5 and Nemotron-3 templates (genuine text; Qwen3 vocabulary stands in for
    theirs, which shares the ChatML markers): the delta equals the tail of a re-render."""
    template = (MODELS / folder / "chat_template.jinja").read_text()
    exchanges = [("Hi there", "Hello! How can I help?"), ("Tell me a joke.", None)]
    messages, prompt, prompts = run_chat(tok, exchanges, chat_template=template)
    full = rerender(tok, messages, chat_template=template)
    delta = prompt[len(prompts[0]) + len(encode(tok, exchanges[0][1])) + 1 :]
    assert len(delta) > 5
    assert full[-len(delta) :] == delta
    assert tok.decode(delta).startswith("\n<|im_start|>user\nTell me a joke.<|im_end|>\n")


def test_errors_are_one_line(tok):
    with pytest.raises(ChatFormatError, match="assistant"):
        user_turn_delta(tok, [1, 2], [{"role": "user", "content": "x"}], "y")


def test_generated_stop_token_stands_in_for_a_different_closing_token(tok):
    """Like gpt-oss (<|return|> generated, <|end|> rendered): the generated stop token
    stays in history and the template's closing special token is not added after it."""
    template = CHATML.replace("'<|im_end|>' + '\\n'", "'<|endoftext|>' + '\\n'")
    assert "<|endoftext|>" in template
    msgs = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]
    history = first_turn_tokens(tok, msgs[:1], chat_template=template) + encode(tok, "b") + [IM_END]
    delta = user_turn_delta(tok, history, msgs, "c", chat_template=template)
    assert tok.decode(delta) == "\n<|im_start|>user\nc<|endoftext|>\n<|im_start|>assistant\n"


def test_template_without_closing_token_adds_nothing_to_drop(tok):
    template = (
        "{% for m in messages %}{{ m['role'] + ': ' + m['content'] + '\\n\\n' }}{% endfor %}"
        "{% if add_generation_prompt %}{{ 'assistant: ' }}{% endif %}"
    )
    msgs = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]
    history = first_turn_tokens(tok, msgs[:1], chat_template=template) + encode(tok, "b") + [IM_END]
    delta = user_turn_delta(tok, history, msgs, "c", chat_template=template)
    assert tok.decode(delta) == "\n\nuser: c\n\nassistant: "

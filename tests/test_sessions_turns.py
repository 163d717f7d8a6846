"""build_prompt / record_exchange against a stored conversation (genuine Qwen3 tokenizer)."""

from __future__ import annotations

import pytest
from mlx_lm.tokenizer_utils import TokenizerWrapper
from transformers import AutoTokenizer

from ssdmoe_tui.engine.chat_format import encode, render
from ssdmoe_tui.sessions.store import SessionStore
from ssdmoe_tui.sessions.turns import build_prompt, record_exchange, tokenizer_id
from tests.test_chat_format import CHATML, IM_END, QWEN3


@pytest.fixture(scope="module")
def tok():
    return TokenizerWrapper(AutoTokenizer.from_pretrained(str(QWEN3)))


def test_turns_build_the_exact_history(tmp_path, tok):
    store = SessionStore(tmp_path)
    conv = store.create("qwen3", "fp", "Be brief.")
    prompt, delta = build_prompt(tok, conv, "Hi")
    assert (
        prompt
        == delta
        == encode(
            tok,
            render(
                tok,
                conv.messages() + [{"role": "user", "content": "Hi"}],
                add_generation_prompt=True,
            ),
        )
    )
    reply = encode(tok, "Hello!") + [IM_END]
    assert record_exchange(store, conv, "Hi", delta, "Hello!", reply, "stop", [8] * len(reply))
    prompt2, delta2 = build_prompt(tok, store.get(conv.id), "Bye")
    assert prompt2 == prompt + reply + delta2
    assert tok.decode(delta2) == "\n<|im_start|>user\nBye<|im_end|>\n<|im_start|>assistant\n"
    saved = store.get(conv.id)
    assert saved.turns[1].k == 8 and not saved.turns[1].stopped
    assert saved.history_tokens() == prompt + reply


def test_stopped_and_failed_replies(tmp_path, tok):
    store = SessionStore(tmp_path)
    conv = store.create()
    _, delta = build_prompt(tok, conv, "Count")
    assert not record_exchange(store, conv, "Count", delta, "", [], "error")
    assert store.get(conv.id).turns == []  # a failed turn leaves the history untouched
    cut = encode(tok, "1, 2, 3")
    assert record_exchange(store, conv, "Count", delta, "1, 2, 3", cut, "cancelled", [4, 4, 2])
    saved = store.get(conv.id)
    assert saved.turns[1].stopped and saved.turns[1].k == 4
    _, delta2 = build_prompt(tok, saved, "Go on")
    assert delta2[0] == IM_END  # the cut reply is closed before the next user turn


def test_switching_tokenizer_rebuilds_the_token_history(tmp_path, tok):
    """Ids from one tokenizer mean nothing to another: the history is re-tokenized (as
    the new template renders it) before the next prompt is built."""
    store = SessionStore(tmp_path)
    conv = store.create("qwen3", "fp", "Sys")
    for user, reply in [("Hi", "Hello!"), ("More", "Sure: more.")]:
        _, delta = build_prompt(tok, conv, user)
        record_exchange(store, conv, user, delta, reply, encode(tok, reply) + [IM_END], "stop")
    other = TokenizerWrapper(AutoTokenizer.from_pretrained(str(QWEN3)))
    other._tokenizer.chat_template = CHATML.replace(
        "'\\n' }}{% endfor %}", "'\\n\\n' }}{% endfor %}"
    )
    assert tokenizer_id(other) != tokenizer_id(tok)
    conv = store.get(conv.id)
    prompt, delta = build_prompt(other, conv, "Last")
    full = conv.messages() + [{"role": "user", "content": "Last"}]
    assert prompt == encode(other, render(other, full, add_generation_prompt=True))
    assert conv.tokenizer_id == tokenizer_id(other)
    assert conv.history_tokens() + delta == prompt

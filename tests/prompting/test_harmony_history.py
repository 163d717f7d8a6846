"""Exact-history prompts on gpt-oss's genuine chat template (tests/fixtures/models/
gpt-oss-20b): a reply kept as generated (harmony markers in its text) goes back into the
template, a tool's result follows a call, and a new user turn follows an answer."""

from __future__ import annotations

import json

import pytest
from mlx_lm.utils import load_tokenizer

from ssdmoe_tui.prompting.chat_format import (
    first_turn_tokens,
    prompt_tokens,
    render,
    turn_delta,
    user_turn_delta,
)
from ssdmoe_tui.prompting.reply_format import reply_format_for
from tests.helpers.harmony_tokenizer import write_harmony_tokenizer
from tests.helpers.tools import TOOLS

REPLY_CALL = (
    "<|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant<|channel|>"
    'commentary to=functions.get_weather <|constrain|>json<|message|>{"city":"Paris"}'
)  # then <|call|>, the stop token (generated, not in the text)
REPLY_ANSWER = "<|channel|>final<|message|>It is 21 C in Paris."  # then <|return|>


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    folder = tmp_path_factory.mktemp("harmony-tok")
    ids = write_harmony_tokenizer(folder)
    return load_tokenizer(folder, eos_token_ids=[ids["<|return|>"], ids["<|call|>"]])


def ids_of(tok, text: str) -> list[int]:
    return list(tok.encode(text, add_special_tokens=False))


def test_a_tool_result_follows_the_generated_call(tok):
    user = {"role": "user", "content": "Weather in Paris?"}
    prompt = first_turn_tokens(tok, [user], tools=TOOLS)
    call_id = tok.convert_tokens_to_ids("<|call|>")
    history = prompt + ids_of(tok, REPLY_CALL) + [call_id]
    # as the app keeps it: the raw reply (the template refuses channel markers in content)
    reply = {"role": "assistant", "content": REPLY_CALL}
    result = {"role": "tool", "content": '{"temp": 21}', "tool_call_id": "call_0"}
    delta = turn_delta(tok, history, [user, reply], [result], tools=TOOLS)
    assert tok.decode(delta) == (
        '<|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>"{\\"temp\\":'
        ' 21}"<|end|><|start|>assistant'
    )
    # what the template renders after the same call, parsed apart (the call itself the
    # template writes its own way: the history keeps the model's)
    apart = {"role": "assistant", "content": "", "thinking": "Need the weather.",
             "tool_calls": [{"type": "function", "function": {
                 "name": "get_weather", "arguments": {"city": "Paris"}}}]}  # fmt: skip
    whole = render(tok, [user, apart, result], add_generation_prompt=True, tools=TOOLS)
    text = tok.decode(delta)
    assert whole.endswith("<|call|>" + text) and "Need the weather.<|end|>" in whole
    # the server's form of the same reply: content empty, the call apart
    sent = {"role": "assistant", "content": "", "tool_calls": [
        {"id": "c1", "type": "function",
         "function": {"name": "get_weather", "arguments": json.dumps({"city": "Paris"})}}]}  # fmt: skip
    assert turn_delta(tok, history, [user, sent], [result], tools=TOOLS) == delta


def test_a_user_turn_follows_an_answer(tok):
    user = {"role": "user", "content": "Weather in Paris?"}
    prompt = first_turn_tokens(tok, [user])
    history = prompt + ids_of(tok, REPLY_ANSWER) + [tok.convert_tokens_to_ids("<|return|>")]
    reply = {"role": "assistant", "content": REPLY_ANSWER}
    delta = user_turn_delta(tok, history, [user, reply], "And in Rome?")
    # the generated <|return|> stands in for the <|end|> the template puts mid-chat
    assert tok.decode(delta) == "<|start|>user<|message|>And in Rome?<|end|><|start|>assistant"
    # a whole re-render (no stored history) takes the raw reply apart too
    again = prompt_tokens(tok, [user, reply, {"role": "user", "content": "And in Rome?"}])
    assert "It is 21 C in Paris.<|end|><|start|>user" in tok.decode(again)


def test_an_attached_apps_think_block_is_the_analysis(tok):
    """The app attached to a server keeps reasoning_content as a <think> block before the
    answer: re-rendered, it is the analysis message, not text in the final one."""
    user = {"role": "user", "content": "Weather in Paris?"}
    call = {"id": "c1", "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}  # fmt: skip
    kept = {"role": "assistant", "content": "<think>\nNeed the weather.\n</think>\n\n",
            "tool_calls": [call]}  # fmt: skip
    result = {"role": "tool", "content": "21 C", "tool_call_id": "c1"}
    text = tok.decode(prompt_tokens(tok, [user, kept, result], tools=TOOLS))
    assert "<|channel|>analysis<|message|>Need the weather.<|end|>" in text
    assert "<think>" not in text


def test_the_format_names_the_tokens_that_end_a_reply(tok):
    """For the loader's stop set: harmony's <|call|> and <|return|>, whatever the
    checkpoint's generation_config.json lists; nothing for other formats."""
    fmt = reply_format_for(tok)
    ids = {tok.convert_tokens_to_ids(t) for t in ("<|call|>", "<|return|>")}
    assert fmt.end_token_ids(tok) == ids
    assert reply_format_for(None).end_token_ids(tok) == set()

"""gpt-oss's harmony replies in every API: the analysis channel is `reasoning_content`
(chat completions), a reasoning item (Responses) and a thinking block (Messages); the
final channel is the content; a commentary message to `functions.NAME` is a tool call.

The scripted gpt-oss reply (tests/helpers/scripted_gpt_oss.py) as the engine streams it
(text in pieces, then its stop token) through each API's stream, parsed by the official
packages' own types, with the checkpoint's tokenizer (gpt-oss's genuine template)."""

from __future__ import annotations

import asyncio
import json

import pytest
from openai.types.chat import ChatCompletionChunk

from ssdmoe_tui.checkpoint.config import load_tokenizer
from ssdmoe_tui.server.schema import parse_chat
from ssdmoe_tui.server.serving_chat import ServingChat
from tests.helpers.api_streams import messages_snapshot, responses_final
from tests.helpers.scripted_gpt_oss import (
    ANSWER_REPLY,
    ARGUMENTS,
    CALL_REPLY,
    write_gpt_oss_tool_model,
)
from tests.helpers.tools import collect, scripted, states

THOUGHT = "Need the weather."
CALL = ("get_weather", json.loads(ARGUMENTS))
TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Weather for a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                       "required": ["city"]}}},
]  # fmt: skip
FLAT = [{"type": "function", **t["function"]} for t in TOOLS]
ANTHROPIC_TOOLS = [
    {"name": t["function"]["name"], "input_schema": t["function"]["parameters"]} for t in TOOLS
]
QUESTION = "What is the weather in Paris?"


@pytest.fixture(scope="module")
def gpt_oss_model(tmp_path_factory):
    return write_gpt_oss_tool_model(tmp_path_factory.mktemp("gpt-oss") / "gpt-oss-tool-script")


@pytest.fixture(scope="module")
def tok(gpt_oss_model):
    return load_tokenizer(gpt_oss_model)


def test_the_checkpoint_decodes_its_script_under_mlx_lm(gpt_oss_model):
    """Resident mlx-lm, greedy: the call, then (the tool's result in context) the answer."""
    from mlx_lm import generate, load
    from mlx_lm.sample_utils import make_sampler

    model, tok = load(str(gpt_oss_model))
    msgs = [{"role": "user", "content": QUESTION}]

    def reply() -> str:
        prompt = tok.apply_chat_template(msgs, tools=TOOLS, add_generation_prompt=True)
        return generate(model, tok, prompt, max_tokens=40, sampler=make_sampler(0.0))

    assert reply() == CALL_REPLY
    call = {"type": "function", "function": {"name": CALL[0], "arguments": CALL[1]}}
    msgs += [{"role": "assistant", "content": "", "tool_calls": [call]},
             {"role": "tool", "content": "21 C, sunny"}]  # fmt: skip
    assert reply() == ANSWER_REPLY


def test_the_format_is_harmony_and_the_call_reply_streams_apart(tok):
    state = states(tok)
    assert state.reply_format.harmony and state.tool_format is None
    api = ServingChat(state)
    req = parse_chat({"model": "m", "messages": [{"role": "user", "content": QUESTION}],
                      "tools": TOOLS, "stream": True}, "m")  # fmt: skip
    prompt = state.builder.chat(req)
    job = scripted(tok, prompt, CALL_REPLY, piece=3)
    raw = collect(api.chat_stream(req, prompt, lambda: asyncio.sleep(0, job), job.request_id))
    chunks = [ChatCompletionChunk.model_validate(json.loads(r[6:])) for r in raw[:-1]]
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    assert "".join(d.model_extra.get("reasoning_content", "") for d in deltas) == THOUGHT
    assert "".join(d.content or "" for d in deltas) == ""
    calls = [c for d in deltas for c in d.tool_calls or []]
    assert [(c.function.name, json.loads(c.function.arguments)) for c in calls] == [CALL]
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_responses_reasoning_item_and_messages_thinking_block(tok):
    final = responses_final(tok, QUESTION, CALL_REPLY, FLAT, piece=5)
    assert [o.type for o in final.output] == ["reasoning", "function_call"]
    assert final.output[0].content[0].text == THOUGHT
    assert (final.output[1].name, json.loads(final.output[1].arguments)) == CALL
    analysis = tok.encode(CALL_REPLY[: CALL_REPLY.index("<|end|>") + 7], add_special_tokens=False)
    assert final.usage.output_tokens_details.reasoning_tokens == len(analysis)
    # Anthropic's tools without a description: gpt-oss's template needs one (given "")
    snap = messages_snapshot(tok, QUESTION, CALL_REPLY, ANTHROPIC_TOOLS, piece=4)
    assert [b.type for b in snap.content] == ["thinking", "tool_use"]
    assert snap.content[0].thinking == THOUGHT and snap.stop_reason == "tool_use"
    assert (snap.content[1].name, snap.content[1].input) == CALL

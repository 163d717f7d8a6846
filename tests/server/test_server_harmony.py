"""gpt-oss's harmony replies in every API: the analysis channel is `reasoning_content`
(chat completions), a reasoning item (Responses) and a thinking block (Messages); the
final channel is the content; a commentary message to `functions.NAME` is a tool call.

First the scripted gpt-oss reply (tests/helpers/scripted_gpt_oss.py) as the engine
streams it (text in pieces, then its stop token) through each API's stream, parsed by the
official packages' own types, with the checkpoint's tokenizer (gpt-oss's genuine
template); then `ssdmoe serve` on that checkpoint, whose greedy decoding is the reply,
driven by the `openai` and `anthropic` clients: the call, the tool's result, the answer,
and a Codex CLI turn (the request shape Codex CLI 0.171 sends, as
tests/server/test_server_responses.py records it: Codex CLI itself is not installed
here)."""

from __future__ import annotations

import asyncio
import json

import anthropic
import httpx
import openai
import pytest
from openai.lib.streaming.responses._responses import ResponseStreamState
from openai.types.chat import ChatCompletionChunk
from openai.types.responses import ResponseStreamEvent
from pydantic import TypeAdapter

from ssdmoe_tui.checkpoint.config import load_tokenizer
from ssdmoe_tui.server.schema import parse_chat
from ssdmoe_tui.server.serving_chat import ServingChat
from tests.helpers.api_streams import messages_snapshot, responses_final
from tests.helpers.scripted_gpt_oss import (
    ANSWER,
    ANSWER_REPLY,
    ARGUMENTS,
    CALL_REPLY,
    write_gpt_oss_tool_model,
)
from tests.helpers.server import serving
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


# ------------------------------------------------------------ ssdmoe serve, end to end


@pytest.fixture(scope="module")
def srv(gpt_oss_model, tmp_path_factory):
    with serving(gpt_oss_model, tmp_path_factory.mktemp("harmony-serve")) as running:
        yield running


def test_chat_completions_call_result_answer(srv):
    """The reasoning apart, the call in `tool_calls`; sent back with the tool's result,
    the answer on the final channel, the first turn's tokens reused from the cache."""
    c = srv.client()
    msgs = [{"role": "user", "content": QUESTION}]
    r = c.chat.completions.create(model=srv.model, messages=msgs, tools=TOOLS, max_tokens=60,
                                  temperature=0)  # fmt: skip
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.model_extra["reasoning_content"] == THOUGHT
    assert not choice.message.content
    (call,) = choice.message.tool_calls
    assert (call.function.name, json.loads(call.function.arguments)) == CALL
    msgs += [choice.message.model_dump(exclude_none=True),
             {"role": "tool", "tool_call_id": call.id, "content": "21 C, sunny"}]  # fmt: skip
    r2 = c.chat.completions.create(model=srv.model, messages=msgs, tools=TOOLS, max_tokens=60,
                                   temperature=0)  # fmt: skip
    assert r2.choices[0].finish_reason == "stop"
    assert r2.choices[0].message.content == ANSWER
    assert not r2.choices[0].message.tool_calls
    assert r2.usage.prompt_tokens_details.cached_tokens >= r.usage.prompt_tokens


def test_streamed_chat_completion_through_the_client(srv):
    c = srv.client()
    stream = c.chat.completions.create(
        model=srv.model, messages=[{"role": "user", "content": QUESTION}], tools=TOOLS,
        max_tokens=60, temperature=0, stream=True,
    )  # fmt: skip
    reasoning, content, calls, finish = "", "", [], None
    for chunk in stream:
        if not chunk.choices:
            continue
        d = chunk.choices[0].delta
        reasoning += (d.model_extra or {}).get("reasoning_content", "")
        content += d.content or ""
        calls += d.tool_calls or []
        finish = chunk.choices[0].finish_reason or finish
    assert (reasoning, content, finish) == (THOUGHT, "", "tool_calls")
    assert [(t.function.name, json.loads(t.function.arguments)) for t in calls] == [CALL]


def test_messages_thinking_block_and_tool_use(srv):
    a = anthropic.Anthropic(base_url=srv.url, api_key="unused", max_retries=0)
    m = a.messages.create(model=srv.model, max_tokens=60, tools=ANTHROPIC_TOOLS,
                          messages=[{"role": "user", "content": QUESTION}])  # fmt: skip
    assert [b.type for b in m.content] == ["thinking", "tool_use"]
    assert m.content[0].thinking == THOUGHT and m.stop_reason == "tool_use"
    assert (m.content[1].name, m.content[1].input) == CALL


def test_a_codex_cli_turn(srv):
    """Codex CLI's request (streamed, developer messages, its own tools beside the
    configured one, reasoning.summary, store false): the reasoning item, the call; then
    the call's output in the next request, and the answer."""
    shell = {"type": "function", "name": "exec_command", "strict": False,
             "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}}}  # fmt: skip
    tools = [shell, *FLAT, {"type": "web_search", "external_web_access": False}]
    inputs = [
        {"type": "message", "role": "developer",
         "content": [{"type": "input_text", "text": "You are a coding agent."}]},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": QUESTION}]},
    ]  # fmt: skip
    body = {"model": srv.model, "stream": True, "store": False, "tool_choice": "auto",
            "parallel_tool_calls": True, "reasoning": {"summary": "auto"},
            "include": ["reasoning.encrypted_content"], "prompt_cache_key": "codex-harmony",
            "tools": tools, "input": inputs, "max_output_tokens": 60}  # fmt: skip
    first = _responses_stream(srv, body, tools)
    assert [o.type for o in first.output] == ["reasoning", "function_call"]
    assert first.output[0].content[0].text == THOUGHT
    call = first.output[1]
    assert (call.name, json.loads(call.arguments)) == CALL
    assert first.usage.output_tokens_details.reasoning_tokens > 0
    # as Codex sends the turn back (store false): its reasoning item, the call, the output
    follow = [*inputs, first.output[0].model_dump(exclude_none=True),
              call.model_dump(exclude_none=True),
              {"type": "function_call_output", "call_id": call.call_id, "output": "21 C, sunny"}]  # fmt: skip
    second = _responses_stream(srv, {**body, "input": follow}, tools)
    assert [o.type for o in second.output] == ["message"]
    assert second.output[0].content[0].text == ANSWER
    assert second.usage.input_tokens_details.cached_tokens >= first.usage.input_tokens


def _responses_stream(srv, body: dict, tools: list):
    """POST the body as Codex does and accumulate its events with the package's state."""
    state = ResponseStreamState(input_tools=tools, text_format=openai.omit)
    adapter = TypeAdapter(ResponseStreamEvent)
    with httpx.stream("POST", srv.url + "/v1/responses", json=body, timeout=120) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                state.handle_event(adapter.validate_python(json.loads(line[6:])))
    return state._completed_response


def test_a_checkpoint_that_does_not_stop_on_call(gpt_oss_model, tmp_path):
    """gpt-oss-20b's first generation_config.json (the fixture's copy) stops on <|return|>
    and <|endoftext|> only: the model writes <|call|> as text and goes on. The server
    stops the engine there, and the client gets the call, as with the current file."""
    import shutil

    model = shutil.copytree(gpt_oss_model, tmp_path / "old-stops")
    tok = load_tokenizer(gpt_oss_model)
    ids = [tok.convert_tokens_to_ids(t) for t in ("<|return|>", "<|endoftext|>")]
    (model / "generation_config.json").write_text(json.dumps({"eos_token_id": ids}))
    with serving(model, tmp_path / "serve") as running:
        r = running.client().chat.completions.create(
            model=running.model, messages=[{"role": "user", "content": QUESTION}],
            tools=TOOLS, max_tokens=200, temperature=0,
        )  # fmt: skip
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.model_extra["reasoning_content"] == THOUGHT
    (call,) = choice.message.tool_calls
    assert (call.function.name, json.loads(call.function.arguments)) == CALL
    assert r.usage.completion_tokens < 200  # stopped at <|call|>, not at max_tokens

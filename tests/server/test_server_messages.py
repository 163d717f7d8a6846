"""`POST /v1/messages` and `/v1/messages/count_tokens` (Anthropic's Messages API)
through a real server on a loopback port, driven by the official `anthropic` package:
the same greedy text as chat completions, streamed events its helpers accumulate,
tool_use / tool_result blocks, stop_sequences, usage with cache_read_input_tokens,
x-api-key and Bearer auth, errors in Anthropic's envelope.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json

import anthropic
import httpx
import pytest
from anthropic.lib.streaming._messages import accumulate_event
from anthropic.types import RawMessageStreamEvent
from pydantic import TypeAdapter

from ssdmoe_tui.checkpoint.config import load_tokenizer
from ssdmoe_tui.prompting.chat_format import first_turn_tokens
from ssdmoe_tui.prompting.output import OutputFilter
from ssdmoe_tui.server.engine_client import AsyncEngine
from ssdmoe_tui.server.prompts import HistoryRecords, PromptBuilder
from ssdmoe_tui.server.schema_messages import parse_messages
from ssdmoe_tui.server.serving_engine import ApiSettings, ServerState
from ssdmoe_tui.server.serving_messages import ServingMessages
from tests.helpers.server import serving
from tests.helpers.texts import SYSTEM
from tests.helpers.tools import CALLS, OUTPUTS, scripted

TOOLS = [
    {"name": "get_weather", "description": "Weather for a city",
     "input_schema": {"type": "object", "properties": {
         "city": {"type": "string"}, "days": {"type": "integer"}}, "required": ["city"]}},
    {"name": "get_time", "description": "Local time",
     "input_schema": {"type": "object", "properties": {"tz": {"type": "string"}}}},
]  # fmt: skip
CHAT_TOOLS = [
    {"type": "function", "function": {"name": t["name"], "description": t["description"],
                                      "parameters": t["input_schema"]}}
    for t in TOOLS
]  # fmt: skip
EVENTS = TypeAdapter(RawMessageStreamEvent)


@pytest.fixture(scope="module")
def srv(tool_model, tmp_path_factory):
    with serving(tool_model, tmp_path_factory.mktemp("messages")) as running:
        yield running


def client(srv, **kw) -> anthropic.Anthropic:
    kw.setdefault("api_key", "unused")
    return anthropic.Anthropic(base_url=srv.url, max_retries=0, **kw)


def prompt_of(usage) -> int:
    return usage.input_tokens + usage.cache_read_input_tokens


def test_create_equals_chat_and_reports_cache_reads(srv):
    user = [{"role": "user", "content": "Hello there"}]
    m = client(srv).messages.create(model=srv.model, system=SYSTEM, messages=user,
                                    max_tokens=8, extra_body={"temperature": 0})  # fmt: skip
    chat = srv.client().chat.completions.create(
        model=srv.model, max_tokens=8, temperature=0,
        messages=[{"role": "system", "content": SYSTEM}, *user])  # fmt: skip
    assert m.type == "message" and m.role == "assistant" and m.id.startswith("msg_")
    assert [b.type for b in m.content] == ["text"]
    assert m.content[0].text == chat.choices[0].message.content
    assert m.stop_reason == "max_tokens" and m.stop_sequence is None
    assert prompt_of(m.usage) == chat.usage.prompt_tokens and m.usage.output_tokens == 8
    # the second request (same prompt) was served from the cache, counted as Anthropic does
    again = client(srv).messages.create(model=srv.model, system=SYSTEM, messages=user,
                                        max_tokens=2)  # fmt: skip
    assert again.usage.cache_read_input_tokens >= 0.9 * prompt_of(again.usage)
    assert again.usage.input_tokens == prompt_of(again.usage) - again.usage.cache_read_input_tokens
    n = client(srv).messages.count_tokens(model=srv.model, system=SYSTEM, messages=user)
    assert n.input_tokens == prompt_of(m.usage)


def test_stream_accumulates_in_the_anthropic_package(srv):
    kw = {"model": srv.model, "max_tokens": 6, "extra_body": {"temperature": 0, "top_k": 3},
          "messages": [{"role": "user", "content": [{"type": "text", "text": "Tell me more"}]}]}  # fmt: skip
    whole = client(srv).messages.create(**kw)
    with client(srv).messages.stream(**kw) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == whole.content[0].text == final.content[0].text
    assert final.stop_reason == "max_tokens" and final.usage.output_tokens == 6
    assert final.usage.cache_read_input_tokens > 0
    assert prompt_of(final.usage) == prompt_of(whole.usage)
    raw = [e.type for e in client(srv).messages.create(**kw, stream=True)]
    assert raw[:2] == ["message_start", "content_block_start"]
    assert raw[-4:] == ["content_block_delta", "content_block_stop", "message_delta",
                        "message_stop"]  # fmt: skip


def test_multi_turn_reuses_the_cache_and_stop_sequences(srv):
    c = client(srv)
    msgs = [{"role": "user", "content": "First question?"}]
    m1 = c.messages.create(model=srv.model, system=SYSTEM, messages=msgs, max_tokens=6)
    msgs += [{"role": "assistant", "content": m1.content[0].text},
             {"role": "user", "content": "And then?"}]  # fmt: skip
    m2 = c.messages.create(model=srv.model, system=SYSTEM, messages=msgs, max_tokens=6)
    assert m2.usage.cache_read_input_tokens >= 0.97 * prompt_of(m2.usage), m2.usage
    text = m2.content[0].text
    stop = text[len(text) // 2 : len(text) // 2 + 2]
    m3 = c.messages.create(model=srv.model, system=SYSTEM, messages=msgs, max_tokens=6,
                           stop_sequences=["\x00never", stop])  # fmt: skip
    assert m3.stop_reason == "stop_sequence" and m3.stop_sequence == stop
    assert m3.content[0].text == text[: text.index(stop)]


def test_tool_use_and_tool_result_blocks_render_as_tool_turns(srv, tool_model):
    msgs = [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": [
            {"type": "text", "text": "Let me look."},
            {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny, 21 C"}]},
    ]  # fmt: skip
    m = client(srv).messages.create(model=srv.model, messages=msgs, tools=TOOLS, max_tokens=3)
    chat = [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "Let me look.", "tool_calls": [{"id": "toolu_1",
         "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
        {"role": "tool", "tool_call_id": "toolu_1", "content": "sunny, 21 C"},
    ]  # fmt: skip
    tok = load_tokenizer(tool_model)
    assert prompt_of(m.usage) == len(first_turn_tokens(tok, chat, tools=CHAT_TOOLS))


def test_claude_code_request_shape(srv):
    """What Claude Code 2.1 sends (captured): system as text blocks with cache_control, a
    system message between its user messages, thinking adaptive, output_config.effort,
    context_management, metadata, max_tokens 32000 (clamped to the context)."""
    body = {
        "model": srv.model, "max_tokens": 32000, "stream": False,
        "system": [{"type": "text", "text": "x-anthropic-billing-header: cc_version=2"},
                   {"type": "text", "text": SYSTEM, "cache_control": {"type": "ephemeral"}}],
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "<system-reminder>ctx"}]},
            {"role": "system", "content": "Available agent types: claude"},
            {"role": "user", "content": [{"type": "text", "text": "Say hello"}]},
        ],
        "thinking": {"type": "adaptive"}, "output_config": {"effort": "high"},
        "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
        "metadata": {"user_id": "{}"},
        "tools": [{"name": "Bash", "description": "run", "input_schema": {"type": "object"}}],
    }  # fmt: skip
    req = parse_messages(body, srv.model)
    assert [m.role for m in req.chat.messages] == ["system", "user", "user", "user"]
    body["max_tokens"] = 2  # the clamp is tests/server/test_server.py's; keep this short
    r = httpx.post(srv.url + "/v1/messages?beta=true", json=body, timeout=60)
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["output_tokens"] == 2


def test_auth_and_errors_in_anthropics_envelope(srv):
    state = srv.server.state
    settings = state.settings
    user = [{"role": "user", "content": "Hi"}]
    try:
        state.settings = dataclasses.replace(settings, api_key="sekrit")
        for kw in ({"api_key": "sekrit"}, {"api_key": None, "auth_token": "sekrit"}):
            m = client(srv, **kw).messages.create(model=srv.model, messages=user, max_tokens=1)
            assert m.usage.output_tokens == 1
        with pytest.raises(anthropic.AuthenticationError) as e:
            client(srv, api_key="wrong").messages.create(model=srv.model, messages=user,
                                                         max_tokens=1)  # fmt: skip
        assert e.value.body["type"] == "error"
        assert e.value.body["error"]["type"] == "authentication_error"
    finally:
        state.settings = settings
    c = client(srv)
    with pytest.raises(anthropic.NotFoundError) as e:
        c.messages.create(model="claude-sonnet-4-5", messages=user, max_tokens=1)
    assert e.value.body["error"]["type"] == "not_found_error"
    bad = [
        {"messages": user},  # no max_tokens
        {"messages": user, "max_tokens": 1, "temperature": 1.5},
        {
            "messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}],
            "max_tokens": 1,
        },  # fmt: skip
        {"messages": user, "max_tokens": 1, "tool_choice": {"type": "any"}},
        {"messages": user, "max_tokens": 1, "output_config": {"format": {"type": "json_schema"}}},
        {
            "messages": user,
            "max_tokens": 1,
            "tools": [{"type": "web_search_20250305", "name": "web_search"}],
        },  # fmt: skip
    ]
    for body in bad:
        r = httpx.post(srv.url + "/v1/messages", json={"model": srv.model, **body}, timeout=60)
        assert r.status_code == 400, (body, r.text)
        assert r.json()["type"] == "error" and r.json()["error"]["type"] == "invalid_request_error"


def test_streamed_tool_use_accumulates_in_the_anthropic_package(tool_model):
    """Qwen3's recorded tool-call reply through the events generator: every event
    validates as the package's type, its accumulator builds both tool_use blocks."""
    tok = load_tokenizer(tool_model)
    engine = AsyncEngine(lambda post: None)
    engine.tokenizer = tok
    serving = ServingMessages(ServerState(engine, PromptBuilder(tok, HistoryRecords(None)),
                                          ApiSettings("m")))  # fmt: skip
    req = parse_messages({"model": "m", "max_tokens": 64, "stream": True, "tools": TOOLS,
                          "messages": [{"role": "user", "content": "Paris?"}]}, "m")  # fmt: skip
    prompt = serving.state.builder.chat(req.chat)
    job = scripted(tok, prompt, OUTPUTS["qwen3-30b-a3b"], piece=5, reused=3, rid="msg-test")
    filt = OutputFilter((), serving.state.tool_format, req.chat.tools)

    async def collect() -> list[str]:
        return [
            e
            async for e in serving._events(
                req, prompt, lambda: asyncio.sleep(0, job), filt, job.request_id
            )
        ]

    snapshot, bufs = None, {}
    for raw in asyncio.run(collect()):
        kind, data = raw.split("\n", 1)
        event = EVENTS.validate_python(json.loads(data[len("data: ") :]))
        assert kind == f"event: {event.type}"
        snapshot = accumulate_event(event=event, current_snapshot=snapshot, json_bufs=bufs)
    assert snapshot.stop_reason == "tool_use"
    calls = [(b.name, b.input) for b in snapshot.content if b.type == "tool_use"]
    assert calls == CALLS
    assert snapshot.usage.cache_read_input_tokens == 3
    assert snapshot.usage.input_tokens == len(prompt.tokens) - 3

"""`POST /v1/responses` (OpenAI's Responses API, what Codex CLI speaks) through a real
server on a loopback port, driven by the official `openai` package: the same greedy text
as chat completions, streamed events the package parses and accumulates, function
tools with function_call / function_call_output items, previous_response_id served
from the prompt cache, max_output_tokens, usage with cached tokens, 400s naming the field.
"""

from __future__ import annotations

import asyncio
import json

import httpx
import openai
import pytest
from openai.lib.streaming.responses._responses import ResponseStreamState
from openai.types.responses import ResponseStreamEvent
from pydantic import TypeAdapter

from ssdmoe_tui.checkpoint.config import load_tokenizer
from ssdmoe_tui.prompting.chat_format import first_turn_tokens
from ssdmoe_tui.prompting.output import OutputFilter
from ssdmoe_tui.server.engine_client import AsyncEngine
from ssdmoe_tui.server.prompts import HistoryRecords, PromptBuilder
from ssdmoe_tui.server.schema_responses import parse_responses
from ssdmoe_tui.server.serving_engine import ApiSettings, ServerState
from ssdmoe_tui.server.serving_responses import ServingResponses, _Run
from tests.helpers.server import serving
from tests.helpers.texts import SYSTEM
from tests.helpers.tools import CALLS, OUTPUTS, scripted

# the Responses form of tests/server/test_server_tools.py's TOOLS (flat, not nested)
TOOLS = [
    {"type": "function", "name": "get_weather", "description": "Weather for a city",
     "parameters": {"type": "object", "properties": {
         "city": {"type": "string"}, "days": {"type": "integer"}}, "required": ["city"]}},
    {"type": "function", "name": "get_time", "description": "Local time",
     "parameters": {"type": "object", "properties": {"tz": {"type": "string"}}}},
]  # fmt: skip
CHAT_TOOLS = [
    {"type": "function", "function": {k: v for k, v in t.items() if k != "type"}} for t in TOOLS
]
EVENTS = TypeAdapter(ResponseStreamEvent)


@pytest.fixture(scope="module")
def srv(tool_model, tmp_path_factory):
    with serving(tool_model, tmp_path_factory.mktemp("responses")) as running:
        yield running


def test_create_equals_chat_and_reports_usage(srv):
    c = srv.client()
    r = c.responses.create(model=srv.model, instructions=SYSTEM, input="Hello there",
                           max_output_tokens=8, temperature=0)  # fmt: skip
    chat = c.chat.completions.create(
        model=srv.model, max_tokens=8, temperature=0,
        messages=[{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Hello there"}],
    )  # fmt: skip
    assert r.object == "response" and r.id.startswith("resp_")
    assert r.output_text == chat.choices[0].message.content
    assert [o.type for o in r.output] == ["message"]
    assert r.usage.input_tokens == chat.usage.prompt_tokens
    assert r.usage.output_tokens == chat.usage.completion_tokens == 8
    assert r.usage.total_tokens == r.usage.input_tokens + 8
    # the chat request ran the same prompt: served from the cache
    assert chat.usage.prompt_tokens_details.cached_tokens >= 0.9 * chat.usage.prompt_tokens
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    assert r.instructions == SYSTEM and r.max_output_tokens == 8
    assert r.model_extra["ssdmoe"]["stats"]["generated_tokens"] == 8


def test_stream_events_parse_and_match_create(srv):
    c = srv.client()
    kw = {"model": srv.model, "input": [{"role": "user", "content": "Tell me more"}],
          "max_output_tokens": 6, "temperature": 0}  # fmt: skip
    whole = c.responses.create(**kw)
    with c.responses.stream(**kw) as stream:
        events = list(stream)
    kinds = [e.type for e in events]
    assert kinds[:4] == ["response.created", "response.in_progress",
                         "response.output_item.added", "response.content_part.added"]  # fmt: skip
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done",
                          "response.output_item.done", "response.incomplete"]  # fmt: skip
    assert [e.sequence_number for e in events] == list(range(len(events)))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == whole.output_text
    final = events[-1].response
    assert final.output_text == text and final.usage.output_tokens == 6
    assert final.usage.input_tokens_details.cached_tokens > 0  # the same prompt just ran
    # the plain iterator gives the same typed events (deltas batch as the engine's timing does)
    raw = [e for e in c.responses.create(**kw, stream=True)]
    assert "".join(e.delta for e in raw if e.type == "response.output_text.delta") == text

    def skeleton(kinds: list[str]) -> list[str]:
        return [k for k in kinds if k != "response.output_text.delta"]

    assert skeleton([e.type for e in raw]) == skeleton(kinds)


def test_previous_response_id_continues_from_the_cache(srv):
    c = srv.client()
    r1 = c.responses.create(model=srv.model, instructions=SYSTEM, input="First question?",
                            max_output_tokens=6)  # fmt: skip
    r2 = c.responses.create(model=srv.model, instructions=SYSTEM, input="And then?",
                            previous_response_id=r1.id, max_output_tokens=6)  # fmt: skip
    u = r2.usage
    assert u.input_tokens_details.cached_tokens >= 0.97 * u.input_tokens, u
    assert r2.previous_response_id == r1.id
    # the same conversation sent as chat messages is the same prompt
    chat = c.chat.completions.create(model=srv.model, max_tokens=1, messages=[
        {"role": "system", "content": SYSTEM}, {"role": "user", "content": "First question?"},
        {"role": "assistant", "content": r1.output_text},
        {"role": "user", "content": "And then?"}])  # fmt: skip
    assert chat.usage.prompt_tokens == u.input_tokens
    with pytest.raises(openai.BadRequestError) as e:
        c.responses.create(model=srv.model, input="x", previous_response_id="resp_nope")
    assert e.value.code == "previous_response_not_found"


def test_function_call_items_render_as_tool_turns(srv, tool_model):
    c = srv.client()
    items = [
        {"role": "user", "content": "Weather in Paris?"},
        {"type": "function_call", "call_id": "call_1", "name": "get_weather",
         "arguments": json.dumps({"city": "Paris"})},
        {"type": "function_call_output", "call_id": "call_1", "output": "sunny, 21 C"},
    ]  # fmt: skip
    r = c.responses.create(model=srv.model, input=items, tools=TOOLS, max_output_tokens=4)
    tok = load_tokenizer(tool_model)
    chat = [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "", "tool_calls": [{"id": "call_1", "type": "function",
         "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21 C"},
    ]  # fmt: skip
    assert r.usage.input_tokens == len(first_turn_tokens(tok, chat, tools=CHAT_TOOLS))
    assert [t.name for t in r.tools] == ["get_weather", "get_time"]


def test_codex_cli_request_shape(srv):
    """What Codex CLI 0.171 sends (captured): developer messages before the user's, a
    `namespace` tool, the hosted `web_search`, reasoning.summary, store false, include,
    prompt_cache_key, client_metadata. Namespace members are tools; hosted tools run
    nowhere and are named in ssdmoe.skipped_tools; the developer messages are one
    system message."""
    fn = {"type": "function", "name": "exec_command", "strict": False,
          "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}}}  # fmt: skip
    body = {
        "model": srv.model, "stream": False, "store": False, "tool_choice": "auto",
        "parallel_tool_calls": True, "reasoning": {"summary": "auto"},
        "include": ["reasoning.encrypted_content"], "prompt_cache_key": "abc",
        "client_metadata": {"x-codex-turn-metadata": "{}"}, "max_output_tokens": 2,
        "tools": [fn, {"type": "namespace", "name": "multi_agent_v1", "description": "agents",
                       "tools": [{**fn, "name": "spawn_agent"}]},
                  {"type": "web_search", "external_web_access": False}],
        "input": [
            {"type": "message", "role": "developer",
             "content": [{"type": "input_text", "text": SYSTEM}]},
            {"type": "message", "role": "developer",
             "content": [{"type": "input_text", "text": "<skills>none</skills>"}]},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]},
        ],
    }  # fmt: skip
    r = httpx.post(srv.url + "/v1/responses", json=body, timeout=60)
    assert r.status_code == 200, r.text
    got = r.json()
    assert got["ssdmoe"]["skipped_tools"] == ["web_search"]
    req = parse_responses(body, srv.model)
    assert [m.role for m in req.chat().messages] == ["system", "user"]
    assert req.namespaces == {"spawn_agent": "multi_agent_v1"}
    assert [t["function"]["name"] for t in req.tools] == ["exec_command", "spawn_agent"]


@pytest.mark.parametrize(
    "patch, param",
    [
        ({"tools": [{"type": "unheard_of"}]}, "tools"),
        (
            {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
            "input",
        ),  # fmt: skip
        ({"text": {"format": {"type": "json_schema", "name": "x", "schema": {}}}}, "text"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"max_output_tokens": 0}, "max_output_tokens"),
        ({"input": []}, "input"),
    ],
)
def test_bad_requests_name_the_field(srv, patch, param):
    body = {"model": srv.model, "input": "hi", "max_output_tokens": 2, **patch}
    r = httpx.post(srv.url + "/v1/responses", json=body, timeout=60)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param


def test_streamed_tool_calls_accumulate_in_the_openai_package(tool_model):
    """Qwen3's recorded tool-call reply, as the engine streams it, through the events
    generator: every event validates as the package's type, and its accumulator builds
    the final response with both calls."""
    tok = load_tokenizer(tool_model)
    engine = AsyncEngine(lambda post: None)
    engine.tokenizer = tok
    serving = ServingResponses(ServerState(engine, PromptBuilder(tok, HistoryRecords(None)),
                                           ApiSettings("m")))  # fmt: skip
    req = parse_responses({"model": "m", "input": "Paris?", "tools": TOOLS, "stream": True}, "m")
    chat = req.chat()
    prompt = serving.state.builder.chat(chat)
    job = scripted(tok, prompt, OUTPUTS["qwen3-30b-a3b"], piece=7, rid="resp-test")
    run = _Run(req, chat, ())
    filt = OutputFilter((), serving.state.tool_format, chat.tools)

    async def collect() -> list[str]:
        return [e async for e in serving._events(run, prompt, lambda: asyncio.sleep(0, job), filt)]

    state = ResponseStreamState(input_tools=TOOLS, text_format=openai.omit)
    for raw in asyncio.run(collect()):
        kind, data = raw.split("\n", 1)
        event = EVENTS.validate_python(json.loads(data[len("data: ") :]))
        assert kind == f"event: {event.type}"
        state.handle_event(event)
    final = state._completed_response
    assert final is not None and final.status == "completed"
    calls = [o for o in final.output if o.type == "function_call"]
    assert [(o.name, json.loads(o.arguments)) for o in calls] == CALLS
    assert final.output[0].type == "message" and "<think>" in final.output[0].content[0].text
    assert serving.store.get(run.id)[-1].tool_calls  # stored for previous_response_id

"""The think block apart from the answer, in every API: `reasoning_content` in chat
completions, a reasoning item in Responses, a thinking block in Messages; `content`
holds the answer and tool calls come from the answer only. Recorded replies through the
genuine Qwen3 tokenizer (tests/fixtures/models) and the packages' own types, then a real
server on a thinking template: the split, `enable_thinking`, and the prompt cache's
hit rate on the next turn.
"""

from __future__ import annotations

import asyncio
import json

import anthropic
import pytest
from openai.types.chat import ChatCompletionChunk

from ssdmoe_tui.prompting.output import Call, Content, OutputFilter, Reasoning, think_format_for
from ssdmoe_tui.server.schema import parse_chat
from ssdmoe_tui.server.serving_chat import ServingChat
from tests.helpers.api_streams import messages_snapshot, responses_final
from tests.helpers.server import serving
from tests.helpers.texts import SYSTEM
from tests.helpers.tools import CALLS, OUTPUTS, TOOLS, collect, scripted, states

QWEN3 = "qwen3-30b-a3b"
THOUGHT = "The user wants the weather and the time.\n"
ANSWER_AFTER_THINK = "I am thinking.\n</think>\n\nParis is sunny."  # Qwen3.5: prompt opened it


@pytest.mark.parametrize("size", [1, 2, 5, 64])
def test_the_think_block_is_split_off_in_pieces_of_any_size(tokenizers, size):
    tok = tokenizers[QWEN3]
    fmt = think_format_for(tok)
    assert (fmt.start, fmt.end) == ("<think>", "</think>")
    from ssdmoe_tui.prompting.output import tool_format_for
    from tests.helpers.tools import run_filter

    filt = OutputFilter((), tool_format_for(tok), [t for t in TOOLS], fmt)
    pieces = run_filter(filt, OUTPUTS[QWEN3], size)
    assert "".join(p.text for p in pieces if isinstance(p, Reasoning)) == THOUGHT
    assert [(p.call.name, json.loads(p.call.arguments)) for p in pieces
            if isinstance(p, Call)] == CALLS  # fmt: skip
    assert "".join(p.text for p in pieces if isinstance(p, Content)).strip() == ""
    # a prompt that opened the block: everything up to </think> is reasoning
    filt = OutputFilter((), None, None, fmt, in_think=True)
    pieces = run_filter(filt, ANSWER_AFTER_THINK, size)
    assert "".join(filt.reasoning) == "I am thinking.\n"
    assert "".join(filt.content) == "Paris is sunny."
    assert all(not isinstance(p, Content) or "think" not in p.text for p in pieces)


def test_chat_completions_stream_reasoning_content(tokenizers):
    tok = tokenizers[QWEN3]
    api = ServingChat(states(tok))
    req = parse_chat({"model": "m", "messages": [{"role": "user", "content": "Paris?"}],
                      "tools": TOOLS, "stream": True}, "m")  # fmt: skip
    prompt = api.state.builder.chat(req)
    job = scripted(tok, prompt, OUTPUTS[QWEN3])
    raw = collect(api.chat_stream(req, prompt, lambda: asyncio.sleep(0, job), job.request_id))
    chunks = [ChatCompletionChunk.model_validate(json.loads(r[6:])) for r in raw[:-1]]
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    assert "".join(d.model_extra.get("reasoning_content", "") for d in deltas) == THOUGHT
    assert "".join(d.content or "" for d in deltas).strip() == ""
    assert sum(len(d.tool_calls or []) for d in deltas) == 2


def test_responses_reasoning_item_and_messages_thinking_block(tokenizers):
    tok = tokenizers[QWEN3]
    flat = [{"type": "function", **t["function"]} for t in TOOLS]
    final = responses_final(tok, "Paris?", OUTPUTS[QWEN3], flat)
    assert [o.type for o in final.output] == ["reasoning", "function_call", "function_call"]
    assert final.output[0].content[0].text == THOUGHT
    assert final.usage.output_tokens_details.reasoning_tokens > 0
    # Messages: a thinking block first, then the tool_use blocks
    anth_tools = [{"name": t["function"]["name"], "input_schema": t["function"]["parameters"]}
                  for t in TOOLS]  # fmt: skip
    snap = messages_snapshot(tok, "Paris?", OUTPUTS[QWEN3], anth_tools)
    assert [b.type for b in snap.content] == ["thinking", "tool_use", "tool_use"]
    assert snap.content[0].thinking == THOUGHT and snap.stop_reason == "tool_use"


@pytest.fixture(scope="module")
def srv(think_model, tmp_path_factory):
    with serving(think_model, tmp_path_factory.mktemp("reasoning")) as running:
        yield running


def test_a_thinking_template_through_the_server(srv):
    """Qwen3.5's template opens the think block: what the model writes until </think> is
    reasoning in every API; enable_thinking false gives a plain answer; the next turn,
    sent back with the answer only, is served from the prompt cache."""
    assert srv.server.state.think_format is not None
    c = srv.client()
    msgs = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Hi"}]
    r = c.chat.completions.create(model=srv.model, messages=msgs, max_tokens=8)
    m = r.choices[0].message
    thought = m.model_extra.get("reasoning_content") or ""
    assert thought and "<think>" not in thought and "</think>" not in (m.content or "")
    plain = c.chat.completions.create(model=srv.model, messages=msgs, max_tokens=8,
                                      extra_body={"chat_template_kwargs":
                                                  {"enable_thinking": False}})  # fmt: skip
    assert "reasoning_content" not in (plain.choices[0].message.model_extra or {})
    assert plain.choices[0].message.content
    # the client sends back the answer without the reasoning: the cache still serves it
    msgs += [{"role": "assistant", "content": m.content or ""},
             {"role": "user", "content": "Go on."}]  # fmt: skip
    r2 = c.chat.completions.create(model=srv.model, messages=msgs, max_tokens=4)
    u = r2.usage
    assert u.prompt_tokens_details.cached_tokens >= 0.97 * u.prompt_tokens, u
    # the same split in Responses and Messages
    resp = c.responses.create(model=srv.model, instructions=SYSTEM, input="Hi",
                              max_output_tokens=8)  # fmt: skip
    assert resp.output[0].type == "reasoning" and resp.output[0].content[0].text == thought
    a = anthropic.Anthropic(base_url=srv.url, api_key="x", max_retries=0)
    msg = a.messages.create(model=srv.model, system=SYSTEM, max_tokens=8,
                            messages=[{"role": "user", "content": "Hi"}])  # fmt: skip
    assert msg.content[0].type == "thinking" and msg.content[0].thinking == thought

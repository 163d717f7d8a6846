"""A scripted reply (tests/helpers/tools.py's `scripted`) through the Responses and
Messages APIs' streams, accumulated by the official packages' own stream states: what a
client of each API ends up holding."""

from __future__ import annotations

import asyncio
import json

import openai
from anthropic.lib.streaming._messages import accumulate_event
from anthropic.types import RawMessageStreamEvent
from openai.lib.streaming.responses._responses import ResponseStreamState
from openai.types.responses import ResponseStreamEvent
from pydantic import TypeAdapter

from ssdmoe_tui.server.schema_messages import parse_messages
from ssdmoe_tui.server.schema_responses import parse_responses
from ssdmoe_tui.server.serving_messages import ServingMessages
from ssdmoe_tui.server.serving_responses import ServingResponses, _Run
from tests.helpers.tools import collect, scripted, states


def _data(raw: str) -> dict:
    return json.loads(raw.split("\n", 1)[1][6:])  # "event: ...\ndata: {...}"


def responses_final(tok, question: str, text: str, tools: list, piece: int = 6):  # noqa: ANN001
    """The Responses API's streamed reply `text` to `question` (`tools` in its flat form),
    as the `openai` package accumulates it: the completed response."""
    serving = ServingResponses(states(tok))
    req = parse_responses({"model": "m", "input": question, "tools": tools, "stream": True}, "m")
    chat = req.chat()
    prompt = serving.state.builder.chat(chat)
    job = scripted(tok, prompt, text, piece=piece)
    filt = serving.output_filter(prompt, (), chat.tools)
    state = ResponseStreamState(input_tools=tools, text_format=openai.omit)
    adapter = TypeAdapter(ResponseStreamEvent)
    run = _Run(req, chat, ())
    for raw in collect(serving._events(run, prompt, lambda: asyncio.sleep(0, job), filt)):
        state.handle_event(adapter.validate_python(_data(raw)))
    return state._completed_response


def messages_snapshot(tok, question: str, text: str, tools: list, piece: int = 6):  # noqa: ANN001
    """The Messages API's streamed reply `text` to `question` (Anthropic's tool form), as
    the `anthropic` package accumulates it: the message."""
    ms = ServingMessages(states(tok))
    mreq = parse_messages({"model": "m", "max_tokens": 64, "stream": True, "tools": tools,
                           "messages": [{"role": "user", "content": question}]}, "m")  # fmt: skip
    prompt = ms.state.builder.chat(mreq.chat)
    job = scripted(tok, prompt, text, piece=piece)
    filt = ms.output_filter(prompt, (), mreq.chat.tools)
    snap, bufs, adapter = None, {}, TypeAdapter(RawMessageStreamEvent)
    gen = ms._events(mreq, prompt, lambda: asyncio.sleep(0, job), filt, job.request_id)
    for raw in collect(gen):
        event = adapter.validate_python(_data(raw))
        snap = accumulate_event(event=event, current_snapshot=snap, json_bufs=bufs)
    return snap

"""Tool calls as each model family writes them (recorded output, Qwen3 json_tools and
Qwen3-Coder XML), the calls they stand for, and feeding a text to an output filter in
pieces of any size."""

from __future__ import annotations

import asyncio

from ssdmoe_tui.engine.run import protocol as P
from ssdmoe_tui.prompting.chat_format import encode
from ssdmoe_tui.prompting.output import OutputFilter
from ssdmoe_tui.server.engine_client import AsyncEngine, Job
from ssdmoe_tui.server.prompts import HistoryRecords, PromptBuilder
from ssdmoe_tui.server.serving_engine import ApiSettings, ServerState

TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Weather for a city",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string"}, "days": {"type": "integer"}}, "required": ["city"]}}},
    {"type": "function", "function": {
        "name": "get_time", "description": "Local time",
        "parameters": {"type": "object", "properties": {"tz": {"type": "string"}}}}},
]  # fmt: skip
CALLS = [("get_weather", {"city": "Paris", "days": 2}), ("get_time", {"tz": "Europe/Paris"})]

# What each family generates after the generation prompt (end-of-turn token excluded).
OUTPUTS = {
    "qwen3-30b-a3b": (
        "<think>\nThe user wants the weather and the time.\n</think>\n\n"
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}\n'
        "</tool_call>\n"
        '<tool_call>\n{"name": "get_time", "arguments": {"tz": "Europe/Paris"}}\n</tool_call>'
    ),
    "qwen3.5-35b-a3b": (
        "<think>\n\n</think>\n\nLet me look both up.\n\n"
        "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
        "<parameter=days>\n2\n</parameter>\n</function>\n</tool_call>\n"
        "<tool_call>\n<function=get_time>\n<parameter=tz>\nEurope/Paris\n</parameter>\n"
        "</function>\n</tool_call>"
    ),
    "nemotron-3-nano-30b-a3b": (
        "<think>Weather and time for Paris.</think>\n"
        "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
        "<parameter=days>\n2\n</parameter>\n</function>\n</tool_call>\n"
        "<tool_call>\n<function=get_time>\n<parameter=tz>\nEurope/Paris\n</parameter>\n"
        "</function>\n</tool_call>\n"
    ),
}
FORMATS = {
    "qwen3-30b-a3b": "json_tools",
    "qwen3.5-35b-a3b": "qwen3_coder",
    "nemotron-3-nano-30b-a3b": "qwen3_coder",
}


def run_filter(filt: OutputFilter, text: str, size: int) -> list:
    pieces = []
    for i in range(0, len(text), size):
        pieces += filt.feed(text[i : i + size])
    return pieces + filt.finish()


def states(tok) -> ServerState:
    """A server's state over `tok` with no engine behind it (jobs come from `scripted`)."""
    engine = AsyncEngine(lambda post: None)
    engine.tokenizer = tok
    return ServerState(engine, PromptBuilder(tok, HistoryRecords(None)), ApiSettings("m"))


def collect(gen) -> list[str]:
    """Every item of an async generator (a reply's SSE events), run to its end."""

    async def run() -> list[str]:
        return [e async for e in gen]

    return asyncio.run(run())


def scripted(tok, prompt, text: str, piece: int = 6, reused: int = 0, rid: str = "r-test") -> Job:  # noqa: ANN001
    """A job whose events are `text` in the engine's batches of `piece` characters (as a
    recorded reply arrives), then its GenerationDone (`reused` prompt tokens cached)."""
    ids = encode(tok, text) + [next(iter(tok.eos_token_ids))]
    job = Job(rid)
    for i in range(0, len(text), piece):
        job.events.put_nowait(P.Tokens(job.request_id, text[i : i + piece], ()))
    job.result = P.GenerationDone(job.request_id, text, tuple(prompt.tokens), tuple(ids), "stop",
                                  (4,) * len(ids), {"reused_prompt_tokens": reused})  # fmt: skip
    job.events.put_nowait(job.result)
    return job

"""Tool calls in `ssdmoe serve`, per model family, on recorded model outputs.

Random-weight models never call tools, so the outputs below are written in the exact
format each family's chat template renders (and instructs the model to produce) for an
assistant tool call: Qwen3's JSON inside <tool_call> (template: tests/fixtures/models/
qwen3-30b-a3b), and the XML <function=..><parameter=..> form of Qwen3.5 and
Nemotron-3 (their templates in tests/fixtures/models/). The format is the one mlx-lm
infers from each template when the tokenizer loads; the parsers are mlx-lm's.

Checked: the format chosen per family; calls parsed from the text streamed in pieces of
any size, each call out as soon as its block closes; malformed blocks kept as text;
stop strings; the SSE chunks a client gets (validated with the `openai` package's own
types); tool results rendered into the next turn on top of the exact history.
"""

from __future__ import annotations

import asyncio
import json
import os

import pytest
from mlx_lm.utils import load_tokenizer
from openai.types.chat import ChatCompletionChunk

from ssdmoe_tui.engine.run import protocol as P
from ssdmoe_tui.prompting.chat_format import encode, first_turn_tokens, hf_tokenizer
from ssdmoe_tui.prompting.output import Call, Content, OutputFilter, named_format, tool_format_for
from ssdmoe_tui.server.engine_client import AsyncEngine, Job
from ssdmoe_tui.server.errors import ApiError
from ssdmoe_tui.server.prompts import READS_CACHED_MAX, HistoryRecords, PromptBuilder
from ssdmoe_tui.server.schema import ChatMessage, ToolCall, parse_chat
from ssdmoe_tui.server.serving_chat import ServingChat
from ssdmoe_tui.server.serving_engine import ApiSettings, ServerState
from tests.helpers.tools import CALLS, FORMATS, OUTPUTS, TOOLS, run_filter


def calls_of(pieces) -> list:
    return [(p.call.name, json.loads(p.call.arguments)) for p in pieces if isinstance(p, Call)]


def text_of(pieces) -> str:
    return "".join(p.text for p in pieces if isinstance(p, Content))


@pytest.mark.parametrize("family", list(OUTPUTS))
def test_format_inferred_from_each_template(tokenizers, family):
    fmt = tool_format_for(tokenizers[family])
    assert fmt is not None and fmt.name == FORMATS[family]
    assert (fmt.start, fmt.end) == ("<tool_call>", "</tool_call>")


@pytest.mark.parametrize("family", list(OUTPUTS))
@pytest.mark.parametrize("size", [1, 2, 5, 13, 10_000])
def test_recorded_output_parses_in_any_pieces(family, size):
    text = OUTPUTS[family]
    pieces = run_filter(OutputFilter((), named_format(FORMATS[family]), TOOLS), text, size)
    assert calls_of(pieces) == CALLS
    content = text_of(pieces)
    assert "<tool_call>" not in content and "</tool_call>" not in content
    assert content == text[: text.index("<tool_call>")] + "\n" * text.count("</tool_call>\n")
    ids = [p.call.id for p in pieces if isinstance(p, Call)]
    assert len(set(ids)) == 2 and all(i.startswith("call_") for i in ids)


@pytest.mark.parametrize("family", list(OUTPUTS))
def test_each_call_is_out_as_soon_as_its_block_closes(family):
    text = OUTPUTS[family]
    filt = OutputFilter((), named_format(FORMATS[family]), TOOLS)
    first_end = text.index("</tool_call>") + len("</tool_call>")
    got = filt.feed(text[:first_end])
    assert calls_of(got) == CALLS[:1]  # before the reply (or even the next block) is done
    rest = filt.feed(text[first_end:]) + filt.finish()
    assert calls_of(rest) == CALLS[1:]


def test_malformed_or_unterminated_blocks_stay_text():
    fmt = named_format("json_tools")
    bad = 'Sure.<tool_call>\n{"name": "get_weather", "arguments": {oops}\n</tool_call> done'
    pieces = run_filter(OutputFilter((), fmt, TOOLS), bad, 4)
    assert calls_of(pieces) == [] and text_of(pieces) == bad
    cut = 'x <tool_call>\n{"name": "get_time", "arguments": {"tz": "UTC"}}\n'
    pieces = run_filter(OutputFilter((), fmt, TOOLS), cut, 3)  # reply ended inside the block
    assert calls_of(pieces) == [("get_time", {"tz": "UTC"})] and text_of(pieces) == "x "
    # without tools in the request, tool-call text is plain text
    text = OUTPUTS["qwen3-30b-a3b"]
    assert text_of(run_filter(OutputFilter((), fmt, None), text, 7)) == text


def test_stop_strings_cut_and_hold_back():
    filt = OutputFilter(["END", "\n\n\n"])
    assert text_of(filt.feed("abc E")) == "abc "  # "E" might start "END"
    assert text_of(filt.feed("Nx")) == "ENx"
    assert text_of(filt.feed("yyEN")) == "yy" and not filt.stopped
    assert text_of(filt.feed("D and more")) == "" and filt.stopped
    assert text_of(filt.finish()) == ""
    assert "".join(filt.content) == "abc ENxyy"


def _api(tokenizer) -> ServingChat:
    engine = AsyncEngine(lambda post: None)
    engine.tokenizer = tokenizer
    builder = PromptBuilder(tokenizer, HistoryRecords(None))
    return ServingChat(ServerState(engine, builder, ApiSettings("m")))


@pytest.mark.parametrize("family", list(OUTPUTS))
def test_sse_tool_call_chunks_as_the_openai_client_reads_them(tokenizers, family):
    tok = tokenizers[family]
    api = _api(tok)
    req = parse_chat(
        {"model": "m", "messages": [{"role": "user", "content": "Paris?"}], "tools": TOOLS,
         "stream": True, "stream_options": {"include_usage": True}}, "m")  # fmt: skip
    prompt = api.state.builder.chat(req)
    text = OUTPUTS[family]
    ids = encode(tok, text) + [next(iter(tok.eos_token_ids))]
    job = Job("chatcmpl-test")
    for i in range(0, len(text), 9):  # the engine's batches, as recorded
        job.events.put_nowait(P.Tokens(job.request_id, text[i : i + 9], ()))
    stats = {"reused_prompt_tokens": 0, "decode_tok_s": 1.0}
    job.result = P.GenerationDone(
        job.request_id, text, tuple(prompt.tokens), tuple(ids), "stop", (4,) * len(ids), stats
    )
    job.events.put_nowait(job.result)

    async def collect() -> list[str]:
        return [
            c
            async for c in api.chat_stream(
                req, prompt, lambda: asyncio.sleep(0, job), job.request_id
            )
        ]

    raw = asyncio.run(collect())
    assert raw[-1] == "data: [DONE]\n\n"
    chunks = [ChatCompletionChunk.model_validate(json.loads(r[6:])) for r in raw[:-2]]
    usage = json.loads(raw[-2][6:])["usage"]
    assert usage["completion_tokens"] == len(ids)
    assert chunks[0].choices[0].delta.role == "assistant"
    calls: dict[int, dict] = {}
    for c in chunks:
        for d in c.choices[0].delta.tool_calls or []:
            calls.setdefault(d.index, {"id": d.id, "name": d.function.name, "args": ""})
            calls[d.index]["args"] += d.function.arguments or ""
    assert [(calls[i]["name"], json.loads(calls[i]["args"])) for i in sorted(calls)] == CALLS
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    assert chunks[-1].model_extra["ssdmoe"]["k"] == 4


@pytest.mark.parametrize("family", list(OUTPUTS))
def test_tool_results_render_into_the_next_turn_on_the_exact_history(tokenizers, family):
    tok = tokenizers[family]
    builder = PromptBuilder(tok, HistoryRecords(None))
    system = {"role": "system", "content": "You are a helpful agent."}
    user = {"role": "user", "content": "Weather and time in Paris?"}
    req1 = parse_chat({"model": "m", "messages": [system, user], "tools": TOOLS}, "m")
    p1 = builder.chat(req1)
    assert p1.tokens == first_turn_tokens(tok, [system, user], tools=TOOLS)
    assert not p1.from_history
    generated = encode(tok, OUTPUTS[family]) + [next(iter(tok.eos_token_ids))]
    filt = OutputFilter((), tool_format_for(tok), TOOLS)
    filt.feed(OUTPUTS[family])
    filt.finish()
    reply = ChatMessage("assistant", "".join(filt.content), tuple(filt.calls))
    builder.record(req1, p1, generated, reply)
    # the client sends the reply back as it got it, plus the tool results
    echoed = {"role": "assistant", "content": reply.content or None, "tool_calls": [
        {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
        for c in reply.tool_calls]}  # fmt: skip
    results = [
        {"role": "tool", "tool_call_id": reply.tool_calls[0].id, "content": "sunny, 21 C"},
        {"role": "tool", "tool_call_id": reply.tool_calls[1].id, "content": "14:05"},
    ]
    req2 = parse_chat({"model": "m", "messages": [system, user, echoed, *results],
                       "tools": TOOLS}, "m")  # fmt: skip
    p2 = builder.chat(req2)
    assert p2.from_history and p2.chain == p1.chain
    history = p1.tokens + generated
    assert p2.tokens[: len(history)] == history  # what the model saw and produced, unchanged
    delta = hf_tokenizer(tok).decode(p2.tokens[len(history) :])
    assert "<tool_response>\nsunny, 21 C\n</tool_response>" in delta
    assert "<tool_response>\n14:05\n</tool_response>" in delta
    assert delta.rstrip().endswith(("<|im_start|>assistant", "<think>"))
    assert len(p2.tokens) - len(history) < 40  # only the new messages are new
    # the same chat from a client that reformatted the arguments still matches
    spaced = json.loads(json.dumps(echoed))
    for c in spaced["tool_calls"]:
        c["function"]["arguments"] = json.dumps(json.loads(c["function"]["arguments"]), indent=2)
    req3 = parse_chat({"model": "m", "messages": [system, user, spaced, *results],
                       "tools": TOOLS}, "m")  # fmt: skip
    assert builder.chat(req3).tokens == p2.tokens
    # ... and so does one that sends the answer back without its think block
    bare = {**echoed, "content": (reply.content or "").split("</think>")[-1].strip() or None}
    req5 = parse_chat({"model": "m", "messages": [system, user, bare, *results],
                       "tools": TOOLS}, "m")  # fmt: skip
    assert builder.chat(req5).tokens == p2.tokens
    # other tools: another history (the system prompt renders differently)
    req4 = parse_chat({"model": "m", "messages": [system, user, echoed, *results],
                       "tools": TOOLS[:1]}, "m")  # fmt: skip
    assert not builder.chat(req4).from_history


# --------------------------------------------------------------------------- real server


def test_server_renders_tools_and_tool_results_reuse_the_cache(tool_model, tmp_path, monkeypatch):
    from ssdmoe_tui.options import EngineOptions
    from ssdmoe_tui.server.main import ServeOptions
    from tests.helpers.server import Running
    from tests.helpers.texts import SYSTEM

    monkeypatch.setenv("SSDMOE_LOCK_DIR", str(tmp_path / "locks"))
    tok = load_tokenizer(tool_model)
    srv = Running(ServeOptions(EngineOptions(model=str(tool_model)), cache_root=tmp_path / "sc"))
    try:
        assert srv.server.state.tool_format.name == "json_tools"
        c = srv.client()
        messages = [{"role": "system", "content": SYSTEM},
                    {"role": "user", "content": "Weather in Paris?"}]  # fmt: skip
        r1 = c.chat.completions.create(model=srv.model, messages=messages, tools=TOOLS,
                                       max_tokens=6)  # fmt: skip
        assert r1.usage.prompt_tokens == len(first_turn_tokens(tok, messages, tools=TOOLS))
        bare = c.chat.completions.create(model=srv.model, messages=messages, max_tokens=1)
        assert bare.usage.prompt_tokens < r1.usage.prompt_tokens  # the tools are in the prompt
        messages += [
            {"role": "assistant", "content": r1.choices[0].message.content},
            {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
        ]
        r2 = c.chat.completions.create(model=srv.model, messages=messages, tools=TOOLS,
                                       max_tokens=4)  # fmt: skip
        u = r2.usage
        assert u.prompt_tokens_details.cached_tokens >= 0.97 * u.prompt_tokens, u
    finally:
        srv.stop()


@pytest.mark.parametrize(
    "text, why",
    [
        ("[" * 100_000, "nested too deep"),  # was a RecursionError at start-up
        (
            '{"format": "ssdmoe-server-history", "version": 1, "records": '
            '[{"key": "a", "chain": "0123456789abcdef", "tokens": [1e400]}]}',
            "not a server",
        ),
        (
            '{"format": "ssdmoe-server-history", "version": 1, "records": '
            '[{"key": "a", "chain": "../../x", "tokens": [1]}]}',
            "not a server",
        ),
    ],
)
def test_damaged_history_file_is_one_notice(tmp_path, text, why):
    """A damaged history.json costs its cache hits, never the start-up (OverflowError,
    RecursionError) nor a chain id that is a path."""
    path = tmp_path / "history.json"
    path.write_text(text)
    notes: list[str] = []
    records = HistoryRecords(path, notes.append)
    assert records.get("a") is None
    assert len(notes) == 1 and str(path) in notes[0] and why in notes[0], notes
    records.put("k", [1, 2, 3], "0123456789abcdef")
    records.flush()
    assert HistoryRecords(path).get("k").tokens == (1, 2, 3)


def test_server_cache_start_removes_orphan_temps(tmp_path):
    """A server killed while saving a KV checkpoint (or history.json) leaves a temp file
    in its cache folder; the next start removes it (a live writer's file stays)."""
    import subprocess
    import sys

    from ssdmoe_tui.server.prompt_cache import ServerKV

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
    chain = tmp_path / "chains" / "0123456789abcdef"
    chain.mkdir(parents=True)
    orphans = [chain / f".kv-12.safetensors.x1.p{dead}.tmp.safetensors",
               tmp_path / f".history.json.x2.p{dead}.tmp"]  # fmt: skip
    live = chain / f".kv-13.safetensors.x3.p{os.getpid()}.tmp.safetensors"
    for p in [*orphans, live]:
        p.write_bytes(b"x")
    ServerKV(tmp_path)
    assert not any(p.exists() for p in orphans) and live.exists()


def test_port_in_use_is_one_line():
    """`ssdmoe serve` on a taken port said 'ssdmoe: error: OSError: cannot listen ...'."""
    from ssdmoe_tui.errors import user_message
    from ssdmoe_tui.server.main import bind

    taken = bind("127.0.0.1", 0)
    try:
        with pytest.raises(Exception) as e:
            bind("127.0.0.1", taken.getsockname()[1])
        assert user_message(e.value).startswith("cannot listen on 127.0.0.1:"), e.value
    finally:
        taken.close()


def test_loopback_hosts():
    """`serve --host` off loopback without --api-key warns; these need no warning."""
    from ssdmoe_tui.server.main import is_loopback

    assert all(map(is_loopback, ["127.0.0.1", "127.1.2.3", "::1", "[::1]", "localhost"]))
    assert not any(map(is_loopback, ["0.0.0.0", "::", "192.168.1.2", "example.com"]))


@pytest.mark.parametrize("args", ["[" * 5000, "1" * 5000, "{bad"])
def test_client_tool_call_arguments_that_do_not_parse_stay_text(args):
    """A client's `arguments` nested too deep or with a 5,000-digit number raised
    RecursionError / ValueError out of the history key (a 500): kept as text instead."""
    call = ToolCall("call_1", "f", args)
    assert call.canonical() == ("f", args)
    assert call.for_template()["function"]["arguments"] == args


def test_a_template_that_refuses_the_messages_is_a_400(tokenizers):
    """Qwen3.5's template raises on a system message after the first (agents send them):
    that was a 500 from inside Jinja."""
    builder = PromptBuilder(tokenizers["qwen3.5-35b-a3b"], HistoryRecords(None))
    msgs = [{"role": "user", "content": "Hi"}, {"role": "system", "content": "Be brief."}]
    with pytest.raises(ApiError) as e:
        builder.chat(parse_chat({"model": "m", "messages": msgs}, "m"))
    assert e.value.status == 400 and e.value.param == "messages"
    assert "System message must be at the beginning" in e.value.message
    call = {"id": "c", "type": "function", "function": {"name": "f", "arguments": "[1, 2]"}}
    msgs = [{"role": "user", "content": "Hi"}, {"role": "assistant", "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "c", "content": "r"}]  # fmt: skip
    with pytest.raises(ApiError) as e:  # arguments not an object: TypeError under |items
        builder.chat(parse_chat({"model": "m", "messages": msgs}, "m"))
    assert e.value.status == 400 and e.value.param == "messages"


def test_template_switch_answers_stay_bounded(tokenizers):
    """Each template switch a request names is probed (does the template read it?) and
    the answer kept; a client naming ever new keys or values grew the server's memory
    without bound. Ever new ones are still answered (the warning), the kept ones bounded."""
    builder = PromptBuilder(tokenizers["qwen3-30b-a3b"], HistoryRecords(None))
    for i in range(2 * READS_CACHED_MAX + 20):  # small values and long ones, alternating
        req = parse_chat({"model": "m", "messages": [{"role": "user", "content": "hi"}],
                          "chat_template_kwargs": {f"switch_{i}": "v" * (600 * (i % 2) + 1)}},
                         "m")  # fmt: skip
        assert [w for w in builder.unused_options(req) if f"'switch_{i}'" in w]
    assert len(builder._reads) <= READS_CACHED_MAX
    req = parse_chat({"model": "m", "messages": [{"role": "user", "content": "hi"}],
                      "chat_template_kwargs": {"enable_thinking": False}}, "m")  # fmt: skip
    assert builder.unused_options(req) == []  # the template's own switch: read, cached
    assert ("enable_thinking", "false") in builder._reads

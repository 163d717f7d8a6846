"""The reply formats of gpt-oss (harmony), DeepSeek-V3/R1 and GLM-4.5/4.6, parsed whole
and streamed in pieces of any size, and the one place that picks a format from the
tokenizer's chat template.

The harmony examples are the format's published ones, copied verbatim from
openai/harmony at ec7606df9e87e3d0a1fec9f50928c1e407f0c438 (v0.0.8, Apache-2.0): its
docs/format.md and test-data/. DeepSeek's and GLM's outputs are written exactly as their
chat templates render an assistant's tool calls (DeepSeek-V3's and R1's, V3.1's;
GLM-4.5's `<arg_key>` form), since random-weight models never call tools."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from mlx_lm.utils import load_tokenizer

from ssdmoe_tui.chat.thinking import split_thinking, thinking_tokens
from ssdmoe_tui.prompting.chat_format import encode, first_turn_tokens, render, turn_delta
from ssdmoe_tui.prompting.harmony import parse_header, parse_reply
from ssdmoe_tui.prompting.output import Call, Content, OutputFilter, Reasoning, ThinkFormat
from ssdmoe_tui.prompting.reply_format import DEEPSEEK, reply_format_for
from ssdmoe_tui.prompting.tool_support import NOT_READ, NOT_SHOWN, why_no_tools
from ssdmoe_tui.tools.calls import split_reply
from tests.helpers.fixture_paths import MODELS, genuine_template
from tests.helpers.harmony_tokenizer import write_harmony_tokenizer
from tests.helpers.tools import CALLS, TOOLS, run_filter

# (name, source in openai/harmony, text, reasoning, content, calls)
HARMONY = [
    (
        "reasoning then answer",
        "docs/format.md, Response format: Example output",
        '<|channel|>analysis<|message|>User asks: "What is 2 + 2?" Simple arithmetic. Provide '
        "answer.<|end|>\n<|start|>assistant<|channel|>final<|message|>2 + 2 = 4.<|return|>",
        'User asks: "What is 2 + 2?" Simple arithmetic. Provide answer.',
        "2 + 2 = 4.",
        [],
    ),
    (
        "function call",
        "docs/format.md, Receiving tool calls",
        "<|channel|>analysis<|message|>Need to use function get_weather.<|end|><|start|>"
        "assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>"
        '{"location":"San Francisco"}<|call|>',
        "Need to use function get_weather.",
        "",
        [("get_weather", {"location": "San Francisco"})],
    ),
    (
        "preamble then call",
        "docs/format.md, Preambles",
        "<|channel|>analysis<|message|>{long chain of thought}<|end|><|start|>assistant"
        "<|channel|>commentary<|message|>**Action plan**:\n1. Generate an HTML file\n2. Generate"
        " a JavaScript for the Node.js server\n3. Start the server\n---\nWill start executing "
        "the plan step by step<|end|><|start|>assistant<|channel|>commentary "
        "to=functions.generate_file<|constrain|>json<|message|>"
        '{"template": "basic_html", "path": "index.html"}<|call|>',
        "{long chain of thought}",
        "**Action plan**:\n1. Generate an HTML file\n2. Generate a JavaScript for the Node.js "
        "server\n3. Start the server\n---\nWill start executing the plan step by step",
        [("generate_file", {"template": "basic_html", "path": "index.html"})],
    ),
    (
        "built-in tool call, then the tool's own message",
        "test-data/test_streamable_parser.txt",
        '<|channel|>analysis<|message|>User asks "Who is the current US president?" It\'s 2025, '
        "presumably current president is Joe Biden? Actually as of 2025-07-28, there was a 2024"
        " election. In 2024, President is probably President Biden still? But w\ne need up to "
        "date info. Let's browse to confirm.<|end|><|start|>assistant<|channel|>commentary "
        'to=browser.search code<|message|>{"query": "current US president July 2025", "topn": '
        '10, "source": "news"}<|call|><|start|>browser.search to=assistant<|channel|>commentary'
        '<|message|>{"result": "https://openai.com/"}<|end|>',
        'User asks "Who is the current US president?" It\'s 2025, presumably current president '
        "is Joe Biden? Actually as of 2025-07-28, there was a 2024 election. In 2024, President"
        " is probably President Biden still? But w\ne need up to date info. Let's browse to "
        "confirm.",
        "",
        [
            (
                "browser.search",
                {"query": "current US president July 2025", "topn": 10, "source": "news"},
            )
        ],
    ),  # fmt: skip
    (
        "the recipient in the role",
        "test-data/test_does_not_drop_if_ongoing_analysis.txt (its assistant messages)",
        "<|channel|>analysis<|message|>User asks: “What is the weather in SF?” We need to use "
        "lookup_weather tool.<|end|><|start|>assistant to=functions.lookup_weather<|channel|>"
        'commentary <|constrain|>json<|message|>{"location": "San Francisco"}<|call|>',
        "User asks: “What is the weather in SF?” We need to use lookup_weather tool.",
        "",
        [("lookup_weather", {"location": "San Francisco"})],
    ),
]
MARKERS = ("<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|constrain|>", "<|call|>")


def split(pieces) -> tuple[str, str, list]:
    reasoning = "".join(p.text for p in pieces if isinstance(p, Reasoning))
    content = "".join(p.text for p in pieces if isinstance(p, Content))
    calls = [(p.call.name, json.loads(p.call.arguments)) for p in pieces if isinstance(p, Call)]
    return reasoning, content, calls


def tokenwise(text: str) -> list[str]:
    """The text cut as a model streams it: each marker a piece of its own, words apart."""
    out, at = [], 0
    while at < len(text):
        hits = [(i, m) for m in MARKERS if (i := text.find(m, at)) >= 0]
        nxt = min(hits)[0] if hits else len(text)
        if nxt == at:
            m = min(hits)[1]
            out.append(m)
            at += len(m)
            continue
        out += [w for w in re.split(r"(?<= )", text[at:nxt]) if w]  # words, spaces kept
        at = nxt
    return out


@pytest.mark.parametrize("case", HARMONY, ids=[c[0] for c in HARMONY])
@pytest.mark.parametrize("size", [1, 2, 3, 7, 10_000, "markers"])
def test_harmony_examples_in_any_pieces(case, size):
    _, _, text, reasoning, content, calls = case
    filt = OutputFilter((), None, TOOLS, harmony=True)
    if size == "markers":
        pieces = [p for part in tokenwise(text) for p in filt.feed(part)] + filt.finish()
    else:
        pieces = run_filter(filt, text, size)
    if size == "markers":
        assert len(tokenwise(text)) > 10
    assert split(pieces) == (reasoning, content, calls)
    assert filt.ended  # <|call|> or <|return|> came as text
    assert "<|" not in content + reasoning
    assert parse_reply(text) == parse_reply(text, final=True)
    whole = parse_reply(text)
    assert (whole.reasoning, whole.content) == (reasoning, content)
    assert [(n, json.loads(a)) for n, a in whole.calls] == calls


def test_harmony_call_streams_out_when_its_message_ends():
    filt = OutputFilter((), None, TOOLS, harmony=True)
    head = "<|channel|>analysis<|message|>Weather.<|end|><|start|>assistant<|channel|>commentary"
    assert split(filt.feed(head)) == ("Weather.", "", [])
    assert filt.feed(' to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris"') == []
    assert split(filt.feed("}")) == ("", "", [])  # the body may go on: held
    assert split(filt.feed("<|call|>")) == ("", "", [("get_weather", {"city": "Paris"})])
    assert filt.finish() == [] and filt.calls[0].name == "get_weather"


def test_harmony_reply_cut_short_and_calls_without_tools():
    # the tokenizer stopped on <|call|> (not in the text): the open call is closed at the end
    text = (
        '<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city":"Rome"}'
    )
    filt = OutputFilter((), None, TOOLS, harmony=True)
    assert split(run_filter(filt, text, 4)) == ("", "", [("get_weather", {"city": "Rome"})])
    assert not filt.ended
    # no tools offered (or a body that is no JSON object): the body is text, nothing is lost
    no_tools = OutputFilter((), None, None, harmony=True)
    assert split(run_filter(no_tools, text, 4)) == ("", '{"city":"Rome"}', [])
    bad = text.replace('{"city":"Rome"}', "[1, 2")
    assert split(run_filter(OutputFilter((), None, TOOLS, harmony=True), bad, 3))[1] == "[1, 2"


def test_a_reply_cut_in_a_header_shows_no_marker():
    text = "<|channel|>final<|message|>Sunny.<|end|><|start|>assistant<|channel|>comm"
    for size in (1, 4, 100):
        filt = OutputFilter((), None, TOOLS, harmony=True)
        assert split(run_filter(filt, text, size)) == ("", "Sunny.", [])


def test_text_that_is_not_harmony_is_passed_on():
    plain = "Hello there, no header at all. " * 30  # past the header bound without <|message|>
    filt = OutputFilter((), None, TOOLS, harmony=True)
    assert split(run_filter(filt, plain, 5)) == ("", plain, [])
    short = "Just words."
    assert split(run_filter(OutputFilter((), None, TOOLS, harmony=True), short, 2))[1] == short


def test_harmony_stop_strings_and_two_analysis_messages():
    text = (
        "<|channel|>analysis<|message|>First.<|end|><|start|>assistant<|channel|>analysis"
        "<|message|>Second.<|end|><|start|>assistant<|channel|>final<|message|>Done. END here"
    )
    filt = OutputFilter(["END"], None, TOOLS, harmony=True)
    reasoning, content, _ = split(run_filter(filt, text, 3))
    assert reasoning == "First.\n\nSecond." and content == "Done. " and filt.stopped


def test_harmony_headers():
    h = parse_header("<|start|>assistant to=functions.f<|channel|>commentary <|constrain|>json")
    assert (h.role, h.channel, h.recipient, h.constrain, h.is_call) == (
        "assistant", "commentary", "functions.f", "json", True)  # fmt: skip
    h = parse_header("<|channel|>commentary to=browser.search code")
    assert (h.role, h.channel, h.recipient) == ("assistant", "commentary", "browser.search")
    assert not parse_header("<|start|>functions.f to=assistant<|channel|>commentary").is_call


# -------------------------------------------------------------- DeepSeek and GLM

DEEPSEEK_V3 = (  # DeepSeek-V3 / R1's template: type, name, a ```json fence; R1 thinks first
    "<think>\nThe user wants the weather and the time.\n</think>\n\nLet me check."
    "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n"
    '{"city": "Paris", "days": 2}\n```<｜tool▁call▁end｜>\n<｜tool▁call▁begin｜>function'
    '<｜tool▁sep｜>get_time\n```json\n{"tz": "Europe/Paris"}\n```<｜tool▁call▁end｜>'
    "<｜tool▁calls▁end｜>"
)
DEEPSEEK_V31 = (  # DeepSeek-V3.1's template: name, then the arguments
    "<think>\nThe user wants the weather and the time.\n</think>\n\nLet me check."
    "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>"
    '{"city": "Paris", "days": 2}<｜tool▁call▁end｜><｜tool▁call▁begin｜>get_time'
    '<｜tool▁sep｜>{"tz": "Europe/Paris"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>'
)
GLM = (  # GLM-4.5/4.6's template: name, then <arg_key>/<arg_value> pairs
    "<think>The user wants the weather and the time.</think>\nLet me check."
    "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n"
    "<arg_key>days</arg_key>\n<arg_value>2</arg_value>\n</tool_call>"
    "<tool_call>get_time\n<arg_key>tz</arg_key>\n<arg_value>Europe/Paris</arg_value>\n"
    "</tool_call>"
)
THINK = ThinkFormat("<think>", "</think>")


def glm_format():
    from ssdmoe_tui.prompting.output import named_format

    return named_format("glm47")  # mlx-lm's parser, inferred from GLM's `<arg_key>`


@pytest.mark.parametrize("text", [DEEPSEEK_V3, DEEPSEEK_V31, GLM], ids=["v3", "v3.1", "glm"])
@pytest.mark.parametrize("size", [1, 2, 5, 13, 10_000])
def test_deepseek_and_glm_calls_and_reasoning_in_any_pieces(text, size):
    fmt = glm_format() if text is GLM else DEEPSEEK
    filt = OutputFilter((), fmt, TOOLS, THINK)
    reasoning, content, calls = split(run_filter(filt, text, size))
    assert reasoning.strip() == "The user wants the weather and the time."
    assert content.strip() == "Let me check."
    assert calls == CALLS


def test_a_deepseek_block_that_does_not_parse_stays_text():
    bad = "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{nope<｜tool▁call▁end｜><｜tool▁calls▁end｜>"
    assert split(run_filter(OutputFilter((), DEEPSEEK, TOOLS), bad, 4)) == ("", bad, [])


# -------------------------------------------------------------- the choice, and the app


@pytest.fixture(scope="module")
def harmony_tok(tmp_path_factory):
    folder = tmp_path_factory.mktemp("harmony-tok")
    ids = write_harmony_tokenizer(folder)
    return load_tokenizer(folder, eos_token_ids=[ids["<|return|>"], ids["<|call|>"]])


def qwen_with_template(folder: Path, template: str):
    import shutil

    folder.mkdir()
    for name in ("vocab.json", "merges.txt"):
        shutil.copy(MODELS / "qwen3-30b-a3b" / name, folder / name)
    config = json.loads((MODELS / "qwen3-30b-a3b" / "tokenizer_config.json").read_text())
    config["chat_template"] = template
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return load_tokenizer(folder)


def test_the_format_is_picked_from_the_template(harmony_tok, tmp_path):
    assert reply_format_for(harmony_tok).harmony  # the genuine gpt-oss template
    qwen = qwen_with_template(
        tmp_path / "q", (MODELS / "qwen3-30b-a3b" / "chat_template.jinja").read_text()
    )
    fmt = reply_format_for(qwen)
    assert (fmt.name, fmt.harmony, fmt.think.start) == ("json_tools", False, "<think>")
    assert reply_format_for(None).name == "plain"


# the genuine templates (tests/fixtures/models, sources in its SOURCES.md) -> the format
GENUINE = {
    "deepseek-r1": "deepseek_v3",
    "deepseek-v3.1": "deepseek_v3",
    "glm-4.6": "glm47",
    "kimi-k2": "kimi_k2",
    "minimax-m2": "minimax_m2",
}


@pytest.mark.parametrize("family", GENUINE)
def test_calls_as_each_genuine_template_renders_them_parse_back(family, tmp_path):
    """The template's own rendering of an assistant's calls (what the model learned to
    write), cut from the prompt and streamed in pieces, parses back to the same calls:
    with the arguments as the server passes them (objects; DeepSeek's templates join
    text, so they are given text). The app's tool loop finds them in a whole reply."""
    tok = qwen_with_template(tmp_path / "t", genuine_template(family))
    fmt = reply_format_for(tok)
    assert fmt.name == GENUINE[family] and not fmt.harmony
    calls = [{"id": f"c{i}", "type": "function", "function": {"name": n, "arguments": a}}
             for i, (n, a) in enumerate(CALLS)]  # fmt: skip
    msgs = [{"role": "user", "content": "Weather and time in Paris?"},
            {"role": "assistant", "content": "", "tool_calls": calls},
            {"role": "tool", "content": "sunny", "tool_call_id": "c0"},
            {"role": "tool", "content": "10:00", "tool_call_id": "c1"}]  # fmt: skip
    text = render(tok, msgs, add_generation_prompt=True, tools=TOOLS)
    start = text.index(fmt.tool.start, text.index("Weather and time in Paris?"))
    reply = text[start : text.rindex(fmt.tool.end) + len(fmt.tool.end)]
    assert split(run_filter(fmt.output_filter((), TOOLS), reply, 3))[2] == CALLS
    # the app's tool loop takes the same calls from the whole reply, and shows the rest
    shown = split_reply("<think>\nLet me look.\n</think>\n\nOne moment." + reply, tok, TOOLS)
    assert [(c.name, c.args()) for c in shown.calls] == CALLS
    assert fmt.tool.start not in shown.content and shown.content.endswith("One moment.")


@pytest.mark.parametrize("family", [*GENUINE, "qwen3.5-35b-a3b"])
def test_tool_results_follow_a_reply_kept_as_generated(family, tmp_path):
    """The app keeps a reply as the model wrote it (its call blocks in its text): the
    next prompt adds the tool results the way the template renders them after those
    calls, on top of the exact tokens. MiniMax-M2's template refuses a tool result
    without the call before it: the calls are parsed out of the text for it."""
    tok = qwen_with_template(tmp_path / "t", genuine_template(family))
    fmt = reply_format_for(tok)
    user = {"role": "user", "content": "Weather and time in Paris?"}
    calls = [{"id": f"c{i}", "type": "function", "function": {"name": n, "arguments": a}}
             for i, (n, a) in enumerate(CALLS)]  # fmt: skip
    asked = {"role": "assistant", "content": "", "tool_calls": calls}
    text = render(tok, [user, asked], add_generation_prompt=False, tools=TOOLS)
    start = text.index(fmt.tool.start, text.index(user["content"]))
    written = text[start : text.rindex(fmt.tool.end) + len(fmt.tool.end)]
    history = first_turn_tokens(tok, [user], tools=TOOLS) + encode(tok, written)
    results = [{"role": "tool", "content": "sunny", "tool_call_id": "c0", "name": "get_weather"},
               {"role": "tool", "content": "10:00", "tool_call_id": "c1", "name": "get_time"}]  # fmt: skip
    kept = {"role": "assistant", "content": written}
    delta = tok.decode(turn_delta(tok, history, [user, kept], results, tools=TOOLS))
    assert "sunny" in delta and "10:00" in delta and fmt.tool.start not in delta
    whole = render(tok, [user, asked, *results], add_generation_prompt=True, tools=TOOLS)
    assert whole.endswith(delta)


def test_deepseek_v3s_first_template_is_deepseeks_too(tmp_path):
    # (it renders calls only for a content of none, which transformers cannot pass)
    tok = qwen_with_template(tmp_path / "t", genuine_template("deepseek-v3"))
    assert reply_format_for(tok).tool is DEEPSEEK


@pytest.mark.parametrize("size", [1, 3, 10_000])
def test_the_app_shows_harmony_reasoning_apart_and_finds_its_calls(harmony_tok, size):
    _, _, text, reasoning, content, calls = HARMONY[2]  # a preamble, then a call
    # streaming: the answer only grows, the reasoning shows while it is open
    shown = ""
    for end in range(size, len(text) + size, size):
        s = split_thinking(text[:end], False)
        assert s.answer.startswith(shown)
        shown = s.answer
        if "<|end|>" not in text[:end] and "<|message|>" in text[:end]:
            assert s.open and s.has_thinking
    final = split_thinking(text)
    assert (final.thinking, final.answer, final.open) == (reasoning, content, False)
    reply = split_reply(text, harmony_tok, TOOLS)
    assert [(c.name, c.args()) for c in reply.calls] == calls
    ids = harmony_tok.encode(text, add_special_tokens=False)
    analysis = harmony_tok.encode(text[: text.index("<|end|>") + 7], add_special_tokens=False)
    assert thinking_tokens(ids, harmony_tok, text) == len(analysis)


# A template that shows the tools to the model but asks for calls in no format ssdmoe
# (or mlx-lm) reads: the tools reach the prompt, a call would stay text.
TOOLS_NO_FORMAT = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if tools %}<|im_start|>system\nYou may call: {{ tools | tojson }}<|im_end|>\n{% endif %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def test_a_model_says_whether_it_can_use_tools(tmp_path, harmony_tok):
    """Issue 44 item 4: the one owner of 'this model cannot use tools' (prompting/
    tool_support.py, which the app's notice and the server's warning word from): every
    genuine template that calls tools can; ChatML (shows none) and a template that shows
    them with no call format cannot, each with its reason. DeepSeek-V3/R1/V3.1's genuine
    templates render no tools at all (their model cards have the client write a tools
    section into the system prompt): the app says so, though their calls parse."""
    from tests.helpers.chat_templates import CHATML

    for family in (*GENUINE, "qwen3-30b-a3b", "qwen3.5-35b-a3b"):
        tok = qwen_with_template(tmp_path / family, genuine_template(family))
        want = NOT_SHOWN if family.startswith("deepseek") else None
        assert why_no_tools(tok) == want, family
    assert why_no_tools(harmony_tok) is None  # gpt-oss's genuine template
    assert why_no_tools(qwen_with_template(tmp_path / "c", CHATML)) == NOT_SHOWN
    assert why_no_tools(qwen_with_template(tmp_path / "n", TOOLS_NO_FORMAT)) == NOT_READ

"""The tool loop's decisions (tools/loop.py) and the reply splitting (tools/calls.py) on
the genuine Qwen3 tokenizer and template, without the app."""

from __future__ import annotations

import json
import shutil

from mlx_lm.utils import load_tokenizer

from ssdmoe_tui.mcp_config import check_mcp_servers
from ssdmoe_tui.tools.calls import ToolCall, split_reply
from ssdmoe_tui.tools.loop import ALWAYS, DENIED_TEXT, ONCE, ToolLoop
from ssdmoe_tui.tools.servers import ToolServers
from tests.helpers.fixture_paths import MODELS


def loop() -> ToolLoop:
    return ToolLoop(ToolServers(check_mcp_servers({"t": {"command": "true"}})))


def test_rounds_are_bounded_and_restart_with_each_user_message():
    tl = loop()
    assert tl.next_round(2) is None and tl.next_round(2) is None
    why = tl.next_round(2)
    assert why is not None and "after 2 rounds" in why and "F9" in why and "\n" not in why
    tl.begin()
    assert tl.next_round(2) is None


def test_always_is_per_conversation_and_once_or_deny_remember_nothing():
    tl = loop()
    tl.remember("c1", "get_weather", ONCE)
    assert tl.needs_approval("c1", "get_weather")
    tl.remember("c1", "get_weather", ALWAYS)
    assert not tl.needs_approval("c1", "get_weather")
    assert tl.needs_approval("c1", "other") and tl.needs_approval("c2", "get_weather")


def test_denied_and_bad_arguments_are_results_for_the_model():
    tl = loop()
    call = ToolCall("call_1", "get_weather", "[1, 2]")
    assert tl.denied(call).text == DENIED_TEXT and tl.denied(call).is_error
    bad = tl.run(call)
    assert bad.is_error and "a list, not a JSON object" in bad.text and "\n" not in bad.note
    unknown = tl.run(ToolCall("call_2", "nope", "{}"))  # no server running
    assert unknown.is_error and "unknown tool 'nope'" in unknown.text


def test_split_reply_takes_the_calls_out_with_the_servers_parser(tmp_path):
    for name in ("vocab.json", "merges.txt"):
        shutil.copy(MODELS / "qwen3-30b-a3b" / name, tmp_path / name)
    config = json.loads((MODELS / "qwen3-30b-a3b" / "tokenizer_config.json").read_text())
    config["chat_template"] = (MODELS / "qwen3-30b-a3b" / "chat_template.jinja").read_text()
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    tok = load_tokenizer(tmp_path)
    text = (
        "<think>\nweather\n</think>\n\nLet me look.\n"
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    )
    split = split_reply(text, tok, [])
    assert [(c.name, c.args()) for c in split.calls] == [("get_weather", {"city": "Paris"})]
    assert split.content == "<think>\nweather\n</think>\n\nLet me look."
    assert split_reply("no calls here", tok, []).calls == ()
    broken = "<tool_call>not json</tool_call>"
    assert split_reply(broken, tok, []).calls == ()
    assert split_reply(broken, tok, []).content == broken  # kept as text


def test_arguments_no_server_can_be_sent_are_refused_and_the_server_lives_on():
    """Issue 45: a model's call whose arguments held a lone surrogate (`"\\ud800"`, valid
    JSON, no UTF-8) was sent on; the MCP SDK could not encode it and closed the
    connection, so this call and every later one answered "Connection closed" while the
    server still showed as running. NaN and 1e400 (no JSON number) likewise. The
    arguments' one reader (tools.calls.parse_arguments) refuses them: the call is an
    error result naming why, one line, and the real server answers the next call."""
    from tests.helpers.mcp_servers import stdio_server
    from tests.tools.mcp_test_server import FORECAST

    tl = ToolLoop(ToolServers(check_mcp_servers({"weather": stdio_server()})))
    try:
        assert tl.servers.start() == []
        for args, why in (
            ('{"city": "\\ud800"}', "lone surrogate"),
            ('{"city": NaN}', "NaN is not a JSON number"),
            ('{"city": 1e400}', "out of range"),
            ('"Paris"', "a string, not a JSON object"),
        ):
            bad = tl.run(ToolCall("call_1", "get_weather", args))
            assert bad.is_error and why in bad.note and "\n" not in bad.note, bad
            assert bad.note.startswith("get_weather: ")
        good = tl.run(ToolCall("call_2", "get_weather", '{"city": "Paris"}'))
        assert good == type(good)(FORECAST)  # the connection is whole
    finally:
        tl.servers.close()

"""Issue 34 (7, 8): what a request asks that the server does not do as asked is said,
never silently dropped: a max_tokens / max_output_tokens past the context (10^30),
tools or a thinking switch the model's chat template cannot use, hosted tools in the
Responses API (one rule: left out, named in `ssdmoe.skipped_tools` and the warning).
Each in the `x-ssdmoe-warning` header and the reply's `ssdmoe.warnings`. 10,000 tools
are a 400 on every API. A real server on a loopback port, raw httpx and the SDKs."""

from __future__ import annotations

import json
import shutil

import httpx
import pytest

from ssdmoe_tui.options import EngineOptions
from ssdmoe_tui.server.main import ServeOptions
from ssdmoe_tui.server.schema import MAX_TOOLS
from tests.helpers.server import Running

TOOL = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}}
USER = [{"role": "user", "content": "hi"}]


@pytest.fixture
def isolated(tmp_path, monkeypatch):
    monkeypatch.setenv("SSDMOE_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("SSDMOE_LOCK_DIR", str(tmp_path / "locks"))
    return tmp_path


def start(model, root) -> Running:
    return Running(ServeOptions(EngineOptions(model=str(model)), cache_root=root / "sc"))


def post(srv: Running, path: str, body: dict, **kw) -> httpx.Response:
    return httpx.post(srv.url + path, json={"model": srv.model, **body}, timeout=60, **kw)


def short_context(model, root, tokens: int = 512):
    """A copy of `model` whose config says a context of `tokens`: a reply asked to run
    past the context decodes to its end (a random-weight model never ends one), so a
    short context keeps the five such requests below to seconds (at 2,048: 42-74 s)."""
    dst = root / "short-context"
    shutil.copytree(model, dst)
    config = json.loads((dst / "config.json").read_text())
    (dst / "config.json").write_text(json.dumps({**config, "max_position_embeddings": tokens}))
    return dst


def test_max_tokens_past_the_context_tools_and_hosted_tools(checkpoints, tool_model, isolated):
    srv = start(short_context(tool_model, isolated), isolated)
    try:
        ctx = srv.server.engine.info.max_context
        for path, body in (
            ("/v1/chat/completions", {"messages": USER, "max_tokens": 10**30}),
            ("/v1/completions", {"prompt": "hi", "max_tokens": 10**30}),
            ("/v1/responses", {"input": "hi", "max_output_tokens": 10**30}),
            ("/v1/messages", {"messages": USER, "max_tokens": 10**30}),
        ):
            r = post(srv, path, {**body, "temperature": 0.0})
            assert r.status_code == 200, (path, r.text)
            warning = r.headers["x-ssdmoe-warning"]
            assert "max_tokens 1e+30 is past the model's context" in warning, (path, warning)
            usage = r.json()["usage"]  # the Messages API counts cached input apart
            prompt = usage.get("prompt_tokens") or sum(
                usage.get(key) or 0 for key in
                ("input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens"))  # fmt: skip
            left = ctx - prompt
            assert f"the {left:,} tokens left" in warning, (path, usage, warning)
            assert left == usage.get("completion_tokens", usage.get("output_tokens")), usage
            assert r.json()["ssdmoe"]["warnings"] == [warning], path
        with httpx.stream("POST", srv.url + "/v1/chat/completions", timeout=60, json={
                "model": srv.model, "messages": USER, "max_tokens": 10**30, "stream": True,
                "max_completion_tokens": None}) as r:  # fmt: skip
            assert "past the model's context" in r.headers["x-ssdmoe-warning"]
            r.read()
        ok = post(srv, "/v1/chat/completions", {"messages": USER, "max_tokens": 2})
        assert "x-ssdmoe-warning" not in ok.headers and "warnings" not in ok.json()["ssdmoe"]
        # a template that reads tools and enable_thinking: nothing to say
        quiet = post(srv, "/v1/chat/completions", {"messages": USER, "max_tokens": 2,
                     "tools": [TOOL], "chat_template_kwargs": {"enable_thinking": False}})  # fmt: skip
        assert quiet.status_code == 200 and "x-ssdmoe-warning" not in quiet.headers, quiet.text
        # 10,000 tools: a 400 naming tools on every API
        many = [TOOL] * 10_000
        for path, body in (("/v1/chat/completions", {"messages": USER, "tools": many}),
                           ("/v1/responses", {"input": "hi", "tools": [
                               {"type": "function", "name": "f"}] * 10_000}),
                           ("/v1/messages", {"messages": USER, "max_tokens": 2, "tools": [
                               {"name": "f", "input_schema": {}}] * 10_000})):  # fmt: skip
            r = post(srv, path, body)
            assert r.status_code == 400, (path, r.text)
            assert "10,000 tools" in r.text and str(MAX_TOOLS) in r.text, r.text
        # hosted tools in the Responses API: left out, named, said (one rule)
        r = post(srv, "/v1/responses", {"input": "hi", "max_output_tokens": 2,
                 "tools": [{"type": "web_search"}, {"type": "function", "name": "f"}]})  # fmt: skip
        assert r.status_code == 200, r.text
        assert r.json()["ssdmoe"]["skipped_tools"] == ["web_search"]
        assert "hosted tools are not run by this server" in r.headers["x-ssdmoe-warning"]
        r = post(srv, "/v1/responses", {"input": "hi", "tools": [{"type": "shell_magic"}]})
        assert r.status_code == 400 and "shell_magic" in r.text  # not hosted: refused
    finally:
        srv.stop()


def test_tools_and_thinking_a_template_cannot_use_are_said(checkpoints, isolated):
    """The small checkpoint's own template shows neither tools nor a thinking switch."""
    srv = start(checkpoints("qwen3_moe"), isolated)
    try:
        r = post(srv, "/v1/chat/completions", {"messages": USER, "max_tokens": 2,
                 "tools": [TOOL], "chat_template_kwargs": {"enable_thinking": False}})  # fmt: skip
        assert r.status_code == 200, r.text
        warnings = r.json()["ssdmoe"]["warnings"]
        assert any("cannot show tools: the 1 tools sent" in w for w in warnings), warnings
        assert any("does not use 'enable_thinking'" in w for w in warnings), warnings
        assert r.headers["x-ssdmoe-warning"] == "; ".join(warnings)
        import anthropic

        a = anthropic.Anthropic(base_url=srv.url, api_key="unused", max_retries=0)
        raw = a.messages.with_raw_response.create(
            model=srv.model, max_tokens=2, messages=USER,
            tools=[{"name": "f", "input_schema": {"type": "object"}}])  # fmt: skip
        assert "cannot show tools" in raw.headers["x-ssdmoe-warning"]
    finally:
        srv.stop()


def test_a_warning_quoting_the_request_is_one_header_line(checkpoints, isolated):
    """A warning names what the request sent (a template switch's key): a key holding a
    line break or other control characters went into the header as it was, so the HTTP
    layer refused to send the response (a dropped connection, a traceback in the log)
    or the key's text became a header of its own. The header is one printable line."""
    srv = start(checkpoints("qwen3_moe"), isolated)
    try:
        key = "x\r\nSet-Cookie: a=b\x00\x1b[2J"
        r = post(srv, "/v1/chat/completions", {"messages": USER, "max_tokens": 2,
                 "chat_template_kwargs": {key: 1}})  # fmt: skip
        assert r.status_code == 200, r.text
        assert "set-cookie" not in r.headers
        warning = r.headers["x-ssdmoe-warning"]
        assert "does not use" in warning and all(" " <= c <= "~" for c in warning), warning
        assert len(r.json()["ssdmoe"]["warnings"]) == 1
    finally:
        srv.stop()


def test_template_switches_probed_per_request_are_bounded(checkpoints, isolated):
    """Each `chat_template_kwargs` key is checked by rendering the template 2-3 times: a
    body of 20,000 keys would hold the server's threads for tens of seconds. The first
    PROBED_KEYS_MAX are checked, the rest are said to be unchecked, and it stays quick."""
    import time

    from ssdmoe_tui.server.prompts import PROBED_KEYS_MAX

    srv = start(checkpoints("qwen3_moe"), isolated)
    try:
        keys = {f"k{i:05d}": i for i in range(20_000)}
        t0 = time.monotonic()
        r = post(srv, "/v1/chat/completions", {"messages": USER, "max_tokens": 2,
                 "chat_template_kwargs": keys})  # fmt: skip
        took = time.monotonic() - t0
        assert r.status_code == 200, r.text
        warnings = r.json()["ssdmoe"]["warnings"]
        unchecked = 20_000 - PROBED_KEYS_MAX
        assert warnings[0].startswith(f"{unchecked} of the 20000 chat_template_kwargs keys")
        assert sum("does not use" in w for w in warnings) == PROBED_KEYS_MAX
        assert took < 30, took  # a bound on a hang, not a speed claim (was minutes)
    finally:
        srv.stop()

"""Issue 45 item 3: the server's surfaces as a hostile page or a crowd of clients meets
them, on a real `--max-batch 4` server (loopback port, raw httpx and the official
`openai` client): look-alike and rebinding Host names, `Origin: null`, another port on
localhost, a Referer without an Origin, the content types clients send; 50 requests at
once on four slots; a client that leaves mid-stream while another joins the batch; a
request cancelled during its chunked join. Each is answered or refused in one line, and
the engine is free after."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import threading
import time

import httpx
import pytest

from tests.helpers.server import TIMEOUT, Running, options


@pytest.fixture(scope="module")
def srv(checkpoints, home):
    opts = dataclasses.replace(options(checkpoints("qwen3_moe"), home), max_batch=4,
                               persist_cache=False)  # fmt: skip
    running = Running(opts)
    yield running
    running.stop()


def _free(srv: Running) -> bool:
    """Whether the engine gives every slot back within TIMEOUT (bounded poll)."""
    t_end = time.monotonic() + TIMEOUT
    while time.monotonic() < t_end and (srv.server.engine.busy or srv.server.engine.queued):
        time.sleep(0.02)
    return not srv.server.engine.busy and not srv.server.engine.queued


def _chat(srv: Running, text: str, max_tokens: int, stream: bool = False) -> dict:
    return {"model": srv.model, "messages": [{"role": "user", "content": text}],
            "max_tokens": max_tokens, "temperature": 0, "stream": stream}  # fmt: skip


def _alone(srv: Running, text: str, max_tokens: int) -> str:
    r = httpx.post(srv.url + "/v1/chat/completions", json=_chat(srv, text, max_tokens),
                   timeout=TIMEOUT)  # fmt: skip
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["message"]["content"]


def test_look_alike_hosts_null_origins_other_ports_and_referers(srv):
    port = int(srv.url.rsplit(":", 1)[1])
    other = port + 1 if port < 65535 else port - 1
    body = json.dumps(_chat(srv, "hi", 1))
    post = srv.url + "/v1/chat/completions"
    # a page's name that only looks like loopback: DNS rebinding sends it as Host
    for host in ["127.0.0.1.evil.example", f"127.0.0.1.evil.example:{port}",
                 "localhost.evil.example", "127.0.0.1.nip.io", "0x7f000001.evil", "[::1].evil",
                 "evil.example"]:  # fmt: skip
        r = httpx.post(post, content=body, timeout=TIMEOUT,
                       headers={"host": host, "content-type": "application/json"})  # fmt: skip
        assert r.status_code == 403, (host, r.text)
        assert r.json()["error"]["code"] == "host_not_allowed", host
    # a loopback name with another port is this machine: answered (its page's Origin is not)
    ok = httpx.post(post, content=body, timeout=TIMEOUT,
                    headers={"host": f"localhost:{other}", "content-type": "application/json"})  # fmt: skip
    assert ok.status_code == 200, ok.text
    refused = [
        ("origin", "null"),
        ("origin", f"http://localhost:{other}"),
        ("origin", f"http://127.0.0.1:{other}"),
        ("referer", "https://evil.example/page?x=1"),
        ("referer", f"http://localhost:{other}/app.html"),
        ("referer", "null"),
    ]
    for name, value in refused:
        for method, url in (("POST", post), ("GET", srv.url + "/v1/models")):
            r = httpx.request(method, url, content=body if method == "POST" else None,
                              timeout=TIMEOUT, headers={name: value,
                                                        "content-type": "application/json"})  # fmt: skip
            assert r.status_code == 403, (name, value, method, r.text)
            err = r.json()["error"]
            assert err["code"] == "origin_not_allowed", err
            what = "Origin" if name == "origin" else "Referer"
            assert err["message"].startswith(f"{what} '{value}' is not allowed"), err
            assert "--allowed-origins" in err["message"] and "\n" not in err["message"]


@pytest.mark.parametrize(
    ("content_type", "status"),
    [
        ("application/json", 200),
        ("application/json; charset=utf-8", 200),
        ("Application/JSON; Charset=UTF-8", 200),
        ("APPLICATION/JSON", 200),
        ("application/x-www-form-urlencoded", 415),  # what `curl -d` sends
        ("text/plain;charset=UTF-8", 415),
        ("application/jsonx", 415),
        (None, 415),
    ],
)
def test_content_types(srv, content_type, status):
    headers = {} if content_type is None else {"content-type": content_type}
    r = httpx.post(srv.url + "/v1/chat/completions", content=json.dumps(_chat(srv, "hi", 1)),
                   headers=headers, timeout=TIMEOUT)  # fmt: skip
    assert r.status_code == status, (content_type, r.text)
    if status == 415:
        message = r.json()["error"]["message"]
        assert "send the body as JSON with 'Content-Type: application/json'" in message, message
        assert "\n" not in message


def test_curl_d_is_refused_naming_the_header(srv):
    """`curl -d '{...}' URL`, exactly as curl sends it (form-encoded by default)."""
    import shutil
    import subprocess

    curl = shutil.which("curl")
    if curl is None:
        pytest.skip("curl is not installed here")
    out = subprocess.run(
        [curl, "-s", "-m", str(TIMEOUT), srv.url + "/v1/chat/completions",
         "-d", json.dumps(_chat(srv, "hi", 1))],  # fmt: skip
        capture_output=True, text=True, timeout=TIMEOUT + 5,
    )  # fmt: skip
    err = json.loads(out.stdout)["error"]
    assert err["code"] == "unsupported_media_type", err
    assert "'application/x-www-form-urlencoded'" in err["message"], err
    assert "'Content-Type: application/json'" in err["message"], err


def test_fifty_concurrent_requests_on_four_slots_are_answered_or_refused(srv):
    """50 requests at once on --max-batch 4 (queue 8): each is a 200 whose reply equals the
    request alone, or a 429 with Retry-After; every one ends (bounded by a deadline), and
    the engine is free after."""
    text = f"{time.time_ns()} Name three colours."
    want = _alone(srv, text, 8)
    body = _chat(srv, text, 8)

    async def crowd() -> list[httpx.Response]:
        limits = httpx.Limits(max_connections=60)
        async with httpx.AsyncClient(timeout=TIMEOUT, limits=limits) as client:
            calls = [client.post(srv.url + "/v1/chat/completions", json=body) for _ in range(50)]
            return await asyncio.wait_for(asyncio.gather(*calls), 4 * TIMEOUT)

    answers = asyncio.run(crowd())
    statuses = sorted(r.status_code for r in answers)
    assert set(statuses) <= {200, 429}, statuses
    ok = [r for r in answers if r.status_code == 200]
    assert len(ok) >= 4, statuses  # at least every slot answered
    for r in ok:
        assert r.json()["choices"][0]["message"]["content"] == want
    for r in answers:
        if r.status_code == 429:
            assert r.headers["retry-after"]
            err = r.json()["error"]
            assert err["type"] == "rate_limit_error" and "retry later" in err["message"], err
    assert _free(srv)
    assert _alone(srv, text, 8) == want
    print(f"50 at once on 4 slots: {len(ok)} answered, {50 - len(ok)} refused with 429")


def _progress(srv: Running, text: str, until: str, max_tokens: int = 2):
    """Open a stream of `text` and read it until a line containing `until`; returns
    (stream context, the lines read). The caller closes the context to leave."""
    cm = httpx.stream("POST", srv.url + "/v1/chat/completions",
                      json=_chat(srv, text, max_tokens, stream=True), timeout=TIMEOUT)  # fmt: skip
    r = cm.__enter__()
    assert r.status_code == 200
    lines = r.iter_lines()
    seen = []
    for line in lines:
        seen.append(line)
        if until in line or len(seen) > 2000:
            break
    return cm, lines, seen


def _in_thread(srv: Running, text: str, max_tokens: int) -> tuple[threading.Thread, dict]:
    """A whole (non-streamed) chat request on a thread of its own; its response lands
    in the dict's "r" once the thread ends."""
    result: dict = {}

    def ask() -> None:
        result["r"] = httpx.post(srv.url + "/v1/chat/completions",
                                 json=_chat(srv, text, max_tokens), timeout=TIMEOUT)  # fmt: skip

    thread = threading.Thread(target=ask)
    thread.start()
    return thread, result


def test_a_client_leaving_mid_stream_while_another_joins(srv):
    """Stream A decodes; request B joins the batch (its prefill in chunks beside A); A's
    client leaves while B joins: B's reply equals B alone, and the engine is free."""
    long_b = f"{time.time_ns()} " + " ".join(["experts streamed from the disk"] * 150)
    want_b = _alone(srv, long_b, 12)
    text_a = f"{time.time_ns()} Tell me about streaming experts from an SSD."
    cm, _, seen = _progress(srv, text_a, '"content"', max_tokens=400)  # A decodes
    b, result = _in_thread(srv, long_b, 12)
    t_end = time.monotonic() + TIMEOUT  # B has its slot: it is joining now
    while srv.server.engine.running < 2 and time.monotonic() < t_end and b.is_alive():
        time.sleep(0.005)
    cm.__exit__(None, None, None)  # A's client leaves
    b.join(TIMEOUT)
    assert not b.is_alive()
    assert result["r"].status_code == 200, result["r"].text
    assert result["r"].json()["choices"][0]["message"]["content"] == want_b
    assert any('"content"' in line for line in seen)
    assert _free(srv)


def test_a_request_cancelled_during_its_chunked_join(srv):
    """Stream A decodes; stream B's long prompt joins in chunks of 128 tokens between A's
    steps; B's client leaves after a progress comment shows its prefill half done: B's
    row is dropped, A's reply is whole and equal to A alone, and the next request runs."""
    state = srv.server.state
    settings = state.settings
    state.settings = dataclasses.replace(settings, keepalive_s=0.05)
    try:
        text_a = f"{time.time_ns()} Why stream experts from a disk?"
        want_a = _alone(srv, text_a, 300)
        long_b = f"{time.time_ns()} " + " ".join(["experts streamed from the disk"] * 300)
        a, result = _in_thread(srv, text_a, 300)
        t_end = time.monotonic() + TIMEOUT
        while not srv.server.engine.busy and time.monotonic() < t_end:
            time.sleep(0.005)
        cm, _, seen = _progress(srv, long_b, ": prefill ")  # B is joining, chunk by chunk
        a_decoding = a.is_alive() and srv.server.engine.running == 2
        cm.__exit__(None, None, None)  # B's client leaves during the join
        assert a_decoding  # B's prefill ran beside A's steps: a chunked join
        joined = [ln for ln in seen if ln.startswith(": prefill ")]
        assert joined, seen[-5:]
        done, total = map(int, joined[-1].split()[-1].split("/"))
        assert 0 <= done < total, joined[-1]
        a.join(TIMEOUT)
        assert not a.is_alive()
        assert result["r"].status_code == 200, result["r"].text
        assert result["r"].json()["choices"][0]["message"]["content"] == want_a
    finally:
        state.settings = settings
    assert _free(srv)
    assert _alone(srv, "After the cancel: hello.", 3)


BODIES = {
    "/v1/chat/completions": lambda m: {"model": m, "max_tokens": 1,
                                       "messages": [{"role": "user", "content": "hi"}]},
    "/v1/completions": lambda m: {"model": m, "max_tokens": 1, "prompt": "hi"},
    "/v1/messages": lambda m: {"model": m, "max_tokens": 1,
                               "messages": [{"role": "user", "content": "hi"}]},
    "/v1/responses": lambda m: {"model": m, "max_output_tokens": 1, "input": "hi"},
}  # fmt: skip
WRONG = [("metadata", "x"), ("user", 5), ("store", "no"), ("service_tier", 3),
         ("parallel_tool_calls", "x"), ("include", [1]), ("truncation", "cut")]  # fmt: skip
RIGHT = [("metadata", {"a": "b"}), ("user", "u-1"), ("store", False), ("service_tier", "auto"),
         ("parallel_tool_calls", True), ("include", ["reasoning.encrypted_content"]),
         ("truncation", "disabled")]  # fmt: skip


@pytest.mark.parametrize("path", list(BODIES))
def test_fields_that_change_nothing_still_have_their_types(srv, path):
    """`"metadata": "x"` or `"user": 5` was a 200 without a word (a Response echoed the
    "x"): now a 400 naming the field, on each API that has the field; right values pass."""
    from ssdmoe_tui.server.schema import CHAT_FIELDS, COMPLETION_FIELDS
    from ssdmoe_tui.server.schema_messages import MESSAGES_FIELDS
    from ssdmoe_tui.server.schema_responses import RESPONSES_FIELDS

    known = {"/v1/chat/completions": CHAT_FIELDS, "/v1/completions": COMPLETION_FIELDS,
             "/v1/messages": MESSAGES_FIELDS, "/v1/responses": RESPONSES_FIELDS}[path]  # fmt: skip
    tried = 0
    for (name, bad), (_, good) in zip(WRONG, RIGHT, strict=True):
        if name not in known:
            continue
        tried += 1
        r = httpx.post(srv.url + path, json=BODIES[path](srv.model) | {name: bad}, timeout=TIMEOUT)
        assert r.status_code == 400, (path, name, r.text)
        message = r.text
        assert f"'{name}' must be" in message and "\\n" not in message, message
        r = httpx.post(srv.url + path, json=BODIES[path](srv.model) | {name: good}, timeout=TIMEOUT)
        assert r.status_code == 200, (path, name, r.text)
        assert name not in r.headers.get("x-ssdmoe-warning", ""), r.headers
    assert tried >= 2


TEXT_PARTS = [
    ("/v1/chat/completions", {"messages": [{"role": "user",
                                            "content": [{"type": "text", "text": 5}]}]}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": [{"type": "text"}]}]}),
    ("/v1/messages", {"messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}]}),
    ("/v1/messages", {"messages": [{"role": "user", "content": "hi"}],
                      "system": [{"type": "text", "text": ["x"]}]}),
    ("/v1/responses", {"input": [{"role": "user",
                                  "content": [{"type": "input_text", "text": 5}]}]}),
]  # fmt: skip


@pytest.mark.parametrize(("path", "extra"), TEXT_PARTS)
def test_a_text_part_whose_text_is_no_string_is_named_as_such(srv, path, extra):
    """A text part with `"text": 5` was taken as "5" (chat) or called a part of a type
    not supported (messages' system, responses): now one line saying what is wrong."""
    body = BODIES[path](srv.model) | extra
    r = httpx.post(srv.url + path, json=body, timeout=TIMEOUT)
    assert r.status_code == 400, r.text
    message = r.json()["error"]["message"]
    assert "part's 'text' must be a string" in message and "not supported" not in message, message


def test_a_tool_use_input_that_is_no_object_is_refused(srv):
    """Anthropic's `tool_use.input` is an object: `"input": "x"` was sent on as the call's
    arguments `"x"` without a word."""
    messages = [{"role": "user", "content": "weather?"},
                {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "f",
                                                   "input": "notobj"}]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1",
                                              "content": "sunny"}]}]  # fmt: skip
    body = BODIES["/v1/messages"](srv.model) | {"messages": messages}
    r = httpx.post(srv.url + "/v1/messages", json=body, timeout=TIMEOUT)
    assert r.status_code == 400, r.text
    assert "'input' must be an object" in r.json()["error"]["message"]
    messages[1]["content"][0]["input"] = {"city": "Paris"}
    r = httpx.post(srv.url + "/v1/messages", json=body, timeout=TIMEOUT)
    assert r.status_code == 200, r.text

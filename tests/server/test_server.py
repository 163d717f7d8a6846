"""`ssdmoe serve` end to end: a real uvicorn server on a loopback port, a real engine on a
small random checkpoint, driven by the official `openai` client and raw HTTP (httpx).

Greedy output equals `ssdmoe generate` token for token; a second turn is served >= 97 %
from the KV cache, also after a restart (checkpoints on disk); a client that disconnects
frees the engine within a second; a full queue is a 429; every bad request is a 4xx in
OpenAI's error envelope.
"""

from __future__ import annotations

import dataclasses
import json
import threading
import time

import httpx
import openai
import pytest

from ssdmoe_tui.server.main import bind, url_of
from tests.helpers.server import (
    TIMEOUT,
    Running,
    assert_new_chat_reuses_system_prompt,
    conversation_turns,
    generate_json,
    options,
)
from tests.helpers.texts import HELLO, SYSTEM


@pytest.fixture(scope="module")
def model(checkpoints, home):
    return checkpoints("qwen3_moe")


@pytest.fixture(scope="module")
def reference(model):
    return generate_json(model, HELLO[0]["content"], max_tokens=16)


@pytest.fixture(scope="module")
def srv(model, reference, home):
    running = Running(options(model, home))
    yield running
    running.stop()


def sse_events(resp: httpx.Response) -> list:
    out = []
    for line in resp.iter_lines():
        if line.startswith("data: "):
            data = line[len("data: ") :]
            out.append(data if data == "[DONE]" else json.loads(data))
    return out


# --------------------------------------------------------------------------- basics


def test_health_models_and_stats(srv):
    r = httpx.get(srv.url + "/health", timeout=5)
    assert r.status_code == 200 and r.json()["status"] == "ok"
    models = srv.client().models.list()
    assert [m.id for m in models.data] == [srv.model]
    stats = httpx.get(srv.url + "/v1/stats", timeout=5).json()
    assert stats["model"] == srv.model and stats["engine"]["device"]


def test_non_streaming_equals_generate(srv, reference):
    r = srv.client().chat.completions.create(
        model=srv.model, messages=HELLO, max_tokens=16, temperature=0
    )
    choice = r.choices[0]
    assert choice.message.role == "assistant"
    assert choice.message.content == reference["text"]
    assert r.usage.completion_tokens == len(reference["token_ids"])
    assert r.usage.prompt_tokens == len(reference["prompt_token_ids"])
    assert choice.finish_reason == reference["finish_reason"]
    ext = r.model_extra["ssdmoe"]
    assert ext["k"] == reference["k"]
    assert ext["stats"]["generated_tokens"] == len(reference["token_ids"])


def test_streaming_sse_shape_and_equals_generate(srv, reference):
    body = {"model": srv.model, "messages": HELLO, "max_tokens": 16, "temperature": 0,
            "stream": True, "stream_options": {"include_usage": True}}  # fmt: skip
    with httpx.stream("POST", srv.url + "/v1/chat/completions", json=body, timeout=TIMEOUT) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        events = sse_events(r)
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    content = [c["choices"][0]["delta"].get("content", "") for c in chunks[1:-2]]
    assert all(content) and "".join(content) == reference["text"]
    final, usage = chunks[-2], chunks[-1]
    assert final["choices"][0]["finish_reason"] == reference["finish_reason"]
    assert final["ssdmoe"]["k"] == reference["k"]
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == len(
        reference["token_ids"]
    )
    assert "cached_tokens" in usage["usage"]["prompt_tokens_details"]
    # the official client reads the same stream
    stream = srv.client().chat.completions.create(
        model=srv.model, messages=HELLO, max_tokens=16, temperature=0, stream=True
    )
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert text == reference["text"]


def test_completions_endpoint(srv):
    c = srv.client()
    r = c.completions.create(model=srv.model, prompt="Paris is", max_tokens=5)
    assert r.choices[0].text and r.usage.completion_tokens == 5
    assert r.choices[0].finish_reason == "length"
    stream = c.completions.create(model=srv.model, prompt="Paris is", max_tokens=5, stream=True)
    assert "".join(ch.choices[0].text for ch in stream if ch.choices) == r.choices[0].text


def test_stop_string_cuts_the_reply(srv, reference):
    text = reference["text"]
    stop = text[len(text) // 2 : len(text) // 2 + 3]
    want = text[: text.index(stop)]
    c = srv.client()
    r = c.chat.completions.create(model=srv.model, messages=HELLO, max_tokens=16, stop=[stop])
    assert r.choices[0].message.content == want and r.choices[0].finish_reason == "stop"
    stream = c.chat.completions.create(
        model=srv.model, messages=HELLO, max_tokens=16, stop=stop, stream=True
    )
    chunks = [ch for ch in stream if ch.choices]
    assert "".join(ch.choices[0].delta.content or "" for ch in chunks) == want
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_max_tokens_past_the_context_is_clamped(srv):
    """opencode sends max_tokens 32000 whatever the context: the reply gets the room left
    and ends with `length` (was a 400 once prompt + max_tokens passed the context)."""
    ctx = srv.server.engine.info.max_context
    long_text = " ".join(["streaming experts from the disk"] * 380)  # ~1,900 of 2,048 tokens
    messages = [{"role": "user", "content": long_text}]
    r = srv.client().chat.completions.create(model=srv.model, messages=messages, max_tokens=32000)
    assert r.usage.prompt_tokens + r.usage.completion_tokens == ctx, r.usage
    assert r.choices[0].finish_reason == "length"


def test_samplers_and_penalties_are_honoured(srv, reference):
    """top_k, min_p and the penalties reach the engine (mlx-lm's sampler and processors,
    tests/engine/test_engine_exact.py); a bad value is a 400 naming the field."""
    c = srv.client()
    plain = reference["text"]
    kw = {"model": srv.model, "messages": HELLO, "max_tokens": 16, "temperature": 0}
    r = c.chat.completions.create(**kw, extra_body={"top_k": 5, "min_p": 0.05})
    assert r.choices[0].message.content == plain  # greedy: the samplers do not change it
    # negative penalties favour the last 20 tokens: the reply starts repeating itself
    r = c.chat.completions.create(**kw, frequency_penalty=-2, presence_penalty=-2,
                                  extra_body={"repetition_penalty": 1.2})  # fmt: skip
    assert r.choices[0].message.content != plain
    a, b = (c.chat.completions.create(**{**kw, "temperature": 1.0}, seed=3,
                                      extra_body={"top_k": 4, "min_p": 0.1})
            for _ in range(2))  # fmt: skip
    assert a.choices[0].message.content == b.choices[0].message.content
    for field, value in [("repetition_penalty", 0), ("top_k", "x"), ("min_p", 2),
                         ("presence_penalty", 3)]:  # fmt: skip
        body = {**kw, field: value}
        got = httpx.post(srv.url + "/v1/chat/completions", json=body, timeout=TIMEOUT)
        assert got.status_code == 400 and got.json()["error"]["param"] == field, got.text


# --------------------------------------------------------------------------- K and stats


def test_k_per_request_suffix_and_extension(srv):
    c = srv.client()
    r = c.chat.completions.create(model=f"{srv.model}@k2", messages=HELLO, max_tokens=3)
    assert r.model_extra["ssdmoe"]["k"] == 2
    r = c.chat.completions.create(
        model=srv.model, messages=HELLO, max_tokens=3, extra_body={"ssdmoe": {"k": 3}}
    )
    assert r.model_extra["ssdmoe"]["k"] == 3
    raw = c.chat.completions.with_raw_response.create(model=srv.model, messages=HELLO, max_tokens=3)
    header = raw.headers["x-ssdmoe-stats"]
    assert header.startswith("k=4;") and "ssd_mib_per_token=" in header  # back to the default
    assert httpx.get(srv.url + "/v1/stats", timeout=5).json()["last_response"]["k"] == 4


# --------------------------------------------------------------------------- prompt cache


def test_multi_turn_reuse_and_restart_from_disk(srv, model, home, monkeypatch):
    monkeypatch.setenv("SSDMOE_LOCK_DIR", str(home / "locks"))  # the module server's lock folder
    c = srv.client()
    messages, usages = conversation_turns(c, srv.model, 3)
    for u in usages[1:]:
        assert u.prompt_tokens_details.cached_tokens >= 0.97 * u.prompt_tokens, u
    # a fresh server (new engine, empty memory) continues from the checkpoints on disk
    srv.stop()
    again = Running(options(model, home))
    try:
        _, usages = conversation_turns(again.client(), again.model, 1, start=messages)
        u = usages[0]
        assert u.prompt_tokens_details.cached_tokens >= 0.97 * u.prompt_tokens, u
        assert again.server.kv.last_load is not None
        # a new chat with the same system prompt loads the system part's own checkpoint
        system_part = assert_new_chat_reuses_system_prompt(again)
    finally:
        again.stop()
        # later tests use `srv`: bring it back on the same object
        fresh = Running(options(model, home))
        srv.__dict__.update(fresh.__dict__)
    # An edited earlier reply matches no recorded history: the conversation's checkpoint
    # on disk (attention-only) is trimmed to the part the prompts share, which is more
    # than the system part's own checkpoint.
    branch = [dict(m) for m in messages[:3]]
    branch[2]["content"] += " (edited)"
    branch.append({"role": "user", "content": "And?"})
    r = srv.client().chat.completions.create(model=srv.model, messages=branch, max_tokens=2)
    cached = r.usage.prompt_tokens_details.cached_tokens
    assert srv.server.kv.last_load[1] == cached > system_part, (cached, system_part)


# --------------------------------------------------------------------------- one at a time


def time_to_free(srv, limit: float = 5.0) -> float:
    """Seconds until the engine is free (after a client left); `limit` if it never is."""
    t0 = time.monotonic()
    while srv.server.engine.busy and time.monotonic() - t0 < limit:
        time.sleep(0.01)
    return time.monotonic() - t0 if not srv.server.engine.busy else limit


def test_disconnect_cancels_and_frees_the_engine(srv):
    body = {"model": srv.model, "messages": HELLO, "max_tokens": 1500, "stream": True}
    with httpx.stream("POST", srv.url + "/v1/chat/completions", json=body, timeout=TIMEOUT) as r:
        lines = r.iter_lines()
        assert next(lines).startswith("data: ")
    assert time_to_free(srv) < 1.0
    r = srv.client().chat.completions.create(model=srv.model, messages=HELLO, max_tokens=2)
    assert r.usage.completion_tokens == 2


def test_health_answers_during_a_long_prefill_and_disconnect_cancels_it(srv):
    # ~1,500 tokens that share no prefix with the earlier tests' prompts: since the disk
    # is consulted whenever it serves more than memory (issue 34), a checkpoint of a
    # longer prompt with the same start would serve nearly all of it, and no prefill runs.
    long_text = "prefill " + " ".join(["streaming experts from the disk"] * 300)
    body = {"model": srv.model, "messages": [{"role": "user", "content": long_text}],
            "max_tokens": 1, "stream": True}  # fmt: skip
    slowest = 0.0
    seen_prefill = False
    with httpx.stream("POST", srv.url + "/v1/chat/completions", json=body, timeout=TIMEOUT) as r:
        lines = r.iter_lines()
        assert next(lines).startswith("data: ")  # the role chunk comes before the prefill ends
        t_end = time.monotonic() + 10
        while time.monotonic() < t_end and not seen_prefill:
            t0 = time.monotonic()
            h = httpx.get(srv.url + "/health", timeout=5).json()
            slowest = max(slowest, time.monotonic() - t0)
            seen_prefill = h["phase"] == "prefill"
    assert seen_prefill and slowest < 0.5, slowest
    assert time_to_free(srv) < 1.0


def timed_lines(url: str, body: dict, headers: dict | None = None) -> list[tuple[float, str]]:
    """Every line of a streamed reply with the time it arrived."""
    out = [(time.monotonic(), "")]
    with httpx.stream("POST", url, json=body, headers=headers, timeout=TIMEOUT) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            out.append((time.monotonic(), line))
    return out


def test_streams_are_never_silent_while_queued_or_in_prefill(srv):
    """Every streaming endpoint sends an SSE comment with progress at least every
    `keepalive_s` while its request waits for the engine or is in prefill (proxies and
    Node's fetch drop a silent stream); a queued client that leaves frees its place."""
    state = srv.server.state
    settings = state.settings
    state.settings = dataclasses.replace(settings, keepalive_s=0.5)
    model = srv.model
    engine = srv.server.engine
    slots, engine.max_batch = engine.max_batch, 1  # one slot: the blocker makes others queue

    def long(i: int) -> str:  # a prompt no cache serves (it differs from the first word)
        return f"{i} " + " ".join(["streaming experts from the disk"] * 250)

    bodies = {
        "/v1/chat/completions": lambda i: {"model": model, "max_tokens": 2, "stream": True,
                                           "messages": [{"role": "user", "content": long(i)}]},
        "/v1/completions": lambda i: {"model": model, "max_tokens": 2, "stream": True,
                                      "prompt": long(i)},
        "/v1/responses": lambda i: {"model": model, "max_output_tokens": 2, "stream": True,
                                    "input": long(i)},
        "/v1/messages": lambda i: {"model": model, "max_tokens": 2, "stream": True,
                                   "messages": [{"role": "user", "content": long(i)}]},
    }  # fmt: skip
    blocker_body = {"model": model, "messages": HELLO, "max_tokens": 400, "stream": True}
    try:
        for i, (path, body) in enumerate(bodies.items()):
            blocker = threading.Thread(
                target=timed_lines, args=(srv.url + "/v1/chat/completions", blocker_body)
            )
            blocker.start()
            t_end = time.monotonic() + 10
            while not srv.server.engine.busy and time.monotonic() < t_end:
                time.sleep(0.01)
            lines = timed_lines(srv.url + path, body(time.time_ns() + i))
            blocker.join(TIMEOUT)
            gaps = [b[0] - a[0] for a, b in zip(lines, lines[1:], strict=False)]
            comments = [line for _, line in lines if line.startswith(":")]
            assert max(gaps) < 2.0, (path, max(gaps))
            assert any("queued" in c for c in comments), (path, comments)
            assert any("prefill" in c for c in comments), (path, comments)
        # a queued client that goes away gives its place back
        blocker = threading.Thread(
            target=timed_lines, args=(srv.url + "/v1/chat/completions", blocker_body)
        )
        blocker.start()
        while not srv.server.engine.busy:
            time.sleep(0.01)
        body = bodies["/v1/messages"](time.time_ns())
        with httpx.stream("POST", srv.url + "/v1/messages", json=body, timeout=TIMEOUT) as r:
            lines = r.iter_lines()
            while not next(lines).startswith(": queued"):
                pass
            assert srv.server.engine.queued == 1
        t0 = time.monotonic()
        while srv.server.engine.queued and time.monotonic() - t0 < 2:
            time.sleep(0.01)
        assert srv.server.engine.queued == 0
        blocker.join(TIMEOUT)
    finally:
        state.settings = settings
        engine.max_batch = slots
    assert time_to_free(srv) < 1.0


def test_disconnect_during_the_system_prompt_step_frees_the_engine(srv):
    chat = [{"role": "system", "content": "Another agent. " + SYSTEM},
            {"role": "user", "content": "Hi"}]  # fmt: skip
    body = {"model": srv.model, "messages": chat, "max_tokens": 4}
    with pytest.raises(httpx.ReadTimeout):  # the client gives up during the prefill
        httpx.post(srv.url + "/v1/chat/completions", json=body, timeout=0.3)
    assert time_to_free(srv) < 1.5
    r = srv.client().chat.completions.create(model=srv.model, messages=chat, max_tokens=2)
    assert r.usage.completion_tokens == 2


def test_second_server_is_told_who_holds_the_model(srv, model, home):
    """`ssdmoe serve` on a model that does not fit beside the one this process holds (a fake
    1 MiB machine): one line with the numbers, exit 1."""
    import os
    import subprocess
    import sys

    proc = subprocess.run(
        [sys.executable, "-m", "ssdmoe_tui.cli", "serve", "--model", str(model), "--port", "0"],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        env={
            **os.environ,
            "SSDMOE_LOCK_DIR": str(home / "locks"),  # the module server's
            "SSDMOE_TEST_AVAILABLE_MEMORY": str(1 << 20),
        },
    )
    assert proc.returncode == 1
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("ssdmoe: error: not enough memory for a second model: needs"), last
    assert f"held by pid {os.getpid()} (" in last and "1.0 MiB available" in last, last
    assert "Traceback" not in proc.stderr


def test_two_clients_wait_or_get_429(srv):
    results: list = [None, None]
    body = {"model": srv.model, "messages": HELLO, "max_tokens": 40}

    def call(i: int) -> None:
        results[i] = httpx.post(srv.url + "/v1/chat/completions", json=body, timeout=TIMEOUT)

    threads = [threading.Thread(target=call, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(TIMEOUT)
    assert [r.status_code for r in results] == [200, 200]  # both answered (together)
    # with every slot taken and no room in the queue the second is refused, and both keep
    # working after (one slot here: the batch's slots are tests/server/test_server_batch.py's)
    engine = srv.server.engine
    slots, engine.max_batch, engine.max_queue = engine.max_batch, 1, 0
    try:
        body["max_tokens"] = 300
        body["stream"] = True
        with httpx.stream(
            "POST", srv.url + "/v1/chat/completions", json=body, timeout=TIMEOUT
        ) as r:
            lines = r.iter_lines()  # keep it: dropping the iterator closes the connection
            assert next(lines).startswith("data: ")
            second = httpx.post(srv.url + "/v1/chat/completions", json=body, timeout=TIMEOUT)
        assert second.status_code == 429 and second.headers["retry-after"]
        assert second.json()["error"]["type"] == "rate_limit_error"
    finally:
        engine.max_batch, engine.max_queue = slots, 8
    h = httpx.get(srv.url + "/health", timeout=5)
    assert h.status_code == 200


def test_cors_only_for_the_allowed_origins(srv):
    """No CORS by default (a web page must not drive a keyless loopback server); with
    --allowed-origins, those origins' pages may (preflight, headers, exposed stats)."""
    import uvicorn

    from ssdmoe_tui.server.routes import build_app

    page = "http://localhost:3000"
    preflight = {"origin": page, "access-control-request-method": "POST",
                 "access-control-request-headers": "authorization,content-type"}  # fmt: skip
    r = httpx.options(srv.url + "/v1/chat/completions", headers=preflight, timeout=5)
    assert r.status_code == 403 and "access-control-allow-origin" not in r.headers
    r = httpx.get(srv.url + "/v1/models", headers={"origin": page}, timeout=5)
    assert r.status_code == 403 and "access-control-allow-origin" not in r.headers
    # the same state behind an app with CORS on, on its own loopback port
    state = srv.server.state
    cors = dataclasses.replace(
        state, settings=dataclasses.replace(state.settings, allowed_origins=(page,))
    )
    sock = bind("127.0.0.1", 0)
    server = uvicorn.Server(uvicorn.Config(build_app(cors), log_level="warning", lifespan="off"))
    thread = threading.Thread(target=lambda: server.run(sockets=[sock]), daemon=True)
    thread.start()
    try:
        url = url_of(sock)
        t_end = time.monotonic() + TIMEOUT
        while not server.started and time.monotonic() < t_end:
            time.sleep(0.01)
        r = httpx.options(url + "/v1/chat/completions", headers=preflight, timeout=5)
        assert r.status_code == 200 and r.headers["access-control-allow-origin"] == page
        assert "POST" in r.headers["access-control-allow-methods"]
        assert "authorization" in r.headers["access-control-allow-headers"].lower()
        r = httpx.get(url + "/v1/models", headers={"origin": page}, timeout=5)
        assert r.headers["access-control-allow-origin"] == page
        assert "x-ssdmoe-stats" in r.headers["access-control-expose-headers"]
        other = httpx.get(url + "/v1/models", headers={"origin": "https://evil.example"})
        assert other.status_code == 403 and "access-control-allow-origin" not in other.headers
    finally:
        server.should_exit = True
        thread.join(TIMEOUT)
        sock.close()


def test_speculation_per_request(srv, reference):
    """`ssdmoe.speculate` speculates this request (the server's --speculate otherwise):
    the greedy reply is the same; the reply's stats carry the speculation figures."""
    r = srv.client().chat.completions.create(
        model=srv.model, messages=HELLO, max_tokens=16, temperature=0,
        extra_body={"ssdmoe": {"speculate": "ngram"}},
    )  # fmt: skip
    assert r.choices[0].message.content == reference["text"]
    sp = r.model_extra["ssdmoe"]["stats"]["speculation"]
    assert sp["mode"] == "ngram" and sp["tokens_per_pass"] >= 1.0


API_BODIES = {
    "/v1/chat/completions": {"messages": HELLO, "max_tokens": 2},
    "/v1/completions": {"prompt": "Hello", "max_tokens": 2},
    "/v1/responses": {"input": "Hello", "max_output_tokens": 2},
    "/v1/messages": {"messages": HELLO, "max_tokens": 2},
}


def _error_text(r: httpx.Response) -> str:
    err = r.json()["error"]  # OpenAI's envelope and Anthropic's both nest it
    return err["message"]


@pytest.mark.parametrize("path", list(API_BODIES))
def test_speculation_and_unknown_fields_are_said_the_same_on_every_api(srv, path):
    """Issue 45: `ssdmoe.speculate: "bogus"` was a 400 on chat/completions but a silent
    200 on /v1/messages and /v1/responses (which also ignored a good value); "mtp" on a
    model without an MTP head was the engine's 500; an unknown top-level field was
    ignored without a word. Now: the same 400 on every API, one line naming the field,
    and a warning naming the unknown field."""
    body = {"model": srv.model, "temperature": 0, **API_BODIES[path]}
    bogus = httpx.post(srv.url + path, json={**body, "ssdmoe": {"speculate": "bogus"}},
                       timeout=TIMEOUT)  # fmt: skip
    assert bogus.status_code == 400, bogus.text
    assert "ssdmoe.speculate" in _error_text(bogus) and "bogus" in _error_text(bogus)
    mtp = httpx.post(srv.url + path, json={**body, "ssdmoe": {"speculate": "mtp"}},
                     timeout=TIMEOUT)  # fmt: skip
    assert mtp.status_code == 400, mtp.text
    said = _error_text(mtp)
    assert said.startswith("ssdmoe.speculate 'mtp': qwen3_moe has no MTP head"), said
    assert "\n" not in said and "--speculate" not in said
    typo = httpx.post(srv.url + path, json={**body, "temprature": 0.5, "x\x1by": 1},
                      timeout=TIMEOUT)  # fmt: skip
    assert typo.status_code == 200, typo.text
    warning = typo.headers["x-ssdmoe-warning"]
    assert "unknown fields 'temprature', 'x\\x1by' ignored" in warning, warning
    ok = httpx.post(srv.url + path, json={**body, "ssdmoe": {"speculate": "ngram"}},
                    timeout=TIMEOUT)  # fmt: skip
    assert ok.status_code == 200 and "x-ssdmoe-warning" not in ok.headers, ok.text
    assert ok.json()["ssdmoe"]["stats"]["speculation"]["mode"] == "ngram"  # honoured


# --------------------------------------------------------------------------- 4xx


@pytest.mark.parametrize(
    "patch, status, param",
    [
        ({"n": 2}, 400, "n"),
        ({"logprobs": True}, 400, "logprobs"),
        ({"response_format": {"type": "json_object"}}, 400, "response_format"),
        ({"model": "gpt-4o"}, 404, "model"),
        ({"messages": []}, 400, "messages"),
        ({"max_tokens": 0}, 400, "max_tokens"),
        ({"temperature": 5}, 400, "temperature"),
        ({"ssdmoe": {"k": 99}}, 400, "ssdmoe.k"),
        ({"tool_choice": "required"}, 400, "tool_choice"),
        ({"messages": [{"role": "user", "content": "x " * 3000}]}, 400, "messages"),
        ({"seed": 2**64}, 400, "seed"),  # was a 500 from the engine
        ({"ssdmoe": {"k": "4"}}, 400, "ssdmoe.k"),
        ({"ssdmoe": {"speculate": "7"}}, 400, "ssdmoe.speculate"),
        ({"ssdmoe": {"speculate": 1}}, 400, "ssdmoe.speculate"),
    ],
)
def test_bad_requests_get_openai_errors(srv, patch, status, param):
    body = {"model": srv.model, "messages": HELLO, "max_tokens": 2, **patch}
    r = httpx.post(srv.url + "/v1/chat/completions", json=body, timeout=TIMEOUT)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["param"] == param and err["message"] and err["type"]


def test_malformed_body_size_cap_and_api_key(srv):
    url = srv.url + "/v1/chat/completions"
    r = httpx.post(url, content=b"{not json", headers={"content-type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_json"
    # RecursionError in json: was a plain-text 500
    r = httpx.post(url, content=b"[" * 5000, headers={"content-type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_json"
    for path, body in [  # lone surrogates failed in the tokenizer: 500
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "\ud800"}]}),
        ("/v1/completions", {"prompt": "x \udfff"}),
    ]:
        data = json.dumps({"model": srv.model, **body}).encode()  # ASCII: "\ud800" escapes
        r = httpx.post(srv.url + path, content=data, timeout=TIMEOUT,
                       headers={"content-type": "application/json"})  # fmt: skip
        assert r.status_code == 400 and r.json()["error"]["param"] in body, r.text
    # a token id past the embedding killed the process (SIGSEGV in MLX's gather)
    r = httpx.post(srv.url + "/v1/completions", timeout=TIMEOUT,
                   json={"model": srv.model, "prompt": [10**8], "max_tokens": 1})  # fmt: skip
    assert r.status_code == 400 and r.json()["error"]["param"] == "prompt", r.text
    c = srv.client()
    # OpenAI's seeds are signed: -1 runs as 2**64-1
    a, b = (
        c.chat.completions.create(
            model=srv.model, messages=HELLO, max_tokens=3, temperature=1.0, seed=seed
        )
        for seed in (-1, 2**64 - 1)
    )
    assert a.choices[0].message.content == b.choices[0].message.content
    state = srv.server.state
    settings = state.settings
    try:
        state.settings = dataclasses.replace(settings, max_body_bytes=1000, api_key="sekrit")
        r = httpx.post(url, json={"model": srv.model, "messages": HELLO})
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
        assert httpx.get(srv.url + "/v1/models").status_code == 401
        assert httpx.get(srv.url + "/health").status_code == 200  # no key needed
        auth = {"authorization": "Bearer sekrit"}
        r = httpx.post(url, json={"model": srv.model, "messages": HELLO, "pad": "x" * 2000},
                       headers=auth)  # fmt: skip
        assert r.status_code == 413 and r.json()["error"]["code"] == "body_too_large"
        ok = srv.client(default_headers=auth).chat.completions.create(
            model=srv.model, messages=HELLO, max_tokens=1
        )
        assert ok.usage.completion_tokens == 1
    finally:
        state.settings = settings
    with pytest.raises(openai.NotFoundError):
        srv.client().chat.completions.create(model="nope", messages=HELLO)

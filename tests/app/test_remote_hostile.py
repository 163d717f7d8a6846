"""Issue 34 (5): the attached-server client against a hostile server on loopback.

A real HTTP server (the standard library's, on a port of its own) answers the paths
`RemoteEngine` asks with what a broken or hostile server could send: strings where
numbers belong in /v1/stats (was a TypeError in the engine panel), a byte every half
second (was "attaching" for ever: a per-read timeout never fires), an endless stream
that ignores max_tokens (grew without bound until Esc), malformed model cards and
chunks (was Python's own "'str' object has no attribute 'get'"). Each is now one line
that says what the server sent, within a deadline, and a reply is cut at the
max_tokens asked. The real RemoteEngine, its threads and sockets; no mocks.
"""

from __future__ import annotations

import json
import queue
import time
from http.server import BaseHTTPRequestHandler

import pytest

from ssdmoe_tui.chat import remote
from ssdmoe_tui.chat.remote import ChatTurn, RemoteEngine
from ssdmoe_tui.engine.run import protocol as P
from ssdmoe_tui.options import SamplingOptions
from ssdmoe_tui.prompting.message import Message
from tests.helpers.hostile_server import (
    DONE,
    LIVE,
    STATS,
    Behaviour,
    Hostile,
    answer,
    chunk,
    event,
)


def trickle(every: float) -> Behaviour:
    """A byte at a time, every `every` seconds, for ever (until the client goes)."""

    def send(h: BaseHTTPRequestHandler) -> None:
        h.wfile.write(b"HTTP/1.1 200 OK\r\n")
        h.wfile.flush()
        try:
            while True:
                h.wfile.write(b"x")
                h.wfile.flush()
                time.sleep(every)
        except OSError:
            return

    return send


def stream(*parts: bytes, endless: bytes | None = None) -> Behaviour:
    def send(h: BaseHTTPRequestHandler) -> None:
        h.send_response(200)
        h.send_header("content-type", "text/event-stream")
        h.end_headers()
        try:
            for p in parts:
                h.wfile.write(p)
                h.wfile.flush()
            t_end = time.monotonic() + 60  # bounded: the test never waits this long
            while endless is not None and time.monotonic() < t_end:
                h.wfile.write(endless)
                h.wfile.flush()
        except OSError:
            return

    return send


class Client:
    """A RemoteEngine whose events land in a queue."""

    def __init__(self, url: str) -> None:
        self.events: queue.Queue = queue.Queue()
        self.engine = RemoteEngine(url, self.events.put)
        self.engine.start()

    def wait(self, kind: type, timeout: float) -> object:
        end = time.monotonic() + timeout
        seen = []
        while time.monotonic() < end:
            try:
                ev = self.events.get(timeout=max(0.0, end - time.monotonic()))
            except queue.Empty:
                break
            seen.append(ev)
            if isinstance(ev, kind):
                return ev
        raise AssertionError(f"no {kind.__name__} within {timeout} s; saw {seen}")

    def ask(self, max_tokens: int = 8) -> None:
        self.engine.submit(
            ChatTurn(
                "r1", (Message("user", "hi"),), sampling=SamplingOptions(max_tokens=max_tokens)
            )
        )


@pytest.fixture
def hostile():
    made: list[Hostile] = []

    def make(**routes: Behaviour) -> Hostile:
        made.append(Hostile({k.replace("_", "/"): v for k, v in routes.items()}))
        return made[-1]

    yield make
    for h in made:
        h.close()


def one_line(message: str, *needles: str) -> None:
    assert "\n" not in message and "Traceback" not in message, message
    assert "object has no attribute" not in message and "NoneType" not in message, message
    for needle in needles:
        assert needle in message, message


ATTACH_CASES = {
    "card not an object": ({"data": ["x"]}, "a model card that is not a JSON object: 'x'"),
    "no models": ({"data": []}, "a model list without models"),
    "a K in words": (
        {"data": [{"id": "m", "ssdmoe": {"default_k": "four"}}]},
        "'default_k' is 'four' (not a whole number >= 0)",
    ),  # fmt: skip
    "a bool as a count": (
        {"data": [{"id": "m", "ssdmoe": {"num_experts": True}}]},
        "'num_experts' is True",
    ),  # fmt: skip
    "not JSON": (b"<html>", "not JSON"),
    "ssdmoe a list": ({"data": [{"id": "m", "ssdmoe": [1]}]}, "'ssdmoe' is [1]"),
}


@pytest.mark.parametrize("case", list(ATTACH_CASES), ids=list(ATTACH_CASES))
def test_a_malformed_model_card_is_one_line_saying_what_was_sent(hostile, case):
    body, needle = ATTACH_CASES[case]
    srv = hostile(_v1_models=answer(body))
    c = Client(srv.url)
    err = c.wait(P.EngineError, 10)
    one_line(err.message, "cannot attach: the server at 127.0.0.1:", " sent ", needle)
    assert err.fatal
    c.engine.shutdown(2)


def test_a_server_that_trickles_a_byte_every_half_second_is_given_up_on(hostile):
    srv = hostile(_v1_models=trickle(0.5))
    c = Client(srv.url)
    t0 = time.monotonic()
    err = c.wait(P.EngineError, 20)
    assert time.monotonic() - t0 < remote.REQUEST_TIMEOUT_S + 3
    one_line(err.message, "too slow", f"within {remote.REQUEST_TIMEOUT_S:.0f} s")
    c.engine.shutdown(2)


def test_stats_with_strings_where_numbers_belong_are_skipped(hostile):
    """Was: a TypeError in the engine panel 0.25 s into a reply. A sample that is not
    one is not posted; the reply goes on."""
    bad = {**STATS, "live": {**LIVE, "decode_tok_s": "fast", "rss_bytes": "lots"}}
    srv = hostile(_v1_stats=answer(bad),
                  _v1_chat_completions=stream(chunk("Hello"), b": keepalive\n\n",
                                              chunk(" there", "stop", ssdmoe={"k": "x"}),
                                              DONE))  # fmt: skip
    # ("k": "x" on the last chunk: a bad extension is a refusal in words, not a crash)
    c = Client(srv.url)
    c.wait(P.ModelLoaded, 10)
    c.ask()
    err = c.wait(P.EngineError, 10)
    one_line(err.message, "sent a chunk ('ssdmoe') whose 'k' is 'x'")
    time.sleep(0.6)  # the poller ran meanwhile
    seen = []
    while not c.events.empty():
        seen.append(c.events.get())
    assert not [e for e in seen if isinstance(e, P.StatsSample)]
    c.engine.shutdown(2)


def test_an_endless_stream_is_cut_at_the_max_tokens_asked(hostile):
    srv = hostile(_v1_chat_completions=stream(chunk("a"), endless=chunk("word ")))
    c = Client(srv.url)
    c.wait(P.ModelLoaded, 10)
    c.ask(max_tokens=20)
    done = c.wait(P.GenerationDone, 20)
    assert done.finish_reason == "length" and done.text.count("word") <= 20, done
    assert done.stats["generated_tokens"] <= 20
    c.engine.shutdown(2)


def test_a_huge_piece_is_cut_too(hostile):
    srv = hostile(_v1_chat_completions=stream(chunk("x" * 100_000), endless=chunk("y")))
    c = Client(srv.url)
    c.wait(P.ModelLoaded, 10)
    c.ask(max_tokens=4)
    done = c.wait(P.GenerationDone, 20)
    assert done.finish_reason == "length" and done.text == "x" * 4 * remote.MAX_TOKEN_CHARS
    c.engine.shutdown(2)


def call_chunk(arguments: str, index: int = 0) -> bytes:
    """A chunk carrying only a piece of a tool call's arguments (OpenAI's streamed shape)."""
    call = {"index": index, "id": "c1", "type": "function",
            "function": {"name": "f", "arguments": arguments}}  # fmt: skip
    c = {"choices": [{"index": 0, "delta": {"tool_calls": [call]}, "finish_reason": None}]}
    return event(json.dumps(c).encode())


def test_endless_tool_call_arguments_are_cut_at_the_max_tokens_asked(hostile):
    """A server that streams a tool call's arguments for ever (no text at all) is cut at
    the max_tokens asked like one streaming text: each piece is at least a token, and a
    cut reply runs no call (its arguments end mid-way)."""
    srv = hostile(_v1_chat_completions=stream(chunk("a"), endless=call_chunk("x" * 100)))
    c = Client(srv.url)
    c.wait(P.ModelLoaded, 10)
    c.ask(max_tokens=20)
    done = c.wait(P.GenerationDone, 20)
    assert done.finish_reason == "length" and done.tool_calls == (), done
    c.engine.shutdown(2)


# A malformed event's data -> what the one line must quote of it.
CHUNK_CASES = {
    "choices a string": (b'{"choices": "x"}', "a chunk whose 'choices' is 'x' (not a list)"),
    "a choice a string": (b'{"choices": ["x"]}', "a chunk whose choice is"),
    "delta a number": (b'{"choices": [{"delta": 3}]}', "'delta' is 3"),
    "content a list": (
        b'{"choices": [{"delta": {"content": [1]}}]}',
        "'content' is [1] (not a text)",
    ),
    "not JSON": (b"{oops", "a chunk that is not JSON"),
    "a list": (b"[1, 2]", "a chunk that is not a JSON object"),
    "usage in words": (
        b'{"choices": [], "usage": {"completion_tokens": "9"}}',
        "'completion_tokens' is '9'",
    ),
    "an error event": (b'{"error": {"message": "boom \\u001b[2J"}}', "boom"),
    # as long as the server's own messages may be (errors.MESSAGE_LIMIT): read whole, not cut
    "a long error event": (
        b'{"error": {"message": "' + b"x" * 440 + b' copy it with --model PATH"}}',
        "copy it with --model PATH",
    ),
}


@pytest.mark.parametrize("case", list(CHUNK_CASES), ids=list(CHUNK_CASES))
def test_a_malformed_chunk_is_one_line_saying_what_was_sent(hostile, case):
    data, needle = CHUNK_CASES[case]
    srv = hostile(_v1_chat_completions=stream(chunk("ok "), event(data), DONE))
    c = Client(srv.url)
    c.wait(P.ModelLoaded, 10)
    c.ask()
    err = c.wait(P.EngineError, 10)
    one_line(err.message, "the server at 127.0.0.1:", needle)
    assert "\x1b" not in err.message
    c.engine.shutdown(2)


def test_a_stream_that_trickles_is_given_up_on(hostile, monkeypatch):
    """A line that never ends (a byte every half second) passes a per-read timeout for
    ever; the per-line deadline ends it."""
    monkeypatch.setattr(remote, "STREAM_TIMEOUT_S", 2.0)

    def slow(h: BaseHTTPRequestHandler) -> None:
        h.send_response(200)
        h.end_headers()
        h.wfile.write(chunk("ok "))
        h.wfile.flush()
        try:
            for _ in range(200):
                h.wfile.write(b"x")
                h.wfile.flush()
                time.sleep(0.5)
        except OSError:
            return

    srv = hostile(_v1_chat_completions=slow)
    c = Client(srv.url)
    c.wait(P.ModelLoaded, 10)
    t0 = time.monotonic()
    c.ask()
    err = c.wait(P.EngineError, 15)
    assert time.monotonic() - t0 < 6
    one_line(err.message, "too slow", "a line of the stream did not come within 2 s")
    c.engine.shutdown(2)

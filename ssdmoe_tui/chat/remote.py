"""The chat's second backend: a running `ssdmoe serve` on this machine, over its HTTP API.

`RemoteEngine` has the in-process engine's client API (`start`, `submit`, `cancel`,
`shutdown`) and posts the same protocol events (`ModelLoaded`, `PhaseChanged`, `Tokens`,
`StatsSample`, `GenerationDone`, `EngineError`), so the app and the controller do not
branch on where the model runs; the one difference is that it takes the chat as
messages (`ChatTurn`), since the server owns the tokenizer and its exact-history prompt
cache. A reply is one streamed `/v1/chat/completions` request (the OpenAI wire format:
SSE `data:` chunks, `: prefill 12/345` progress comments, `[DONE]`); while it runs,
and for a second after, `/v1/stats` is polled 4 times a second (5 s per request at
most) for the engine panel. K travels with each request (`"ssdmoe": {"k": K}`). The server's reasoning
(`reasoning_content`) is put back in a `<think>` block, as the in-process engine
generates it, so the transcript shows it apart. Only the standard library is used (no
HTTP client is a dependency of the app). What the server sends is checked field by field
in `chat/wire.py` before use; every request has a total deadline (`_Watchdog`: the
stats and attach requests 5 s, a reply's head and each of its lines 30 s, the whole
reply 600 s + 1 s per token asked), and a reply is cut at the `max_tokens` asked.
"""

from __future__ import annotations

import http.client
import json
import queue
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any
from urllib.parse import urlsplit

from ssdmoe_tui.chat import wire
from ssdmoe_tui.chat.tool_overflow import results_past_context
from ssdmoe_tui.chat.wire import BadReply, error_code, error_message
from ssdmoe_tui.engine.run import protocol as P
from ssdmoe_tui.options import SamplingOptions, server_url
from ssdmoe_tui.prompting.message import Message

POLL_S = 0.25  # /v1/stats while a reply runs
TAIL_S = 1.0  # and for this long after it
REQUEST_TIMEOUT_S = 5.0  # attach and stats requests: the whole request, not one read
STREAM_TIMEOUT_S = 30.0  # the server speaks at least every second while a request lives:
# the answer's head and then every SSE line must come whole within this
STREAM_BASE_S = 600.0  # a whole streamed reply: this (a long prefill) ...
STREAM_PER_TOKEN_S = 1.0  # ... plus this per token asked
MAX_LINE = 1 << 20  # one SSE line
MAX_BODY = 1 << 20  # a JSON answer (model card, stats, an error)
MAX_TOKEN_CHARS = 256  # a reply longer than max_tokens x this was not max_tokens tokens


@dataclass(frozen=True)
class ChatTurn:
    """One reply asked of a server: the chat so far (system prompt first, the new user
    message last) and this conversation's generation settings."""

    request_id: str
    messages: tuple[Message, ...]
    sampling: SamplingOptions = field(default_factory=SamplingOptions)
    k: int | None = None
    thinking: bool = True
    tools: tuple[dict, ...] = ()  # the MCP tools offered, as OpenAI's `tools`
    speculate: str = "off"  # the server's ssdmoe.speculate


class ServerError(Exception):
    """The server answered with an error status; the message is its own, `code` the
    envelope's (`context_length_exceeded`...; "" when none)."""

    def __init__(self, status: int, message: str, code: str = "") -> None:
        super().__init__(message)
        self.status = status
        self.code = code


class DeadlinePassed(TimeoutError):
    """A request did not finish within its total deadline (`_Watchdog`)."""


class _Watchdog:
    """A request's total deadline: past it, the connection's socket is shut, which wakes
    the read blocked on it. A per-read timeout alone lets a server that sends a byte
    every 2 s hold a request for ever; this one cannot be stretched. One thread per
    request, checking a few times a second."""

    def __init__(self, conn: http.client.HTTPConnection, seconds: float, what: str) -> None:
        self.conn = conn
        self.what = what  # "the answer", for the message
        self.seconds = seconds
        self.deadline = time.monotonic() + seconds
        self.expired = False
        self.sock: socket.socket | None = None  # once connected (see `connect`)
        self._done = threading.Event()
        threading.Thread(target=self._watch, name="ssdmoe-remote-deadline", daemon=True).start()

    def connect(self) -> None:
        """Connect now and keep the socket: http.client hands it to a response that
        reads until the connection closes and forgets it (`conn.sock` is None then)."""
        self.conn.connect()
        self.sock = self.conn.sock

    def extend(self, seconds: float, limit: float, what: str) -> None:
        """The next part (an SSE line) must come within `seconds`, never past `limit`."""
        self.seconds, self.what = seconds, what
        self.deadline = min(time.monotonic() + seconds, limit)

    def _watch(self) -> None:
        while not self._done.wait(0.1):
            if time.monotonic() >= self.deadline:
                self.expired = True
                sock = self.sock or self.conn.sock
                if sock is not None:
                    try:
                        sock.shutdown(socket.SHUT_RDWR)
                    except OSError:
                        pass
                return

    def check(self, e: BaseException | None = None) -> None:
        """Raise DeadlinePassed if the deadline is why a read failed."""
        if self.expired:
            raise DeadlinePassed(f"{self.what} did not come within {self.seconds:.0f} s") from e

    def close(self) -> None:
        self._done.set()


class _Reply:
    """One streamed reply's text as the app shows it: the reasoning inside a think block."""

    def __init__(self) -> None:
        self.parts: list[str] = []
        self.thinking = False  # inside the block now
        self.calls: dict[int, dict[str, str]] = {}  # index -> {"id", "name", "arguments"}
        self.call_chars = 0  # the calls' argument text so far (counts toward the cap)

    def call_piece(self, index: int, call_id: str, name: str, arguments: str) -> None:
        call = self.calls.setdefault(index, {"id": "", "name": "", "arguments": ""})
        call["id"] = call_id or call["id"]
        call["name"] = name or call["name"]
        call["arguments"] += arguments
        self.call_chars += len(arguments)

    def tool_calls(self) -> tuple[dict[str, str], ...]:
        return tuple(c for _, c in sorted(self.calls.items()) if c["name"])

    def piece(self, reasoning: str, content: str) -> str:
        out = ""
        if reasoning:
            if not self.thinking:
                out += "<think>\n"
                self.thinking = True
            out += str(reasoning)
        if content:
            if self.thinking:
                out += "\n</think>\n\n"
                self.thinking = False
            out += str(content)
        self.parts.append(out)
        return out

    def cut(self, cap: int, pieces: int) -> str:
        """Keep of the last piece only what fits `cap` tokens' text (none of it if it is
        past the `cap`-th piece); returns what is left of it."""
        last = self.parts.pop()
        room = max(0, cap * MAX_TOKEN_CHARS - len(self.text))
        self.parts.append(last[:room] if pieces <= cap else "")
        return self.parts[-1]

    @property
    def text(self) -> str:
        return "".join(self.parts)


class RemoteEngine:
    """A `ssdmoe serve` at `url` as the chat's engine (`protocol.EngineClient`; see the
    module docstring)."""

    takes_messages = True  # the controller sends ChatTurn, not token ids

    def __init__(
        self, url: str, post: Callable[[object], None], *, api_key: str | None = None
    ) -> None:
        self.url = server_url(url, "server")  # a BadValueError (a ValueError) if not one
        parts = urlsplit(self.url)
        self.where = parts.netloc  # "127.0.0.1:8080", for messages
        self._host, self._port = parts.hostname, parts.port
        self._post = post
        self._api_key = api_key
        self._queue: queue.Queue[ChatTurn | None] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._cancel = threading.Event()
        self._replying = threading.Event()  # the poller runs while set
        self._closed = threading.Event()
        self._conn: http.client.HTTPConnection | None = None
        self._watchdog: _Watchdog | None = None  # the reply's (it keeps its socket)
        self._tail_until = 0.0  # poll until then after a reply
        self.info: P.ModelInfo | None = None
        self.k: int | None = None

    # ------------------------------------------------------------------ client API

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._main, name="ssdmoe-remote", daemon=True)
            self._thread.start()
            threading.Thread(target=self._poll, name="ssdmoe-remote-stats", daemon=True).start()

    def submit(self, command: object) -> None:
        if isinstance(command, P.SetK):
            self.k = command.k  # the next request carries it (the server takes K per request)
        elif isinstance(command, ChatTurn):
            self._cancel.clear()
            self._queue.put(command)
        elif isinstance(command, (P.LoadModel, P.SetExpertCache)):
            self._emit(
                P.EngineError(
                    f"the server at {self.where} serves its own model and expert cache; "
                    "F4 picks a model for this app instead"
                )
            )

    def cancel(self, request_id: str | None = None) -> None:
        """Stop the reply in flight: its connection is closed (the server stops it). One
        reply runs at a time, so a request_id names that one."""
        self._cancel.set()
        self._drop_connection()

    def shutdown(self, timeout: float = 5.0) -> None:
        self._closed.set()
        self.cancel()
        self._queue.put(None)
        if self._thread is not None:
            self._thread.join(timeout)

    # ------------------------------------------------------------------ HTTP

    def _headers(self) -> dict[str, str]:
        headers = {"Accept": "application/json"}
        if self._api_key:
            headers["Authorization"] = f"Bearer {self._api_key}"
        return headers

    def _get(self, path: str) -> Any:
        """The JSON answer to GET `path` (unchecked: `wire` checks it), whole within
        REQUEST_TIMEOUT_S."""
        conn = http.client.HTTPConnection(self._host, self._port, timeout=REQUEST_TIMEOUT_S)
        watchdog = _Watchdog(conn, REQUEST_TIMEOUT_S, f"the answer to {path}")
        try:
            try:
                watchdog.connect()
                conn.request("GET", path, headers=self._headers())
                resp = conn.getresponse()
                body = resp.read(MAX_BODY)
            except (OSError, http.client.HTTPException) as e:
                watchdog.check(e)
                raise
            watchdog.check()
            if resp.status != 200:
                raise ServerError(resp.status, error_message(body))
            return wire.parse_json(body, f"an answer to {path}")
        finally:
            watchdog.close()
            conn.close()

    def _drop_connection(self) -> None:
        conn, watchdog = self._conn, self._watchdog
        sock = watchdog.sock if watchdog is not None else None
        sock = sock or (conn.sock if conn is not None else None)
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)  # wakes the reader blocked on it
            except OSError:
                pass

    def _request_body(self, turn: ChatTurn) -> dict[str, Any]:
        """The chat completions request a turn is: its messages, sampling, thinking
        switch, tools, and the K and speculation it asks for (`ssdmoe`)."""
        body: dict[str, Any] = {
            "model": self.info.name if self.info else "",
            "messages": [m.for_template() for m in turn.messages],
            "stream": True,
            "stream_options": {"include_usage": True},
            **turn.sampling.as_request(),
            "chat_template_kwargs": {"enable_thinking": turn.thinking},
        }
        if turn.tools:
            body["tools"] = list(turn.tools)
        k = turn.k if turn.k is not None else self.k
        ext: dict = {"k": k} if k is not None else {}
        if turn.speculate != "off":
            ext["speculate"] = turn.speculate
        if ext:
            body["ssdmoe"] = ext
        return body

    def _events(self, turn: ChatTurn) -> Iterator[wire.Chunk | str]:
        """The reply's SSE events: checked `data:` chunks (`wire.chunk`), or the text of a
        progress comment. Raises ServerError (an error status), BadReply (a chunk this
        app cannot use), DeadlinePassed (the head or a line did not come whole within
        STREAM_TIMEOUT_S, or the whole reply within its total), OSError / HTTPException
        (the connection broke) or EOFError (the stream ended before `[DONE]`)."""
        body = self._request_body(turn)
        conn = http.client.HTTPConnection(self._host, self._port, timeout=STREAM_TIMEOUT_S)
        self._conn = conn
        total = STREAM_BASE_S + STREAM_PER_TOKEN_S * max(turn.sampling.max_tokens, 0)
        limit = time.monotonic() + total
        watchdog = _Watchdog(conn, STREAM_TIMEOUT_S, "the answer's head")
        self._watchdog = watchdog
        try:
            try:
                watchdog.connect()
                headers = {**self._headers(), "Content-Type": "application/json"}
                conn.request("POST", "/v1/chat/completions", json.dumps(body).encode(), headers)
                resp = conn.getresponse()
                if resp.status != 200:
                    body = resp.read(MAX_BODY)
                    raise ServerError(resp.status, error_message(body), error_code(body))
                while True:
                    if self._cancel.is_set():  # stopped before the socket could be shut
                        raise EOFError("stopped")
                    watchdog.extend(STREAM_TIMEOUT_S, limit, "a line of the stream")
                    if time.monotonic() >= limit:
                        watchdog.seconds, watchdog.what = total, "the whole reply"
                        watchdog.expired = True
                        watchdog.check()
                    line = resp.readline(MAX_LINE)
                    watchdog.check()
                    if not line:
                        raise EOFError("the stream ended before the reply did")
                    text = line.decode("utf-8", "replace").strip()
                    if text.startswith(":"):
                        yield text[1:].strip()
                    elif text.startswith("data:"):
                        payload = text[5:].strip()
                        if payload == "[DONE]":
                            return
                        yield wire.chunk(payload)
            except (OSError, EOFError, http.client.HTTPException) as e:
                if not isinstance(e, DeadlinePassed):
                    watchdog.check(e)
                raise
        finally:
            watchdog.close()
            self._conn = self._watchdog = None
            conn.close()

    # ------------------------------------------------------------------ worker threads

    def _emit(self, event: object) -> None:
        try:
            self._post(event)
        except Exception:  # noqa: BLE001 - a closing app must not kill the thread
            pass

    def _main(self) -> None:
        if not self._attach():
            return
        while True:
            turn = self._queue.get()
            if turn is None or self._closed.is_set():
                return
            self._replying.set()
            try:
                self._reply(turn)
            finally:
                self._tail_until = time.monotonic() + TAIL_S  # the turn's last figures
                self._replying.clear()
                self._emit(P.PhaseChanged("idle"))

    def _attach(self) -> bool:
        self._emit(P.PhaseChanged("loading", detail=f"attaching to the server at {self.where}"))
        try:
            info = wire.model_info(self.url, self._get("/v1/models"), self._get("/v1/stats"))
        except Exception as e:  # noqa: BLE001 - one line: the server cannot be used
            self._emit(P.EngineError(f"cannot attach: {self._why(e)}", fatal=True))
            self._emit(P.PhaseChanged("idle"))
            return False
        self.info = info
        self.k = self.info.k
        self._emit(P.ModelLoaded(self.info))
        self._emit(P.PhaseChanged("idle"))
        return True

    def _why(self, e: BaseException, when: str = "") -> str:
        """One line for a failed request: the server's refusal, or how it went away."""
        if isinstance(e, ServerError):
            return f"the server at {self.where} refused ({e.status}): {e}"
        if isinstance(e, BadReply):
            return f"the server at {self.where} sent {e}"
        if isinstance(e, DeadlinePassed):
            return f"the server at {self.where} is too slow{when}: {e}"
        if isinstance(e, (ConnectionRefusedError, socket.gaierror)):
            return f"nothing answers at {self.where} (has the server stopped?)"
        if isinstance(e, TimeoutError):
            reason = f"silent for {STREAM_TIMEOUT_S:.0f} s"
        elif isinstance(e, (EOFError, http.client.IncompleteRead)):
            reason = "the stream ended early"
        elif isinstance(e, ConnectionResetError):
            reason = "connection reset"
        elif isinstance(e, OSError):
            reason = e.strerror or str(e) or type(e).__name__
        else:
            reason = str(e) or type(e).__name__
        return f"the server at {self.where} stopped answering{when} ({reason})"

    def _reply(self, turn: ChatTurn) -> None:
        reply = _Reply()
        final: dict[str, Any] = {}
        pieces = 0  # chunks that carried text: each is at least one token
        try:
            for event in self._events(turn):
                if isinstance(event, str):
                    self._progress(event)
                    continue
                if event.error is not None:
                    raise ServerError(500, event.error)
                if event.completion_tokens is not None:
                    final["tokens"] = event.completion_tokens
                for piece in event.tool_calls:
                    reply.call_piece(*piece)
                text = reply.piece(event.reasoning, event.content)
                if text or event.tool_calls:  # a call's piece is a token too
                    pieces += 1
                    over = self._over_cap(turn, pieces, reply)
                    if over:  # what fits the cap is kept, nothing past it
                        text = reply.cut(max(turn.sampling.max_tokens, 1), pieces)
                        reply.calls.clear()  # a cut call's arguments end mid-way: none runs
                    if text and not final.get("decoding"):
                        final["decoding"] = True
                        self._emit(P.PhaseChanged("decoding"))
                    if text:
                        self._emit(P.Tokens(turn.request_id, text, ()))
                    if over:
                        final["finish"] = "length"
                        break
                if event.finish:
                    final["finish"], final["k"], final["stats"] = event.finish, event.k, event.stats
            done = replace(self._done(turn, reply.text, final), tool_calls=reply.tool_calls())
        except Exception as e:  # noqa: BLE001 - every failure is one line
            self._failed(turn, reply, e)
            return
        self._emit(done)

    def _over_cap(self, turn: ChatTurn, pieces: int, reply: _Reply) -> bool:
        """Whether the reply has gone past the `max_tokens` asked (more text or tool-call
        chunks than tokens, or more text and call arguments than that many tokens can
        hold): then it is cut there (a cut reply keeps no tool call), the
        connection closed, and one notice says so; a server that ignores max_tokens
        cannot grow a reply without bound."""
        cap = max(turn.sampling.max_tokens, 1)
        if pieces <= cap and len(reply.text) + reply.call_chars <= cap * MAX_TOKEN_CHARS:
            return False
        self._drop_connection()
        self._emit(
            P.Notice(
                f"the server at {self.where} sent more than the {turn.sampling.max_tokens} tokens "
                "asked: the reply is cut there"
            )
        )
        return True

    def _progress(self, comment: str) -> None:
        """`prefill 12/345` comments move the app's prefill progress."""
        words = comment.split()
        if len(words) == 2 and words[0] == "prefill" and "/" in words[1]:
            done, _, total = words[1].partition("/")
            if done.isdigit() and total.isdigit():
                self._emit(P.PhaseChanged("prefill", int(done), int(total)))

    def _done(self, turn: ChatTurn, text: str, final: dict[str, Any]) -> P.GenerationDone:
        stats: dict[str, Any] = dict(final.get("stats") or {})
        n = final.get("tokens")
        if n is None:
            counted = stats.get("generated_tokens")
            n = counted if type(counted) is int and counted >= 0 else 0
        n = min(n, max(turn.sampling.max_tokens, 0))
        stats["generated_tokens"] = n
        k = final.get("k")
        return P.GenerationDone(
            turn.request_id,
            text,
            (),
            (),
            "length" if final.get("finish") == "length" else "stop",
            (k,) * n if k is not None else (),
            stats,
        )

    def _failed(self, turn: ChatTurn, reply: _Reply, e: BaseException) -> None:
        """Stopped by the user: a stopped reply. Refused: the server's message, the turn
        given back. Gone mid-reply: what arrived is kept (a stopped reply) and one line
        says the server is gone (no model is loaded then)."""
        if self._cancel.is_set():
            self._emit(P.GenerationDone(turn.request_id, reply.text, (), (), "cancelled", ()))
            return
        if isinstance(e, (ServerError, BadReply)):  # it answers, but not with a reply
            why = self._why(e)
            if isinstance(e, ServerError) and e.code == "context_length_exceeded":
                why = results_past_context(turn.messages, str(e)) or why  # a tool's doing
            self._emit(P.EngineError(why, request_id=turn.request_id))
            return
        if reply.text:
            self._emit(P.GenerationDone(turn.request_id, reply.text, (), (), "cancelled", ()))
            gone = self._why(e, " mid-reply")
            self._emit(P.EngineError(f"{gone}; what arrived is kept", fatal=True))
        else:
            self._emit(P.EngineError(self._why(e), request_id=turn.request_id, fatal=True))

    def _poll(self) -> None:
        """The engine panel's figures: `/v1/stats` while a reply runs, and for a second
        after it (the server posts its turn's last sample as the reply ends)."""
        while not self._closed.is_set():
            if not (self._replying.is_set() or time.monotonic() < self._tail_until):
                self._replying.wait(POLL_S)
                continue
            started = time.monotonic()
            self._poll_once()
            self._closed.wait(max(0.0, POLL_S - (time.monotonic() - started)))

    def _poll_once(self) -> None:
        try:
            sample = wire.stats_sample(self._get("/v1/stats"))
        except Exception:  # noqa: BLE001 - a bad answer is skipped; the reply says what broke
            return
        if sample is not None:
            self._emit(sample)

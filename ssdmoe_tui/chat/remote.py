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
HTTP client is a dependency of the app); every read has a timeout.
"""

from __future__ import annotations

import http.client
import json
import queue
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, fields
from typing import Any
from urllib.parse import urlsplit

from ssdmoe_tui.engine.run import protocol as P
from ssdmoe_tui.options import server_url
from ssdmoe_tui.prompting.message import Message

POLL_S = 0.25  # /v1/stats while a reply runs
TAIL_S = 1.0  # and for this long after it
REQUEST_TIMEOUT_S = 5.0  # attach and stats requests
STREAM_TIMEOUT_S = 30.0  # the server speaks at least every second while a request lives
MAX_LINE = 1 << 20  # one SSE line
MAX_BODY = 1 << 20  # a JSON answer (model card, stats, an error)


@dataclass(frozen=True)
class ChatTurn:
    """One reply asked of a server: the chat so far (system prompt first, the new user
    message last) and this conversation's generation settings."""

    request_id: str
    messages: tuple[Message, ...]
    max_tokens: int = 512
    temp: float = 0.0
    top_p: float = 0.0
    k: int | None = None
    thinking: bool = True


class ServerError(Exception):
    """The server answered with an error status; the message is its own."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def error_message(body: bytes) -> str:
    """The `message` of an OpenAI (or Anthropic) error envelope, else the body's start."""
    try:
        data = json.loads(body)
    except ValueError:
        return body[:200].decode("utf-8", "replace").strip() or "no reason given"
    err = data.get("error") if isinstance(data, dict) else None
    if isinstance(err, dict) and err.get("message"):
        return str(err["message"])
    return str(data)[:200]


def sample_of(live: dict[str, Any]) -> P.StatsSample | None:
    """`/v1/stats`' `live` (the server's last StatsSample) as one; None if it is not one."""
    try:
        return P.StatsSample(
            **{f.name: live[f.name] for f in fields(P.StatsSample) if f.name in live}
        )
    except TypeError:  # a field missing: not a sample this app knows
        return None


def model_info(url: str, card: dict[str, Any], stats: dict[str, Any]) -> P.ModelInfo:
    """The served model as the app's panels know a model (`/v1/models`' card and
    `/v1/stats`' engine); what the server does not say is 0 or ""."""
    ext = card.get("ssdmoe") or {}
    engine = stats.get("engine") or {}
    k = int(ext.get("default_k") or ext.get("trained_k") or 1)
    return P.ModelInfo(
        name=str(card.get("id") or "?"),
        path=url,
        model_type=str(ext.get("model_type") or "?"),
        num_layers=int(ext.get("moe_layers") or 0),
        num_experts=int(ext.get("num_experts") or 0),
        trained_k=int(ext.get("trained_k") or k),
        k=k,
        prefill_k=k,
        max_context=int(ext.get("max_context") or 0),
        device=str(engine.get("device") or "?"),
        dtype=str(engine.get("dtype") or "?"),
        expert_bytes=int(ext.get("expert_bytes") or 0),
        resident_bytes=int(engine.get("resident_bytes") or 0),
        expert_cache_budget=int(engine.get("expert_cache_budget_bytes") or 0),
        reader=str(engine.get("reader") or "?"),
        fingerprint="",
        hybrid=False,
        expert_source=str(engine.get("expert_source") or "shards"),
        server=url,
    )


class _Reply:
    """One streamed reply's text as the app shows it: the reasoning inside a think block."""

    def __init__(self) -> None:
        self.parts: list[str] = []
        self.thinking = False  # inside the block now

    def piece(self, delta: dict[str, Any]) -> str:
        out = ""
        reasoning, content = delta.get("reasoning_content"), delta.get("content")
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

    @property
    def text(self) -> str:
        return "".join(self.parts)


class RemoteEngine:
    """A `ssdmoe serve` at `url` as the chat's engine (see the module docstring)."""

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

    def cancel(self) -> None:
        """Stop the reply in flight: its connection is closed (the server stops it)."""
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

    def _get(self, path: str) -> dict[str, Any]:
        conn = http.client.HTTPConnection(self._host, self._port, timeout=REQUEST_TIMEOUT_S)
        try:
            conn.request("GET", path, headers=self._headers())
            resp = conn.getresponse()
            body = resp.read(MAX_BODY)
            if resp.status != 200:
                raise ServerError(resp.status, error_message(body))
            data = json.loads(body)
            return data if isinstance(data, dict) else {}
        finally:
            conn.close()

    def _drop_connection(self) -> None:
        conn = self._conn
        sock = conn.sock if conn is not None else None
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)  # wakes the reader blocked on it
            except OSError:
                pass

    def _events(self, turn: ChatTurn) -> Iterator[dict[str, Any] | str]:
        """The reply's SSE events: parsed `data:` chunks, or the text of a progress
        comment. Raises ServerError (an error status), OSError / HTTPException (the
        connection broke) or EOFError (the stream ended before `[DONE]`)."""
        body: dict[str, Any] = {
            "model": self.info.name if self.info else "",
            "messages": [{"role": m.role, "content": m.content} for m in turn.messages],
            "stream": True,
            "stream_options": {"include_usage": True},
            "max_tokens": turn.max_tokens,
            "temperature": turn.temp,
            "chat_template_kwargs": {"enable_thinking": turn.thinking},
        }
        if 0 < turn.top_p < 1:
            body["top_p"] = turn.top_p
        k = turn.k if turn.k is not None else self.k
        if k is not None:
            body["ssdmoe"] = {"k": k}
        conn = http.client.HTTPConnection(self._host, self._port, timeout=STREAM_TIMEOUT_S)
        self._conn = conn
        try:
            headers = {**self._headers(), "Content-Type": "application/json"}
            conn.request("POST", "/v1/chat/completions", json.dumps(body).encode(), headers)
            resp = conn.getresponse()
            if resp.status != 200:
                raise ServerError(resp.status, error_message(resp.read(MAX_BODY)))
            while True:
                if self._cancel.is_set():  # stopped before the socket could be shut
                    raise EOFError("stopped")
                line = resp.readline(MAX_LINE)
                if not line:
                    raise EOFError("the stream ended before the reply did")
                text = line.decode("utf-8", "replace").strip()
                if text.startswith(":"):
                    yield text[1:].strip()
                elif text.startswith("data:"):
                    payload = text[5:].strip()
                    if payload == "[DONE]":
                        return
                    chunk = json.loads(payload)
                    if isinstance(chunk, dict):
                        yield chunk
        finally:
            self._conn = None
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
            models = self._get("/v1/models")
            cards = models.get("data") or [{}]
            stats = self._get("/v1/stats")
            # a card that is not one (not a dict, a K that is no number): the same line
            info = model_info(self.url, cards[0], stats)
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
        usage: dict[str, Any] = {}
        try:
            for event in self._events(turn):
                if isinstance(event, str):
                    self._progress(event)
                    continue
                if "error" in event:
                    message = error_message(json.dumps(event).encode())
                    raise ServerError(500, message)
                if event.get("usage"):
                    usage = event["usage"]
                for choice in event.get("choices") or ():
                    text = reply.piece(choice.get("delta") or {})
                    if text:
                        if not final.get("decoding"):
                            final["decoding"] = True
                            self._emit(P.PhaseChanged("decoding"))
                        self._emit(P.Tokens(turn.request_id, text, ()))
                    if choice.get("finish_reason"):
                        final["finish"] = choice["finish_reason"]
                        final["ext"] = event.get("ssdmoe") or {}
            done = self._done(turn, reply.text, final, usage)  # a malformed usage: one line
        except Exception as e:  # noqa: BLE001 - every failure is one line
            self._failed(turn, reply, e)
            return
        self._emit(done)

    def _progress(self, comment: str) -> None:
        """`prefill 12/345` comments move the app's prefill progress."""
        words = comment.split()
        if len(words) == 2 and words[0] == "prefill" and "/" in words[1]:
            done, _, total = words[1].partition("/")
            if done.isdigit() and total.isdigit():
                self._emit(P.PhaseChanged("prefill", int(done), int(total)))

    def _done(
        self, turn: ChatTurn, text: str, final: dict[str, Any], usage: dict[str, Any]
    ) -> P.GenerationDone:
        ext = final.get("ext") or {}
        stats = dict(ext.get("stats") or {})
        n = int(usage.get("completion_tokens") or stats.get("generated_tokens") or 0)
        stats["generated_tokens"] = n
        k = ext.get("k")
        reason = final.get("finish")
        return P.GenerationDone(
            turn.request_id,
            text,
            (),
            (),
            "length" if reason == "length" else "stop",
            (int(k),) * n if isinstance(k, int) else (),
            stats,
        )

    def _failed(self, turn: ChatTurn, reply: _Reply, e: BaseException) -> None:
        """Stopped by the user: a stopped reply. Refused: the server's message, the turn
        given back. Gone mid-reply: what arrived is kept (a stopped reply) and one line
        says the server is gone (no model is loaded then)."""
        if self._cancel.is_set():
            self._emit(P.GenerationDone(turn.request_id, reply.text, (), (), "cancelled", ()))
            return
        if isinstance(e, ServerError):
            self._emit(P.EngineError(self._why(e), request_id=turn.request_id))
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
            live = self._get("/v1/stats").get("live")
        except Exception:  # noqa: BLE001 - the reply's own request says what went wrong
            return
        sample = sample_of(live) if isinstance(live, dict) else None
        if sample is not None:
            self._emit(sample)

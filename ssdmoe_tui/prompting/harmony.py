"""gpt-oss's harmony format, read from its own tokens as the reply streams in.

A harmony reply is a run of messages, `<|start|>{header}<|message|>{body}<|end|>`,
the first one's `<|start|>assistant` already in the generation prompt. The header names
the channel (`<|channel|>analysis`: reasoning; `final`: the answer; `commentary`: a
preamble the user sees, or, with a recipient `to=functions.NAME`, a tool call whose
body is its JSON arguments) and may constrain the body (`<|constrain|>json`). The reply
ends at `<|return|>` (answered) or `<|call|>` (a tool call waits for its result).

Parsed here rather than by the official `openai-harmony` package: that package installs,
but loads its encoding by downloading it at run time, which fails offline (checked with
0.0.8: "error downloading or loading vocab file"), and a user may well be offline. The
parser needs only the template's marker strings, which the tokenizer decodes as text.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from ssdmoe_tui.prompting.markers import held

START, END, MESSAGE = "<|start|>", "<|end|>", "<|message|>"
CHANNEL, CONSTRAIN = "<|channel|>", "<|constrain|>"
CALL, RETURN = "<|call|>", "<|return|>"
MARKERS = (START, END, MESSAGE, CHANNEL, CONSTRAIN, CALL, RETURN)
BODY_ENDS = (END, CALL, RETURN, START)  # START: a message the model did not close
# A header is a few words (`<|channel|>commentary to=functions.x <|constrain|>json`);
# text that runs longer without `<|message|>` is not harmony: it is passed on as text.
HEADER_MAX = 512
FUNCTIONS = "functions."
_TO = re.compile(r"\bto=(\S+)")
_THINK = re.compile(r"\s*<think>(.*?)</think>\s*", re.DOTALL)


@dataclass(frozen=True)
class Header:
    role: str  # "assistant" (a generated reply), "functions.NAME" (a tool's result), ...
    channel: str  # "analysis", "commentary", "final" ("" when none was named)
    recipient: str = ""  # "functions.get_weather" for a tool call
    constrain: str = ""  # "json"

    @property
    def is_call(self) -> bool:
        return bool(self.recipient) and self.role == "assistant"


def parse_header(text: str) -> Header:
    """The header between a message's start and `<|message|>`; the recipient may sit
    with the role (`<|start|>assistant to=functions.f<|channel|>commentary`, as the
    template renders past calls) or after the channel (as the model usually writes it)."""
    text = text.rpartition(START)[2]  # what came before the message's start is not its own
    role_part, _, channel_part = text.partition(CHANNEL)
    constrain = ""
    if CONSTRAIN in channel_part:
        channel_part, _, constrain = channel_part.partition(CONSTRAIN)
    elif CONSTRAIN in role_part:
        role_part, _, constrain = role_part.partition(CONSTRAIN)
    found = _TO.search(role_part) or _TO.search(channel_part)
    recipient = found.group(1) if found else ""
    role_words = [w for w in role_part.split() if not w.startswith("to=")]
    channel_words = [w for w in channel_part.split() if not w.startswith("to=")]
    return Header(
        role=role_words[0] if role_words else "assistant",
        channel=channel_words[0] if channel_words else "",
        recipient=recipient,
        constrain=constrain.strip(),
    )


@dataclass(frozen=True)
class Event:
    """What the parser found: reasoning or content text (streamed as it comes), or a
    whole tool-call message (`header.recipient`, `text` its body) once it has ended."""

    kind: Literal["reasoning", "content", "call"]
    text: str
    header: Header | None = None
    first: bool = False  # the first piece of its message (paragraphs stay apart)


class HarmonyParser:
    """Streaming: `feed(text)` returns the events that text completes; a piece that may
    be the start of a marker is held back until the next one decides it. `final`: the
    reply ended (a message left open is closed as it stands)."""

    def __init__(self) -> None:
        self.buf = ""
        self.state: Literal["header", "body", "text", "done"] = "header"
        self.header: Header | None = None
        self.call_body: list[str] = []
        self.ended = False  # `<|return|>` or `<|call|>` came as text: the reply is over
        self.in_analysis = False
        self.fresh = False  # no body text of the open message sent yet

    def feed(self, text: str, final: bool = False) -> list[Event]:
        out: list[Event] = []
        self.buf += text
        while self._step(out, final):
            pass
        return out

    def _step(self, out: list[Event], final: bool) -> bool:
        """One move of the state machine; False when it needs more text."""
        if self.state == "done":
            self.buf = ""  # after the model's own end of reply: not part of it
            return False
        if self.state == "text":
            self._emit_text(out)
            return False
        if self.state == "header":
            return self._header(out, final)
        return self._body(out, final)

    def _header(self, out: list[Event], final: bool) -> bool:
        at = self.buf.find(MESSAGE)
        if at < 0:
            if len(self.buf) > HEADER_MAX:  # not harmony: pass it on as text
                self.state = "text"
                self._emit_text(out)
            elif final:  # a header the reply was cut in carries no text; anything else is
                if not self.buf.lstrip().startswith((START, CHANNEL)):
                    self._emit_text(out)
                self.buf = ""
            return False
        self.header = parse_header(self.buf[:at])
        self.buf = self.buf[at + len(MESSAGE) :]
        if self.header.role != "assistant":  # a tool's result: the model's turn is over
            self.state, self.ended = "done", True
            return False
        self.state = "body"
        self.in_analysis = self.header.channel == "analysis"
        self.fresh = True
        return True

    def _body(self, out: list[Event], final: bool) -> bool:
        hits = [(i, m) for m in BODY_ENDS if (i := self.buf.find(m)) >= 0]
        if not hits:
            keep = 0 if final else held(self.buf, BODY_ENDS)
            self._emit_body(out, self.buf[: len(self.buf) - keep])
            self.buf = self.buf[len(self.buf) - keep :]
            if final:
                self._close(out)
            return False
        at, marker = min(hits)
        self._emit_body(out, self.buf[:at])
        self._close(out)
        if marker == START:
            self.buf = self.buf[at:]
            self.state = "header"
        elif marker == END:
            self.buf = self.buf[at + len(marker) :]
            self.state = "header"
        else:  # <|call|>, <|return|>
            self.buf = self.buf[at + len(marker) :]
            self.state, self.ended = "done", True
        return True

    def _emit_text(self, out: list[Event]) -> None:
        if self.buf:
            out.append(Event("content", self.buf))
        self.buf = ""

    def _emit_body(self, out: list[Event], text: str) -> None:
        if not text:
            return
        assert self.header is not None
        if self.header.is_call:
            self.call_body.append(text)
        else:
            kind = "reasoning" if self.in_analysis else "content"
            out.append(Event(kind, text, first=self.fresh))
        self.fresh = False

    def _close(self, out: list[Event]) -> None:
        header, self.header = self.header, None
        self.in_analysis = False
        if header is not None and header.is_call:
            out.append(Event("call", "".join(self.call_body), header))
        self.call_body = []


def tool_name(recipient: str) -> str:
    """The function's name as the client declared it (`functions.get_weather` ->
    `get_weather`); a built-in tool's recipient (`browser.search`) stays whole."""
    return recipient.removeprefix(FUNCTIONS)


def call_arguments(body: str) -> dict[str, Any] | None:
    """A call's JSON arguments as an object (None: not one; `{}` for an empty body)."""
    if not body.strip():
        return {}
    try:
        value = json.loads(body)
    except (ValueError, RecursionError):
        return None
    return value if isinstance(value, dict) else None


def is_harmony_text(text: str) -> bool:
    """A reply as gpt-oss generates it after `<|start|>assistant`: a channel header first."""
    return text.startswith(CHANNEL) or (text.startswith(START) and MESSAGE in text[:HEADER_MAX])


@dataclass(frozen=True)
class Parsed:
    """A whole harmony reply, taken apart."""

    reasoning: str
    content: str
    calls: tuple[tuple[str, str], ...]  # (name, arguments JSON text)
    open_reasoning: bool = False  # (streaming) the text ends inside an analysis message


def parse_reply(text: str, *, final: bool = True) -> Parsed:
    """The reasoning (analysis messages, a blank line between two), the content (final
    and preamble messages) and the tool calls of `text`; `final` False: the reply may
    still grow (a marker cut short is held back, the reasoning may be open). A call whose
    body is not a JSON object stays in the content: nothing the model wrote is lost."""
    parser = HarmonyParser()
    parts: dict[str, list[str]] = {"reasoning": [], "content": []}
    calls: list[tuple[str, str]] = []
    for ev in parser.feed(text, final=final):
        if ev.kind == "call":
            assert ev.header is not None
            args = call_arguments(ev.text)
            if args is None:
                parts["content"].append(ev.text)
            else:
                calls.append((tool_name(ev.header.recipient), json.dumps(args, ensure_ascii=False)))
            continue
        if ev.first and parts[ev.kind]:
            parts[ev.kind].append("\n\n")
        parts[ev.kind].append(ev.text)
    return Parsed(
        "".join(parts["reasoning"]),
        "".join(parts["content"]),
        tuple(calls),
        open_reasoning=parser.in_analysis and not final,
    )


def reasoning_tokens(token_ids: Sequence[int], tokenizer: Any) -> int:
    """How many of a reply's generated tokens belong to its analysis messages (their
    headers and `<|end|>` included): the reasoning count of usage and the app's panel."""
    hf = getattr(tokenizer, "_tokenizer", tokenizer)
    ids = {m: hf.convert_tokens_to_ids(m) for m in (START, MESSAGE, END, CALL, RETURN)}
    count, begin, header_at, analysis = 0, 0, 0, False
    for i, tok in enumerate(token_ids):
        if tok == ids[START]:
            begin, header_at, analysis = i, i, False
        elif tok == ids[MESSAGE]:
            header = hf.decode(list(token_ids[header_at:i]))
            analysis = parse_header(header).channel == "analysis"
        elif tok in (ids[END], ids[CALL], ids[RETURN]):
            if analysis:
                count += i + 1 - begin
            analysis, begin, header_at = False, i + 1, i + 1
    if analysis:  # cut inside an analysis message: all of it so far
        count += len(token_ids) - begin
    return count


def template_message(msg: dict[str, Any]) -> dict[str, Any]:
    """An assistant message whose content is a harmony reply as generated (the app keeps
    the raw text) in the fields gpt-oss's template takes instead: `thinking` (analysis),
    `content` (final), `tool_calls`; the template refuses channel markers in content. A
    `<think>` block first (how the app attached to a server keeps the server's
    reasoning_content) is the thinking too.
    Arguments given as JSON text become objects (the template writes them `|tojson`)."""
    out = dict(msg)
    content = out.get("content")
    think = _THINK.match(content) if isinstance(content, str) else None
    if think and not out.get("thinking"):  # an attached app's form of a server's reasoning
        out["thinking"], out["content"] = think.group(1).strip("\n"), content[think.end() :]
    elif isinstance(content, str) and is_harmony_text(content):
        parsed = parse_reply(content)
        out["content"] = parsed.content
        if parsed.reasoning:
            out["thinking"] = parsed.reasoning
        if parsed.calls and not out.get("tool_calls"):
            out["tool_calls"] = [
                {"id": f"call_{i}", "type": "function",
                 "function": {"name": name, "arguments": args}}
                for i, (name, args) in enumerate(parsed.calls)
            ]  # fmt: skip
    calls = out.get("tool_calls")
    if calls:
        out["tool_calls"] = [_object_arguments(c) for c in calls]
        if out.get("content") and out.get("thinking"):  # the template takes one of the two
            out["content"] = ""
    return out


def _object_arguments(call: dict[str, Any]) -> dict[str, Any]:
    fn = call.get("function")
    if not isinstance(fn, dict) or not isinstance(fn.get("arguments"), str):
        return call
    args = call_arguments(fn["arguments"])
    return {**call, "function": {**fn, "arguments": args if args is not None else fn["arguments"]}}

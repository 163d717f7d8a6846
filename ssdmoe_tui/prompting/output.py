"""The generated text, as a client sees it: stop strings cut, tool calls pulled out.

`OutputFilter.feed(text)` takes the engine's streamed text and returns what can be
sent now: `Content` pieces, and a `Call` as soon as a whole tool-call block has been
generated (so tool calls stream call by call, not after the reply ends). Text that
might be the start of a stop string or of a tool-call marker is held back until the
next piece decides it. A block that does not parse is passed on as text: nothing the
model wrote is lost.

Tool-call formats are mlx-lm's own parsers (`mlx_lm/tool_parsers/`), chosen by mlx-lm
from the chat template when the tokenizer is loaded: Qwen3's JSON inside
`<tool_call>` (`json_tools`), and the XML `<function=..><parameter=..>` form of
Qwen3.5, Qwen3-Coder and Nemotron-3 (`qwen3_coder`). gpt-oss's harmony messages are
read by `prompting/harmony.py` instead (`harmony=True`). Which applies to a model is
decided in one place, `prompting/reply_format.py`.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ssdmoe_tui.prompting import harmony as H
from ssdmoe_tui.prompting.markers import held


@dataclass(frozen=True)
class ToolCall:
    """One tool call: as OutputFilter finds it in a model's reply, and as a client sends it
    back in an assistant message (server/schema.py parses those into this)."""

    id: str
    name: str
    arguments: str  # a JSON text, as OpenAI sends it

    def for_template(self) -> dict:
        """Templates iterate the arguments (`|items`): give them the parsed object."""
        try:
            args: Any = json.loads(self.arguments) if self.arguments.strip() else {}
        except (ValueError, RecursionError):  # not JSON, too many digits, nested too deep
            args = self.arguments
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": args},
        }

    def canonical(self) -> tuple[str, str]:
        """(name, arguments) with the JSON normalized, so a client's re-serialization of
        the same call (spacing, key order) still matches what we sent."""
        try:
            args = json.dumps(json.loads(self.arguments), sort_keys=True, ensure_ascii=False)
        except (ValueError, RecursionError):  # not JSON, too many digits, nested too deep
            args = self.arguments
        return self.name, args


@dataclass(frozen=True)
class ToolFormat:
    start: str
    end: str
    parse: Callable[[str, Any], Any]  # mlx-lm: parse_tool_call(text, tools) -> dict or list
    name: str = ""


@dataclass(frozen=True)
class ThinkFormat:
    start: str  # "<think>"
    end: str  # "</think>"


@dataclass(frozen=True)
class Content:
    text: str


@dataclass(frozen=True)
class Reasoning:
    """Text inside the model's think block: `reasoning_content`, a reasoning item, a
    thinking block, never `content`."""

    text: str


@dataclass(frozen=True)
class Call:
    call: ToolCall


Piece = Content | Reasoning | Call


def think_format_for(tokenizer: Any) -> ThinkFormat | None:
    """The think markers mlx-lm found in the vocabulary (None: the model does not think)."""
    if not getattr(tokenizer, "has_thinking", False):
        return None
    start, end = getattr(tokenizer, "think_start", None), getattr(tokenizer, "think_end", None)
    return ThinkFormat(start, end) if start and end else None


def starts_in_think(tokenizer: Any, prompt: Sequence[int]) -> bool:
    """Whether the generation prompt opens a think block the reply continues (Qwen3.5's
    `<think>\n`): mlx_lm.server's test, on the prompt's tail only (earlier turns'
    think blocks are closed)."""
    if not getattr(tokenizer, "has_thinking", False):
        return False
    tail = list(prompt[-16:])
    return tokenizer.rfind_think_start(tail) > tokenizer.rfind_think_end(tail)


def tool_format_for(tokenizer: Any) -> ToolFormat | None:
    """The tool-call format mlx-lm inferred for this tokenizer (None: no tool calling)."""
    parse = getattr(tokenizer, "tool_parser", None)
    start = getattr(tokenizer, "tool_call_start", None)
    end = getattr(tokenizer, "tool_call_end", None)
    if parse is None or not start or not end:
        return None
    return ToolFormat(start, end, parse, getattr(parse, "__module__", "").rsplit(".", 1)[-1])


def named_format(name: str) -> ToolFormat:
    """A format by mlx-lm parser name ("json_tools", "qwen3_coder", ...)."""
    import importlib

    mod = importlib.import_module(f"mlx_lm.tool_parsers.{name}")
    return ToolFormat(mod.tool_call_start, mod.tool_call_end, mod.parse_tool_call, name)


def new_call_id() -> str:
    return "call_" + secrets.token_hex(12)


class _StopCutter:
    def __init__(self, stops: Sequence[str]) -> None:
        self.stops = [s for s in stops if s]
        self.buf = ""
        self.stopped = False
        self.matched: str | None = None  # the stop string that ended the reply

    def feed(self, text: str) -> str:
        if self.stopped:
            return ""
        if not self.stops:
            return text
        self.buf += text
        hits = [(i, s) for s in self.stops if (i := self.buf.find(s)) >= 0]
        if hits:
            at, self.matched = min(hits)
            out, self.buf, self.stopped = self.buf[:at], "", True
            return out
        keep = held(self.buf, self.stops)
        out = self.buf[: len(self.buf) - keep]
        self.buf = self.buf[len(out) :]
        return out

    def finish(self) -> str:
        out, self.buf = self.buf, ""
        return out


class _ThinkSplitter:
    """Text -> (is reasoning, text) parts, switching at the think markers; the newlines
    a template puts after a marker are dropped."""

    def __init__(self, fmt: ThinkFormat, inside: bool) -> None:
        self.fmt = fmt
        self.inside = inside
        self.buf = ""
        self.strip_next = False

    def feed(self, text: str, final: bool) -> list[tuple[bool, str]]:
        out: list[tuple[bool, str]] = []
        self.buf += text
        while True:
            marker = self.fmt.end if self.inside else self.fmt.start
            at = self.buf.find(marker)
            if at < 0:
                keep = 0 if final else held(self.buf, [marker])
                self._emit(out, self.buf[: len(self.buf) - keep])
                self.buf = self.buf[len(self.buf) - keep :]
                return out
            self._emit(out, self.buf[:at])
            self.buf = self.buf[at + len(marker) :]
            self.inside = not self.inside
            self.strip_next = True

    def _emit(self, out: list[tuple[bool, str]], text: str) -> None:
        if self.strip_next:
            text = text.lstrip("\n")
            if not text:
                return
            self.strip_next = False
        if text:
            out.append((self.inside, text))


class OutputFilter:
    def __init__(
        self,
        stops: Sequence[str] = (),
        tool_format: ToolFormat | None = None,
        tools: Sequence[dict] | None = None,
        think: ThinkFormat | None = None,
        in_think: bool = False,
        *,
        harmony: bool = False,
    ) -> None:
        """`think`: split the model's think block off as `Reasoning` (`in_think`: the
        prompt opened it). Stop strings see the whole text; tool calls only the answer.
        `harmony`: the text is gpt-oss's harmony messages (`think` and `tool_format`
        are not used: its channels say what is reasoning and what is a call)."""
        self._stop = _StopCutter(stops)
        self._harmony = H.HarmonyParser() if harmony else None
        self._think = _ThinkSplitter(think, in_think) if think is not None else None
        self.reasoning: list[str] = []  # all reasoning text sent
        self._fmt = tool_format if tools else None
        self._tools = list(tools or [])
        self._buf = ""
        self._inside = False
        self.calls: list[ToolCall] = []
        self.content: list[str] = []  # all content text sent

    @property
    def stopped(self) -> bool:
        """A stop string was generated: the caller stops the engine."""
        return self._stop.stopped

    @property
    def harmony(self) -> bool:
        return self._harmony is not None

    @property
    def ended(self) -> bool:
        """The reply's own end marker came as text (harmony's `<|call|>` or `<|return|>`
        where the tokenizer does not stop on it): the caller stops the engine."""
        return self._harmony is not None and self._harmony.ended

    @property
    def stop_sequence(self) -> str | None:
        """Which stop string ended the reply (None: none did)."""
        return self._stop.matched

    def feed(self, text: str) -> list[Piece]:
        return self._route(self._stop.feed(text), final=False)

    def finish(self) -> list[Piece]:
        return self._route(self._stop.finish(), final=True)

    def _route(self, text: str, *, final: bool) -> list[Piece]:
        if self._harmony is not None:
            return self._harmony_pieces(self._harmony.feed(text, final))
        if self._think is None:
            return self._pieces(text, final=final)
        out: list[Piece] = []
        for reasoning, part in self._think.feed(text, final):
            if reasoning:
                self.reasoning.append(part)
                out.append(Reasoning(part))
            else:
                out += self._pieces(part, final=False)
        if final:
            out += self._pieces("", final=True)
        return out

    def _harmony_pieces(self, events: list[H.Event]) -> list[Piece]:
        out: list[Piece] = []
        for ev in events:
            if ev.kind == "reasoning":
                if ev.first and self.reasoning:
                    ev = H.Event("reasoning", "\n\n" + ev.text)  # one paragraph a message
                self.reasoning.append(ev.text)
                out.append(Reasoning(ev.text))
            elif ev.kind == "content":
                self._emit_text(out, ev.text)
            else:
                assert ev.header is not None
                args = H.call_arguments(ev.text) if self._tools else None
                if args is None:  # no tools offered, or not a JSON object: text
                    self._emit_text(out, ev.text)
                    continue
                name = H.tool_name(ev.header.recipient)
                call = ToolCall(new_call_id(), name, json.dumps(args, ensure_ascii=False))
                self.calls.append(call)
                out.append(Call(call))
        return out

    def _pieces(self, text: str, *, final: bool) -> list[Piece]:
        out: list[Piece] = []
        fmt = self._fmt
        if fmt is None:
            if text:
                self._emit_text(out, text)
            return out
        self._buf += text
        while True:
            if not self._inside:
                at = self._buf.find(fmt.start)
                if at < 0:
                    keep = 0 if final else held(self._buf, [fmt.start])
                    self._emit_text(out, self._buf[: len(self._buf) - keep])
                    self._buf = self._buf[len(self._buf) - keep :]
                    return out
                self._emit_text(out, self._buf[:at])
                self._buf = self._buf[at:]
                self._inside = True
            end = self._buf.find(fmt.end, len(fmt.start))
            if end < 0:
                if final:  # the reply ended inside a block: parse what is there
                    block, self._buf, self._inside = self._buf, "", False
                    self._emit_block(out, block, block[len(fmt.start) :])
                return out
            block = self._buf[: end + len(fmt.end)]
            self._buf = self._buf[end + len(fmt.end) :]
            self._inside = False
            self._emit_block(out, block, block[len(fmt.start) : end])

    def _emit_text(self, out: list[Piece], text: str) -> None:
        if text:
            self.content.append(text)
            out.append(Content(text))

    def _emit_block(self, out: list[Piece], block: str, body: str) -> None:
        calls = self._parse(body)
        if not calls:
            self._emit_text(out, block)
            return
        for call in calls:
            self.calls.append(call)
            out.append(Call(call))

    def _parse(self, body: str) -> list[ToolCall]:
        try:
            parsed = self._fmt.parse(body.strip(), self._tools)
        except Exception:  # noqa: BLE001 - a malformed call is passed on as text
            return []
        items = parsed if isinstance(parsed, list) else [parsed]
        calls = []
        for item in items:
            if not isinstance(item, dict) or not isinstance(item.get("name"), str):
                return []
            args = item.get("arguments", {})
            if isinstance(args, str):
                try:
                    args = json.loads(args)
                except (ValueError, RecursionError):  # not JSON, or nested too deep
                    return []
            calls.append(
                ToolCall(new_call_id(), item["name"], json.dumps(args, ensure_ascii=False))
            )
        return calls

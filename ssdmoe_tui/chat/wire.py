"""What an attached server sent, checked field by field before anything uses it.

The app attached to `ssdmoe serve` (chat/remote.py) reads three kinds of JSON from it:
the model card (`/v1/models`), the engine figures (`/v1/stats`) and the streamed reply's
chunks. Any server can answer at that address, so none of it is trusted: every field
used is checked here for its type (an int is `type(v) is int`, never a bool; a float
is finite; a text is a str of bounded length) and range. A field that is wrong raises
`BadReply`, whose message says what the server sent ("a model card whose
'ssdmoe.num_experts' is '8' (not a whole number)"); the remote engine words it as one
line naming the server, never as Python's own message ("'str' object has no attribute
'get'"). This is the one reader of an attached server's JSON: remote.py parses nothing
itself.

A reply's text and tool calls stay exact here (they are the conversation, sent back with
the next request); the widgets that show them escape their control characters
(`terminal_text.visible`). Names shown on one line are escaped here (`label`).
"""

from __future__ import annotations

import json
import math
from dataclasses import MISSING, dataclass, fields
from typing import Any, get_type_hints

from ssdmoe_tui.engine.run import protocol as P
from ssdmoe_tui.errors import MESSAGE_LIMIT, printable

MAX_COUNT = 1 << 53  # a count or a byte size past this is no real one
MAX_TEXT = 1 << 10  # a name, a device, a dtype
MAX_PIECE = 1 << 20  # one chunk's text


class BadReply(ValueError):
    """The server sent something this app cannot use; `str()` says what, in words."""


def shown(value: object, limit: int = 60) -> str:
    """A value the server sent, quoted for a message: short, one line, no raw control
    characters (`repr` escapes them)."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def parse_json(body: bytes, what: str) -> Any:
    """`body` as JSON, or BadReply naming `what` ("a /v1/stats answer")."""
    try:
        return json.loads(body)
    except (ValueError, RecursionError):
        raise BadReply(f"{what} that is not JSON: {shown(body[:80])}") from None


def obj(value: object, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise BadReply(f"{what} that is not a JSON object: {shown(value)}")
    return value


def count(d: dict[str, Any], key: str, what: str, default: int = 0) -> int:
    """A whole number >= 0 (absent or null: `default`)."""
    v = d.get(key)
    if v is None:
        return default
    if type(v) is not int or not 0 <= v <= MAX_COUNT:
        raise BadReply(f"{what} whose '{key}' is {shown(v)} (not a whole number >= 0)")
    return v


def number(d: dict[str, Any], key: str, what: str) -> float | None:
    """A finite number (absent or null: None)."""
    v = d.get(key)
    if v is None:
        return None
    if type(v) not in (int, float) or not math.isfinite(v):
        raise BadReply(f"{what} whose '{key}' is {shown(v)} (not a number)")
    return float(v)


def text(d: dict[str, Any], key: str, what: str, default: str = "", limit: int = MAX_TEXT) -> str:
    v = d.get(key)
    if v is None:
        return default
    if not isinstance(v, str) or len(v) > limit:
        raise BadReply(f"{what} whose '{key}' is {shown(v)} (not a text)")
    return v


def label(d: dict[str, Any], key: str, what: str) -> str:
    """A name the panels show on one line (the model, its device): a text whose control
    characters and newlines are escapes ("?" when absent or empty)."""
    return printable(text(d, key, what), MAX_TEXT) or "?"


def sub(d: dict[str, Any], key: str, what: str) -> dict[str, Any]:
    """A nested object (absent or null: empty)."""
    v = d.get(key)
    if v is None:
        return {}
    return obj(v, f"{what} whose '{key}' is {shown(v)}, i.e.")


# ---------------------------------------------------------------- the model card


def model_info(url: str, models: object, stats: object) -> P.ModelInfo:
    """The served model as the app's panels know a model, from `/v1/models` (its first
    card) and `/v1/stats` (its `engine`)."""
    listing = obj(models, "a model list")
    cards = listing.get("data")
    if not isinstance(cards, list) or not cards:
        raise BadReply(f"a model list without models: 'data' is {shown(cards)}")
    card = obj(cards[0], "a model card")
    what = "a model card"
    ext = sub(card, "ssdmoe", what)
    ext_what = "a model card ('ssdmoe')"
    engine = sub(obj(stats, "a /v1/stats answer"), "engine", "a /v1/stats answer")
    eng_what = "a /v1/stats answer ('engine')"
    trained = count(ext, "trained_k", ext_what)
    k = count(ext, "default_k", ext_what) or trained or 1
    return P.ModelInfo(
        name=text(card, "id", what) or "?",  # exact: sent back as the request's model
        path=url,
        model_type=label(ext, "model_type", ext_what),
        num_layers=count(ext, "moe_layers", ext_what),
        num_experts=count(ext, "num_experts", ext_what),
        trained_k=trained or k,
        k=k,
        prefill_k=k,
        max_context=count(ext, "max_context", ext_what),
        device=label(engine, "device", eng_what),
        dtype=label(engine, "dtype", eng_what),
        expert_bytes=count(ext, "expert_bytes", ext_what),
        resident_bytes=count(engine, "resident_bytes", eng_what),
        expert_cache_budget=count(engine, "expert_cache_budget_bytes", eng_what),
        reader=label(engine, "reader", eng_what),
        fingerprint="",
        hybrid=False,
        expert_source=text(engine, "expert_source", eng_what) or "shards",
        server=url,
    )


# ---------------------------------------------------------------- /v1/stats

_SAMPLE_TYPES = get_type_hints(P.StatsSample)


def stats_sample(stats: object) -> P.StatsSample | None:
    """`/v1/stats`' `live` (the server's last StatsSample) as one; None when there is
    none yet. A field of the wrong type raises BadReply (the poller skips that sample)."""
    live = obj(stats, "a /v1/stats answer").get("live")
    if live is None:
        return None
    live = obj(live, "a /v1/stats answer whose 'live' is")
    what = "a /v1/stats answer ('live')"
    values: dict[str, Any] = {}
    for f in fields(P.StatsSample):
        if f.name not in live:
            if f.default is not MISSING:  # has a default (the optional ones)
                continue
            return None  # a field missing: not a sample this app knows
        hint = _SAMPLE_TYPES[f.name]
        if hint is int:
            values[f.name] = count(live, f.name, what)
        else:  # float, or float | None
            v = number(live, f.name, what)
            if v is None and hint is float:
                raise BadReply(f"{what} whose '{f.name}' is null (not a number)")
            values[f.name] = v
    return P.StatsSample(**values)


# ---------------------------------------------------------------- the streamed reply


@dataclass(frozen=True)
class Chunk:
    """One streamed chunk, checked: its text pieces and what its last part says."""

    reasoning: str = ""
    content: str = ""
    finish: str | None = None  # "stop", "length", ... on the chunk that ends a choice
    k: int | None = None  # the K the server used (its `ssdmoe` extension)
    stats: dict[str, float] | None = None  # the turn's figures (numbers only)
    completion_tokens: int | None = None  # from `usage`
    error: str | None = None  # an error event's message
    # pieces of tool calls: (index, id, name, a piece of the arguments' JSON text)
    tool_calls: tuple[tuple[int, str, str, str], ...] = ()


def chunk(data: bytes | str) -> Chunk:
    """A `data:` line's payload, checked (`[DONE]` is the caller's)."""
    event = obj(parse_json(data.encode() if isinstance(data, str) else data, "a chunk"), "a chunk")
    what = "a chunk"
    if "error" in event:
        err = event["error"]
        msg = err.get("message") if isinstance(err, dict) else err
        said = printable(msg, MESSAGE_LIMIT) if isinstance(msg, str) else shown(msg, MESSAGE_LIMIT)
        return Chunk(error=said)
    reasoning, content, finish = [], [], None
    calls: list[tuple[int, str, str, str]] = []
    choices = event.get("choices")
    if choices is not None and not isinstance(choices, list):
        raise BadReply(f"a chunk whose 'choices' is {shown(choices)} (not a list)")
    for choice in choices or ():
        choice = obj(choice, "a chunk whose choice is")
        delta = sub(choice, "delta", what)
        reasoning.append(text(delta, "reasoning_content", what, limit=MAX_PIECE))
        content.append(text(delta, "content", what, limit=MAX_PIECE))
        calls += tool_call_pieces(delta.get("tool_calls"))
        finish = text(choice, "finish_reason", what) or finish
    usage = sub(event, "usage", what)
    ext = sub(event, "ssdmoe", what) if finish else {}
    return Chunk(
        reasoning="".join(reasoning),
        content="".join(content),
        finish=finish,
        k=count(ext, "k", "a chunk ('ssdmoe')") if ext.get("k") is not None else None,
        stats=turn_stats(sub(ext, "stats", what)) if ext else None,
        completion_tokens=count(usage, "completion_tokens", "a chunk ('usage')")
        if "completion_tokens" in usage
        else None,
        tool_calls=tuple(calls),
    )


MAX_CALLS = 64  # tool calls in one reply


def tool_call_pieces(raw: object) -> list[tuple[int, str, str, str]]:
    """A delta's `tool_calls` (OpenAI's streamed shape: index, id and name once, the
    arguments in pieces), checked."""
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise BadReply(f"a chunk whose 'tool_calls' is {shown(raw)} (not a list)")
    out = []
    what = "a chunk's tool call"
    for item in raw:
        item = obj(item, what)
        index = count(item, "index", what)
        if index >= MAX_CALLS:
            raise BadReply(f"{what} with index {index} (at most {MAX_CALLS - 1})")
        fn = sub(item, "function", what)
        out.append(
            (
                index,
                text(item, "id", what),
                text(fn, "name", what),
                text(fn, "arguments", what, limit=MAX_PIECE),
            )
        )
    return out


def turn_stats(stats: dict[str, Any]) -> dict[str, float]:
    """A reply's figures: the entries that are finite numbers (the panels do arithmetic
    on them); text, lists, objects and booleans are left out."""
    out: dict[str, float] = {}
    for key, v in list(stats.items())[:200]:
        if isinstance(key, str) and type(v) in (int, float) and math.isfinite(v):
            out[key] = v
    return out


def error_code(body: bytes) -> str:
    """The `code` of an OpenAI error envelope, when it is a short word ("" otherwise):
    what the app tells refusals apart by (`context_length_exceeded`)."""
    try:
        data = json.loads(body)
    except (ValueError, RecursionError):
        return ""
    err = data.get("error") if isinstance(data, dict) else None
    code = err.get("code") if isinstance(err, dict) else None
    return code if isinstance(code, str) and code.isidentifier() and len(code) <= 64 else ""


def error_message(body: bytes) -> str:
    """The `message` of an OpenAI (or Anthropic) error envelope, else the body's start
    (one line, at most MESSAGE_LIMIT characters)."""
    try:
        data = json.loads(body)
    except (ValueError, RecursionError):
        data = None
    err = data.get("error") if isinstance(data, dict) else None
    msg = err.get("message") if isinstance(err, dict) else None
    if isinstance(msg, str) and msg.strip():
        out = msg
    elif data is not None:
        out = shown(data, 200)
    else:
        out = body[:200].decode("utf-8", "replace").strip() or "no reason given"
    return printable(" ".join(out.split()), MESSAGE_LIMIT)

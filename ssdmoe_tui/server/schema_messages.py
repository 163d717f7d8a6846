"""Request bodies of Anthropic's Messages API (`POST /v1/messages`,
`/v1/messages/count_tokens`), parsed once into the chat form the server runs on:
`system` becomes the system message, `text` blocks the content, an assistant's
`tool_use` blocks its tool calls, a user's `tool_result` blocks tool messages, tools'
`input_schema` the chat tools' parameters. The exact-history prompts and the KV cache
then serve Messages as they serve chat completions.

What the engine cannot honour is refused with a 400 naming the field (images and
documents, `tool_choice` `any` / `tool`, ...); `metadata`, `service_tier` and
`cache_control` marks (the server caches every prefix anyway) are accepted.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from ssdmoe_tui.server.errors import bad_request
from ssdmoe_tui.server.schema import (
    ChatMessage,
    ChatRequest,
    Sampling,
    ToolCall,
    _bool,
    _ext_k,
    _ext_speculate,
    _field_object,
    _float,
    _int,
    _obj,
    _template_kwargs,
    check_nesting,
    check_no_effect,
    merge_leading_system,
    part_text,
    split_model,
    tool_list,
)

MAX_STOP_SEQUENCES = 16


@dataclass(frozen=True)
class MessagesRequest:
    chat: ChatRequest  # what runs: messages, tools, sampling, K
    model: str

    @property
    def k(self) -> int | None:
        return self.chat.k

    @property
    def sampling(self) -> Sampling:
        return self.chat.sampling


def _blocks(content: Any, where: str) -> list[dict]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if not isinstance(content, list):
        raise bad_request(f"{where}.content must be a string or a list of blocks", "messages")
    for j, b in enumerate(content):
        if not isinstance(b, dict) or not isinstance(b.get("type"), str):
            raise bad_request(f"{where}.content[{j}] must be a block with a 'type'", "messages")
    return content


def _text_of(content: Any, where: str) -> str:
    """A tool result's or system prompt's content: a string or text blocks."""
    if content is None:
        return ""
    out = []
    for j, b in enumerate(_blocks(content, where)):
        if b["type"] != "text":
            raise bad_request(f"{where}.content[{j}]: block {b['type']!r} is not supported "
                              "(text only)", "messages")  # fmt: skip
        out.append(part_text(b, f"{where}.content[{j}]", "messages"))
    return "".join(out)


def _messages(raw: Any) -> tuple[ChatMessage, ...]:
    if not isinstance(raw, list) or not raw:
        raise bad_request("'messages' must be a non-empty list", "messages")
    out: list[ChatMessage] = []
    for i, m in enumerate(raw):
        where = f"messages[{i}]"
        if not isinstance(m, dict) or m.get("role") not in ("user", "assistant", "system"):
            raise bad_request(f"{where}: role must be 'user', 'assistant' or 'system'",
                              "messages")  # fmt: skip
        role = m["role"]
        if role == "system":  # Claude Code sends one between its user messages
            text = _text_of(m.get("content"), where)
            # templates take a system message at the start only: later ones stay in place
            # (the prompt before them, and its cache, unchanged) as the user's text
            at_start = all(x.role == "system" for x in out)
            out.append(ChatMessage("system" if at_start else "user", text))
            continue
        text: list[str] = []
        calls: list[ToolCall] = []
        results = 0
        for j, b in enumerate(_blocks(m.get("content"), where)):
            kind = b["type"]
            at = f"{where}.content[{j}]"
            if kind == "text":
                text.append(part_text(b, at, "messages"))
            elif kind == "tool_use" and role == "assistant":
                if not isinstance(b.get("id"), str) or not isinstance(b.get("name"), str):
                    raise bad_request(f"{at}: a tool_use block needs 'id' and 'name'", "messages")
                if not isinstance(b.get("input"), (dict, type(None))):
                    raise bad_request(f"{at}: a tool_use block's 'input' must be an object",
                                      "messages")  # fmt: skip
                args = json.dumps(b.get("input") or {}, ensure_ascii=False)
                calls.append(ToolCall(b["id"], b["name"], args))
            elif kind == "tool_result" and role == "user":
                if not isinstance(b.get("tool_use_id"), str):
                    raise bad_request(f"{at}: a tool_result block needs 'tool_use_id'", "messages")
                result = _text_of(b.get("content"), at)
                if b.get("is_error"):
                    result = f"Error: {result}"
                out.append(ChatMessage("tool", result, (), b["tool_use_id"]))
                results += 1
            elif kind in ("thinking", "redacted_thinking") and role == "assistant":
                continue  # the model's own reasoning: the exact history has it
            else:
                raise bad_request(f"{at}: block {kind!r} is not supported in a {role} message",
                                  "messages")  # fmt: skip
        if text or calls or not results:  # tool results first, then the user's text
            out.append(ChatMessage(role, "".join(text), tuple(calls)))
    return tuple(out)


def _system(raw: Any) -> tuple[ChatMessage, ...]:
    if raw is None:
        return ()
    text = _text_of(raw, "system") if not isinstance(raw, str) else raw
    return (ChatMessage("system", text),) if text else ()


def _tools(body: dict) -> tuple[dict, ...]:
    choice = body.get("tool_choice")
    kind = choice.get("type") if isinstance(choice, dict) else choice
    if kind not in (None, "auto", "none"):
        raise bad_request(f"'tool_choice' {kind!r} is not supported (auto or none)", "tool_choice")
    raw = tool_list(body)
    out = []
    for i, t in enumerate(raw):
        if not isinstance(t, dict) or t.get("type") not in (None, "custom"):
            kind = t.get("type") if isinstance(t, dict) else type(t).__name__
            raise bad_request(f"tools[{i}]: tool type {kind!r} is not supported (client tools "
                              "with an input_schema only)", "tools")  # fmt: skip
        if not isinstance(t.get("name"), str) or not t["name"]:
            raise bad_request(f"tools[{i}].name is required", "tools")
        check_nesting(t, f"tools[{i}]", "tools")
        fn = {"name": t["name"], "parameters": t.get("input_schema") or {"type": "object"}}
        if isinstance(t.get("description"), str):
            fn["description"] = t["description"]
        out.append({"type": "function", "function": fn})
    return () if kind == "none" else tuple(out)


def _stops(body: dict) -> tuple[str, ...]:
    stops = body.get("stop_sequences")
    if stops is None:
        return ()
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops):
        raise bad_request("'stop_sequences' must be a list of non-empty strings", "stop_sequences")
    if len(stops) > MAX_STOP_SEQUENCES:
        raise bad_request(f"'stop_sequences' takes at most {MAX_STOP_SEQUENCES}", "stop_sequences")
    return tuple(stops)


def _thinking(body: dict) -> dict:
    """`thinking` switches a thinking template (Qwen3's `enable_thinking`)."""
    t = body.get("thinking")
    if t is None:
        return {}
    kind = t.get("type") if isinstance(t, dict) else None
    if kind not in ("enabled", "disabled", "adaptive", "between_tools"):
        raise bad_request("'thinking' must be {'type': 'enabled' | 'disabled' | 'adaptive'}",
                          "thinking")  # fmt: skip
    return {"enable_thinking": kind != "disabled"}


def _output_config(body: dict) -> dict:
    """`output_config.effort` reaches templates that take `reasoning_effort` (gpt-oss:
    low / medium / high); a structured-output `format` is refused."""
    cfg = _field_object(body, "output_config")
    if cfg.get("format") is not None:
        raise bad_request("'output_config.format' (structured outputs) is not supported",
                          "output_config")  # fmt: skip
    effort = cfg.get("effort")
    if effort is None:
        return {}
    if effort not in ("low", "medium", "high", "xhigh", "max"):
        raise bad_request(f"'output_config.effort' {effort!r} is not a known effort",
                          "output_config")  # fmt: skip
    return {"reasoning_effort": effort if effort in ("low", "medium") else "high"}


MESSAGES_FIELDS = frozenset({
    "model", "stream", "ssdmoe", "chat_template_kwargs", "messages", "system", "max_tokens",
    "temperature", "top_p", "top_k", "stop_sequences", "tools", "tool_choice", "thinking",
    "output_config", "metadata", "service_tier", "container", "mcp_servers",
})  # fmt: skip  # what parse_messages reads, refuses or accepts (schema.unknown_fields)


def _refuse(body: dict) -> None:
    for name in ("container", "mcp_servers"):
        if body.get(name):
            raise bad_request(f"'{name}' is not supported", name)


def parse_messages(body: Any, served_model: str, *, count_only: bool = False) -> MessagesRequest:
    body = _obj(body)
    _, k_suffix = split_model(body.get("model"), served_model)
    _refuse(body)
    check_no_effect(body, MESSAGES_FIELDS)
    max_tokens = _int(body, "max_tokens", 1)
    if max_tokens is None and not count_only:
        raise bad_request("'max_tokens' is required", "max_tokens")
    top_k = _int(body, "top_k", 0)
    sampling = Sampling(
        max_tokens=max_tokens,
        temperature=_float(body, "temperature", 0.0, 1.0),
        top_p=_float(body, "top_p", 0.0, 1.0),
        seed=None,
        stop=_stops(body),
        top_k=top_k or 0,
    )
    k = _ext_k(body)
    chat = ChatRequest(
        model=body["model"],
        messages=merge_leading_system(
            _system(body.get("system")) + _messages(body.get("messages"))
        ),
        sampling=sampling,
        stream=_bool(body, "stream"),
        tools=_tools(body),
        template_kwargs={**_thinking(body), **_output_config(body), **_template_kwargs(body)},
        k=k if k is not None else k_suffix,
        speculate=_ext_speculate(body),
    )
    return MessagesRequest(chat, body["model"])

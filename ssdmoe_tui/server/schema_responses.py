"""Request bodies of OpenAI's Responses API (`POST /v1/responses`), parsed once into the
chat form the rest of the server runs on: `instructions` become the system message,
`input` (a string, or message / function_call / function_call_output items) the
messages, flat function tools the chat tools. So the exact-history prompts and the KV
cache serve Responses exactly as they serve chat completions.

As in `schema`, what the engine cannot honour is refused with a 400 naming the field;
fields that do not change the output (`store`, `metadata`, `user`, `include`,
`truncation`, `parallel_tool_calls`, `service_tier`, ...) are accepted.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
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
    _seed,
    _template_kwargs,
    check_nesting,
    check_no_effect,
    merge_leading_system,
    part_text,
    reasoning_kwargs,
    sampling_extras,
    split_model,
    tool_list,
)


@dataclass(frozen=True)
class ResponsesRequest:
    model: str
    input: tuple[ChatMessage, ...]  # this request's new items, as chat messages
    instructions: str | None
    previous_response_id: str | None
    sampling: Sampling
    stream: bool
    tools: tuple[dict, ...]  # in the chat form the templates take
    tools_echo: list  # as the client sent them (a Response echoes them)
    tool_choice: Any
    namespaces: dict = field(default_factory=dict)  # function name -> namespace
    skipped_tools: tuple[str, ...] = ()  # hosted tools the request listed (none run here)
    template_kwargs: dict = field(default_factory=dict)
    store: bool = True
    metadata: dict | None = None
    k: int | None = None
    speculate: str | None = None  # ssdmoe.speculate, as chat/completions takes it

    def chat(self, history: tuple[ChatMessage, ...] = ()) -> ChatRequest:
        """The chat request this runs as: instructions, then the previous response's
        conversation (`history`, without its instructions), then the new input."""
        system = (ChatMessage("system", self.instructions),) if self.instructions else ()
        return ChatRequest(
            model=self.model,
            messages=merge_leading_system(system + history + self.input),
            sampling=self.sampling,
            stream=self.stream,
            tools=self.tools,
            template_kwargs=self.template_kwargs,
            k=self.k,
            speculate=self.speculate,
        )


_PART_TYPES = ("input_text", "output_text", "text")


def _content(content: Any, where: str) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        out = []
        for j, part in enumerate(content):
            kind = part.get("type") if isinstance(part, dict) else type(part).__name__
            if kind not in _PART_TYPES:
                raise bad_request(
                    f"{where}.content[{j}]: content part {kind!r} is not supported (text only)",
                    "input",
                )
            out.append(part_text(part, f"{where}.content[{j}]", "input"))
        return "".join(out)
    raise bad_request(f"{where}.content must be a string or a list of text parts", "input")


def _items(raw: Any) -> tuple[ChatMessage, ...]:
    if isinstance(raw, str):
        if not raw:
            raise bad_request("'input' is empty", "input")
        return (ChatMessage("user", raw),)
    if not isinstance(raw, list) or not raw:
        raise bad_request("'input' must be a string or a non-empty list of items", "input")
    msgs: list[ChatMessage] = []
    for i, item in enumerate(raw):
        where = f"input[{i}]"
        if not isinstance(item, dict):
            raise bad_request(f"{where} must be an object", "input")
        kind = item.get("type") or ("message" if "role" in item else None)
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "assistant", "system", "developer"):
                raise bad_request(f"{where}: role {role!r} is not user/assistant/system/developer",
                                  "input")  # fmt: skip
            role = "system" if role == "developer" else role
            msgs.append(ChatMessage(role, _content(item.get("content"), where)))
        elif kind == "function_call":
            call_id, name, args = item.get("call_id"), item.get("name"), item.get("arguments", "")
            if not isinstance(call_id, str) or not isinstance(name, str) or not name:
                raise bad_request(f"{where}: a function_call needs 'call_id' and 'name'", "input")
            if not isinstance(args, str):
                args = json.dumps(args, ensure_ascii=False)
            call = ToolCall(call_id, name, args)
            last = msgs[-1] if msgs else None
            if last is not None and last.role == "assistant":  # the reply's text, then its calls
                msgs[-1] = replace(last, tool_calls=last.tool_calls + (call,))
            else:
                msgs.append(ChatMessage("assistant", "", (call,)))
        elif kind == "function_call_output":
            call_id = item.get("call_id")
            if not isinstance(call_id, str):
                raise bad_request(f"{where}: a function_call_output needs 'call_id'", "input")
            msgs.append(ChatMessage("tool", _content(item.get("output"), where), (), call_id))
        elif kind == "reasoning":
            continue  # the model's own reasoning: the exact history has it, templates drop it
        else:
            raise bad_request(f"{where}: item type {kind!r} is not supported", "input")
    return tuple(msgs)


# Tools the API's host runs itself (OpenAI's servers): this server has none of them. A
# request that lists one (Codex CLI always sends `web_search`) runs without it, and the
# reply's `ssdmoe.skipped_tools` names it.
HOSTED_TOOLS = ("web_search", "web_search_preview", "file_search", "code_interpreter",
                "image_generation", "computer_use_preview", "mcp", "local_shell", "custom",
                "tool_search")  # fmt: skip


@dataclass(frozen=True)
class Tools:
    chat: tuple[dict, ...]  # in the chat form the templates take
    echo: list  # as the client sent them
    choice: Any
    namespaces: dict  # function name -> its namespace (a `namespace` tool's members)
    skipped: tuple[str, ...]  # hosted tools this server cannot run


def _function(t: dict, where: str) -> dict:
    if not isinstance(t.get("name"), str) or not t["name"]:
        raise bad_request(f"{where}.name is required", "tools")
    check_nesting(t, where, "tools")
    fn = {"name": t["name"], "parameters": t.get("parameters") or {"type": "object"}}
    if isinstance(t.get("description"), str):
        fn["description"] = t["description"]
    return {"type": "function", "function": fn}


def _tools(body: dict) -> Tools:
    choice = body.get("tool_choice", "auto")
    if choice not in (None, "auto", "none"):
        raise bad_request("'tool_choice' other than 'auto' or 'none' is not supported",
                          "tool_choice")  # fmt: skip
    raw = tool_list(body)
    out, namespaces, skipped = [], {}, []
    for i, t in enumerate(raw):
        kind = t.get("type") if isinstance(t, dict) else type(t).__name__
        if kind == "function":
            out.append(_function(t, f"tools[{i}]"))
        elif kind == "namespace" and isinstance(t.get("tools"), list):
            for j, member in enumerate(t["tools"]):
                if not isinstance(member, dict) or member.get("type") != "function":
                    raise bad_request(f"tools[{i}].tools[{j}] must be a function tool", "tools")
                out.append(_function(member, f"tools[{i}].tools[{j}]"))
                namespaces[member["name"]] = str(t.get("name") or "")
        elif kind in HOSTED_TOOLS:
            skipped.append(str(t.get("name") or kind))
        else:
            raise bad_request(f"tools[{i}]: tool type {kind!r} is not supported (function, "
                              "namespace)", "tools")  # fmt: skip
    chat_tools = () if choice == "none" else tuple(out)
    return Tools(chat_tools, raw, choice or "auto", namespaces, tuple(skipped))


RESPONSES_FIELDS = frozenset({
    "model", "stream", "ssdmoe", "chat_template_kwargs", "input", "instructions",
    "previous_response_id", "max_output_tokens", "temperature", "top_p", "seed", "tools",
    "tool_choice", "reasoning", "text", "store", "metadata", "user", "include", "truncation",
    "parallel_tool_calls", "service_tier", "stream_options", "max_tool_calls",
    "prompt_cache_key", "safety_identifier", "top_logprobs", "background", "conversation",
    "prompt", "top_k", "min_p", "repetition_penalty", "presence_penalty", "frequency_penalty",
})  # fmt: skip  # what parse_responses reads, refuses or accepts (schema.unknown_fields)


def _refuse(body: dict) -> None:
    if body.get("top_logprobs") not in (None, 0):
        raise bad_request("'top_logprobs' is not supported", "top_logprobs")
    if body.get("background"):
        raise bad_request("'background' is not supported", "background")
    if body.get("conversation") is not None:
        raise bad_request("'conversation' is not supported (use previous_response_id)",
                          "conversation")  # fmt: skip
    if body.get("prompt") is not None:
        raise bad_request("'prompt' (stored prompt templates) is not supported", "prompt")
    text = body.get("text")
    if text is not None:
        fmt = text.get("format") if isinstance(text, dict) else None
        kind = fmt.get("type") if isinstance(fmt, dict) else fmt
        if kind not in (None, "text"):
            raise bad_request(f"'text.format' {kind!r} is not supported (only 'text')", "text")


def _reasoning_kwargs(body: dict) -> dict:
    """`reasoning.effort` as template variables (`schema.reasoning_kwargs`)."""
    return reasoning_kwargs(_field_object(body, "reasoning").get("effort"), "reasoning")


def parse_responses(body: Any, served_model: str) -> ResponsesRequest:
    body = _obj(body)
    _, k_suffix = split_model(body.get("model"), served_model)
    _refuse(body)
    check_no_effect(body, RESPONSES_FIELDS)
    instructions = body.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise bad_request("'instructions' must be a string", "instructions")
    prev = body.get("previous_response_id")
    if prev is not None and not isinstance(prev, str):
        raise bad_request("'previous_response_id' must be a string", "previous_response_id")
    tools = _tools(body)
    metadata = body.get("metadata")
    k = _ext_k(body)
    store = body.get("store", True)
    return ResponsesRequest(
        model=body["model"],
        input=_items(body.get("input")),
        instructions=instructions or None,
        previous_response_id=prev,
        sampling=Sampling(
            max_tokens=_int(body, "max_output_tokens", 1),
            temperature=_float(body, "temperature", 0.0, 2.0),
            top_p=_float(body, "top_p", 0.0, 1.0),
            seed=_seed(body),
            stop=(),
            **sampling_extras(body),
        ),
        stream=_bool(body, "stream"),
        tools=tools.chat,
        tools_echo=tools.echo,
        tool_choice=tools.choice,
        namespaces=tools.namespaces,
        skipped_tools=tools.skipped,
        template_kwargs={**_reasoning_kwargs(body), **_template_kwargs(body)},
        store=store is not False,
        metadata=metadata if isinstance(metadata, dict) else None,
        k=k if k is not None else k_suffix,
        speculate=_ext_speculate(body),
    )

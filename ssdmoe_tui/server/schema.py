"""Request bodies of the OpenAI API, parsed and validated once into typed dataclasses.

Everything the engine cannot honour is refused with a 400 naming the field (`n > 1`,
`logprobs`, a `response_format` other than text, `logit_bias`, ...), never silently
ignored; the samplers and penalties (`top_k`, `min_p`, `repetition_penalty`,
`presence_penalty`, `frequency_penalty`) are honoured. Fields that do not change the output (`user`, `metadata`, `store`,
`parallel_tool_calls`, ...) are accepted and ignored.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field, fields
from typing import Any

from ssdmoe_tui.options import SEED_MAX, SamplingOptions
from ssdmoe_tui.prompting.output import ToolCall
from ssdmoe_tui.server.errors import ApiError, bad_request

_K_SUFFIX = re.compile(r"^(?P<base>.+)@k(?P<k>\d{1,4})$")
_THINK = re.compile(r"<think>.*?</think>", re.DOTALL)
ROLES = ("system", "developer", "user", "assistant", "tool")


@dataclass(frozen=True)
class ChatMessage:
    role: str  # system, user, assistant, tool ("developer" is read as system)
    content: str
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None
    name: str | None = None

    def for_template(self) -> dict:
        msg: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.tool_calls:
            msg["tool_calls"] = [c.for_template() for c in self.tool_calls]
        if self.tool_call_id is not None:
            msg["tool_call_id"] = self.tool_call_id
        if self.name is not None and self.role == "tool":
            msg["name"] = self.name
        return msg

    def canonical(self) -> list:
        """What identifies the message for the exact-history record (ids left out). An
        assistant's think blocks and surrounding whitespace are left out too: clients that
        show reasoning apart often send the answer back without it."""
        content = self.content
        if self.role == "assistant":
            content = _THINK.sub("", content).strip()
        return [self.role, content, [list(c.canonical()) for c in self.tool_calls]]


@dataclass(frozen=True)
class Sampling:
    max_tokens: int | None
    temperature: float | None
    top_p: float | None
    seed: int | None
    stop: tuple[str, ...]
    top_k: int = 0  # 0: off
    min_p: float = 0.0  # 0: off
    repetition_penalty: float | None = None  # None: off
    presence_penalty: float | None = None
    frequency_penalty: float | None = None

    def options(self, max_tokens: int, temperature: float) -> SamplingOptions:
        """The engine's sampling for this request, built once (vLLM's
        `to_sampling_params`): `max_tokens` is what the context leaves of what was asked,
        `temperature` the server's default for a request that gives none. Every other
        setting the request gave passes by its name (`SamplingOptions.API_NAMES`)."""
        given = {}
        for f in fields(SamplingOptions):
            value = getattr(self, SamplingOptions.API_NAMES.get(f.name, f.name), None)
            if value is not None:
                given[f.name] = value
        given["max_tokens"] = max_tokens
        given.setdefault("temp", temperature)
        return SamplingOptions(**given)


@dataclass(frozen=True)
class ChatRequest:
    model: str
    messages: tuple[ChatMessage, ...]
    sampling: Sampling
    stream: bool = False
    include_usage: bool = False
    tools: tuple[dict, ...] = ()
    template_kwargs: dict = field(default_factory=dict)
    k: int | None = None
    speculate: str | None = None  # ssdmoe.speculate (None: the server's --speculate)


@dataclass(frozen=True)
class CompletionRequest:
    model: str
    prompt: str | tuple[int, ...]
    sampling: Sampling
    stream: bool = False
    include_usage: bool = False
    k: int | None = None
    speculate: str | None = None


# --------------------------------------------------------------------------- helpers


def merge_leading_system(msgs: tuple[ChatMessage, ...]) -> tuple[ChatMessage, ...]:
    """Instructions and the developer messages that follow them, as one system message:
    templates take one, at the start (Qwen3.5's raises on a second). Codex CLI sends
    two developer messages before the user's; Claude Code a system message in `messages`."""
    n = 0
    while n < len(msgs) and msgs[n].role == "system":
        n += 1
    if n < 2:
        return msgs
    merged = ChatMessage("system", "\n\n".join(m.content for m in msgs[:n]))
    return (merged,) + msgs[n:]


def _obj(body: Any) -> dict:
    if not isinstance(body, dict):
        raise bad_request("the request body must be a JSON object")
    return body


def _int(
    body: dict, name: str, lo: int | None = None, hi: int | None = None, *, param: str = ""
) -> int | None:
    """`body[name]` as an integer in lo..hi, or None; `param`: the field's full name."""
    v = body.get(name)
    param = param or name
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int):
        raise bad_request(f"'{param}' must be an integer", param)
    if (lo is not None and v < lo) or (hi is not None and v > hi):
        rng = f"{lo}..{hi}" if hi is not None else f">= {lo}"
        raise bad_request(f"'{param}' must be {rng}, got {v}", param)
    return v


def check_unicode(body: Any) -> None:
    """JSON can escape lone surrogates (`"\\ud800"`), which no tokenizer or template
    takes (they failed deep inside as a 500): refused here, naming the field."""
    try:
        json.dumps(body, ensure_ascii=False).encode("utf-8")
        return
    except UnicodeEncodeError:
        pass
    stack: list[tuple[Any, str]] = [(body, "")]
    while stack:  # a loop, not recursion: the body may nest as deep as json allowed
        value, path = stack.pop()
        if isinstance(value, dict):
            for key, v in value.items():
                stack += [(key, path or "body"), (v, f"{path}.{key}" if path else str(key))]
        elif isinstance(value, list):
            stack += [(v, f"{path}[{i}]") for i, v in enumerate(value)]
        elif isinstance(value, str):
            try:
                value.encode("utf-8")
            except UnicodeEncodeError as e:
                raise bad_request(
                    f"'{path}' holds a lone surrogate (\\u{ord(value[e.start]):04x} at "
                    f"character {e.start}): not Unicode text",
                    re.split(r"[.\[]", path, maxsplit=1)[0] or None if path != "body" else None,
                ) from None


def _float(body: dict, name: str, lo: float, hi: float) -> float | None:
    v = body.get(name)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise bad_request(f"'{name}' must be a number", name)
    if not lo <= v <= hi:
        raise bad_request(f"'{name}' must be between {lo} and {hi}, got {v}", name)
    return float(v)


def _field_object(body: dict, name: str, example: str = "") -> dict:
    """`body[name]` when it is an object, {} when absent or null (every optional object
    field of the request bodies: `ssdmoe`, `stream_options`, `chat_template_kwargs`...)."""
    v = body.get(name)
    if v is None:
        return {}
    if not isinstance(v, dict):
        raise bad_request(f"'{name}' must be an object{example}", name)
    return v


def _bool(body: dict, name: str) -> bool:
    v = body.get(name, False)
    if v is None:
        return False
    if not isinstance(v, bool):
        raise bad_request(f"'{name}' must be true or false", name)
    return v


def _refuse_unsupported(body: dict, *, chat: bool) -> None:
    n = body.get("n")
    if n is not None and n != 1:
        raise bad_request("'n' > 1 is not supported (one choice per request)", "n")
    if body.get("logprobs") not in (None, False, 0):
        raise bad_request("'logprobs' is not supported", "logprobs")
    if body.get("top_logprobs") not in (None, 0):
        raise bad_request("'top_logprobs' is not supported", "top_logprobs")
    if body.get("logit_bias") not in (None, {}):
        raise bad_request("'logit_bias' is not supported", "logit_bias")
    fmt = body.get("response_format")
    if fmt is not None:
        kind = fmt.get("type") if isinstance(fmt, dict) else fmt
        if kind != "text":
            raise bad_request(
                f"'response_format' {kind!r} is not supported (only 'text')", "response_format"
            )
    if chat:
        mods = body.get("modalities")
        if mods not in (None, ["text"]):
            raise bad_request("'modalities' other than ['text'] are not supported", "modalities")
        if body.get("audio") is not None:
            raise bad_request("'audio' is not supported", "audio")
        if body.get("prediction") is not None:
            raise bad_request("'prediction' is not supported", "prediction")
    else:
        if body.get("echo"):
            raise bad_request("'echo' is not supported", "echo")
        if body.get("suffix"):
            raise bad_request("'suffix' is not supported", "suffix")
        if body.get("best_of") not in (None, 1):
            raise bad_request("'best_of' > 1 is not supported", "best_of")


def split_model(model: Any, served: str) -> tuple[str, int | None]:
    """'<id>' or '<id>@k4' -> (id, 4). A model other than the served one is a 404."""
    if not isinstance(model, str) or not model:
        raise bad_request("'model' is required (see GET /v1/models)", "model")
    k = None
    m = _K_SUFFIX.match(model)
    base = model
    if m and m.group("base") == served:
        base, k = m.group("base"), int(m.group("k"))
    if base != served:
        raise ApiError(
            404,
            f"the model '{model}' does not exist; this server serves '{served}'",
            "model",
            "model_not_found",
        )
    return base, k


def _ext(body: dict) -> dict:
    ext = _field_object(body, "ssdmoe", ', e.g. {"k": 4}')
    unknown = set(ext) - {"k", "speculate"}
    if unknown:
        raise bad_request(f"unknown 'ssdmoe' field(s): {', '.join(sorted(unknown))}", "ssdmoe")
    return ext


def _ext_k(body: dict) -> int | None:
    return _int(_ext(body), "k", 1, param="ssdmoe.k")


def _ext_speculate(body: dict) -> str | None:
    """`ssdmoe.speculate`: off | auto | ngram | mtp for this request (none: the server's).
    Exact greedy tokens on CPU; on MLX-CUDA tokens may differ at near-ties (a verify pass
    runs other kernels), and `auto` drafts nothing there (runner.auto_stands_down)."""
    from ssdmoe_tui.errors import BadValueError
    from ssdmoe_tui.options import parse_speculate

    value = _ext(body).get("speculate")
    if value is None:
        return None
    if not isinstance(value, str):
        raise bad_request(
            "ssdmoe.speculate must be one of off, auto, ngram, mtp", "ssdmoe.speculate"
        )
    try:
        return parse_speculate(value).mode
    except BadValueError as e:
        raise bad_request(f"ssdmoe.speculate: {e}", "ssdmoe.speculate") from None


def _stop(body: dict) -> tuple[str, ...]:
    stop = body.get("stop")
    if stop is None:
        return ()
    if isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop):
        raise bad_request("'stop' must be a non-empty string or a list of them", "stop")
    if len(stop) > 4:
        raise bad_request("'stop' takes at most 4 sequences", "stop")
    return tuple(stop)


def _seed(body: dict) -> int | None:
    """OpenAI's seed is a signed 64-bit integer, MLX's an unsigned one: a negative seed
    runs as its two's complement (the same seed always gives the same tokens)."""
    seed = _int(body, "seed", -(2**63), SEED_MAX)
    return None if seed is None else seed & SEED_MAX


def _sampling(body: dict, *, chat: bool) -> Sampling:
    max_tokens = _int(body, "max_tokens", 1)
    if chat:
        mct = _int(body, "max_completion_tokens", 1)
        max_tokens = mct if mct is not None else max_tokens
    return Sampling(
        max_tokens=max_tokens,
        temperature=_float(body, "temperature", 0.0, 2.0),
        top_p=_float(body, "top_p", 0.0, 1.0),
        seed=_seed(body),
        stop=_stop(body),
        **sampling_extras(body),
    )


def sampling_extras(body: dict) -> dict:
    """The samplers and penalties beyond OpenAI's own fields, as vLLM, llama.cpp's server
    and mlx_lm.server take them (Open WebUI, LiteLLM and Continue send them): top_k
    (-1 or 0: off), min_p, repetition_penalty, presence/frequency_penalty (mlx-lm's
    processors, over the last 20 tokens)."""
    top_k = _int(body, "top_k", -1)
    rep = _float(body, "repetition_penalty", 0.0, 10.0)
    if rep is not None and rep <= 0:
        raise bad_request("'repetition_penalty' must be > 0 (1: off)", "repetition_penalty")
    return {
        "top_k": max(top_k or 0, 0),
        "min_p": _float(body, "min_p", 0.0, 1.0) or 0.0,
        "repetition_penalty": None if rep in (None, 1.0) else rep,
        "presence_penalty": _float(body, "presence_penalty", -2.0, 2.0) or None,
        "frequency_penalty": _float(body, "frequency_penalty", -2.0, 2.0) or None,
    }


# Each API's top-level fields this server reads, refuses or accepts as not changing the
# output; anything else is named in a warning (`unknown_fields`): a misspelt
# `temprature` was ignored without a word.
_OURS = frozenset({"model", "stream", "ssdmoe", "chat_template_kwargs"})
_NO_EFFECT = frozenset({"user", "metadata", "store", "service_tier", "parallel_tool_calls",
                        "prompt_cache_key", "safety_identifier", "stream_options"})  # fmt: skip
_EXTRAS = frozenset({"top_k", "min_p", "repetition_penalty", "presence_penalty",
                     "frequency_penalty"})  # fmt: skip
_SAMPLING = frozenset({"temperature", "top_p", "seed", "stop", "max_tokens", "n", "logprobs",
                       "top_logprobs", "logit_bias", "response_format"})  # fmt: skip
CHAT_FIELDS = _OURS | _NO_EFFECT | _EXTRAS | _SAMPLING | {
    "messages", "max_completion_tokens", "tools", "tool_choice", "reasoning_effort",
    "modalities", "audio", "prediction",
}  # fmt: skip
COMPLETION_FIELDS = _OURS | _NO_EFFECT | _EXTRAS | _SAMPLING | {
    "prompt", "echo", "suffix", "best_of",
}  # fmt: skip


# What each field accepted without changing the output must be (JSON's type, in words):
# `"metadata": "x"`, `"user": 5` or `"store": "no"` are a client's mistakes, answered as
# a 400 naming the field (they were taken without a word; a Response echoed the "x").
_NO_EFFECT_TYPES: dict[str, tuple[type, str]] = {
    "user": (str, "a string"), "metadata": (dict, "an object"),
    "store": (bool, "true or false"), "service_tier": (str, "a string"),
    "parallel_tool_calls": (bool, "true or false"), "prompt_cache_key": (str, "a string"),
    "safety_identifier": (str, "a string"), "include": (list, "a list of strings"),
    "truncation": (str, "'auto' or 'disabled'"),
}  # fmt: skip


def check_no_effect(body: dict, known: frozenset[str]) -> None:
    """The fields of `known` (the API's) that change nothing still have their types."""
    for name, (kind, words) in _NO_EFFECT_TYPES.items():
        v = body.get(name)
        if v is None or name not in known:
            continue
        wrong = not isinstance(v, kind)
        if name == "include":
            wrong = wrong or not all(isinstance(x, str) for x in v)
        if name == "truncation":
            wrong = wrong or v not in ("auto", "disabled")
        if wrong:
            raise bad_request(f"'{name}' must be {words}, not {_json_shown(v)}", name)


def _json_shown(value: Any) -> str:
    """A value as the client wrote it, cut to 40 characters."""
    from ssdmoe_tui.errors import printable

    return printable(json.dumps(value, ensure_ascii=False)[:200], 40)


def unknown_fields(body: Any, known: frozenset[str]) -> list[str]:
    """One warning naming the request's top-level fields that `known` (its API's) lacks,
    which nothing reads; none when there are none."""
    from ssdmoe_tui.errors import printable

    unknown = sorted(k for k in body if k not in known) if isinstance(body, dict) else []
    if not unknown:
        return []
    names = ", ".join(f"'{printable(k, 40)}'" for k in unknown[:8])
    more = f" and {len(unknown) - 8} more" if len(unknown) > 8 else ""
    s = "s" if len(unknown) > 1 else ""
    return [f"unknown field{s} {names}{more} ignored (not part of this API)"]


def _stream(body: dict) -> tuple[bool, bool]:
    stream = _bool(body, "stream")
    return stream, _bool(_field_object(body, "stream_options"), "include_usage")


def part_text(part: dict, at: str, param: str) -> str:
    """A text part's or block's `text`, which must be a string: `{"type": "text", "text":
    5}` was taken as "5" (chat), or called a part of a type not supported (the others)."""
    text = part.get("text")
    if not isinstance(text, str):
        shown = "missing" if text is None else f"not {_json_shown(text)}"
        raise bad_request(f"{at}: a {part.get('type')} part's 'text' must be a string, {shown}",
                          param)  # fmt: skip
    return text


def _text(content: Any, where: str) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for j, part in enumerate(content):
            if not isinstance(part, dict) or part.get("type") not in ("text", "input_text"):
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise bad_request(
                    f"{where}: content part {kind!r} is not supported (text only)", where
                )
            parts.append(part_text(part, f"{where}.content[{j}]", where))
        return "".join(parts)
    raise bad_request(f"{where}: 'content' must be a string or a list of text parts", where)


def _tool_calls(raw: Any, where: str) -> tuple[ToolCall, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise bad_request(f"{where}.tool_calls must be a list", where)
    calls = []
    for i, c in enumerate(raw):
        fn = c.get("function") if isinstance(c, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise bad_request(f"{where}.tool_calls[{i}] needs function.name", where)
        args = fn.get("arguments", "")
        if not isinstance(args, str):
            args = json.dumps(args, ensure_ascii=False)
        calls.append(ToolCall(str(c.get("id") or f"call_{i}"), fn["name"], args))
    return tuple(calls)


def _messages(raw: Any) -> tuple[ChatMessage, ...]:
    if not isinstance(raw, list) or not raw:
        raise bad_request("'messages' must be a non-empty list", "messages")
    out = []
    for i, m in enumerate(raw):
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            raise bad_request(f"{where} must be an object", "messages")
        role = m.get("role")
        if role not in ROLES:
            raise bad_request(
                f"{where}: role {role!r} is not one of {', '.join(ROLES)}", "messages"
            )
        role = "system" if role == "developer" else role
        calls = _tool_calls(m.get("tool_calls"), where) if role == "assistant" else ()
        tcid = m.get("tool_call_id")
        if role == "tool" and tcid is not None and not isinstance(tcid, str):
            raise bad_request(f"{where}: 'tool_call_id' must be a string", "messages")
        name = m.get("name") if isinstance(m.get("name"), str) else None
        out.append(ChatMessage(role, _text(m.get("content"), where), calls, tcid, name))
    return tuple(out)


MAX_NESTING = 64  # a JSON schema of tool parameters nests a handful of levels


def nesting(value: Any, limit: int = MAX_NESTING) -> int:
    """How deep lists and objects nest in `value` (iteratively: a value nested 10,000
    deep must not be a RecursionError here or in the template's `tojson` later); stops
    counting past `limit`."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        v, depth = stack.pop()
        if not isinstance(v, dict | list | tuple):
            continue
        deepest = max(deepest, depth)
        if deepest > limit:
            return deepest
        stack.extend((c, depth + 1) for c in (v.values() if isinstance(v, dict) else v))
    return deepest


def check_nesting(value: Any, where: str, param: str) -> None:
    if nesting(value) > MAX_NESTING:
        raise bad_request(f"{where} nests more than {MAX_NESTING} levels deep", param)


# Tools one request may list: far above any agent's (Codex CLI, Claude Code with MCP
# servers: a few dozen; OpenAI's own limit is 128), far below what would make the
# template's rendering the cost of a request (10,000 were accepted).
MAX_TOOLS = 512


def tool_list(body: dict) -> list:
    """The request's `tools` as a list (none: []), at most MAX_TOOLS: every API's one
    check of the list itself (each dialect then checks its items)."""
    raw = body.get("tools")
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise bad_request("'tools' must be a list", "tools")
    if len(raw) > MAX_TOOLS:
        raise bad_request(f"'tools' lists {len(raw):,} tools, more than {MAX_TOOLS}", "tools")
    return raw


def _tools(body: dict) -> tuple[dict, ...]:
    tools = tool_list(body)
    choice = body.get("tool_choice")
    if choice not in (None, "auto", "none"):
        raise bad_request(
            "'tool_choice' other than 'auto' or 'none' is not supported", "tool_choice"
        )
    if not tools or choice == "none":
        return ()
    for i, t in enumerate(tools):
        fn = t.get("function") if isinstance(t, dict) else None
        if not isinstance(t, dict) or t.get("type") != "function" or not isinstance(fn, dict):
            raise bad_request(
                f"tools[{i}] must be {{'type': 'function', 'function': {{...}}}}", "tools"
            )
        if not isinstance(fn.get("name"), str) or not fn["name"]:
            raise bad_request(f"tools[{i}].function.name is required", "tools")
        check_nesting(t, f"tools[{i}]", "tools")
    return tuple(tools)


EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh")


def reasoning_kwargs(effort: Any, param: str) -> dict:
    """A reasoning effort as template variables: `reasoning_effort` (gpt-oss's template
    reads it); "none" also switches thinking off (`enable_thinking`, Qwen3's)."""
    if effort is None:
        return {}
    if effort not in EFFORTS:
        raise bad_request(f"'{param}' {effort!r} is not one of {', '.join(EFFORTS)}", param)
    kw: dict = {"reasoning_effort": effort}
    if effort == "none":
        kw["enable_thinking"] = False
    return kw


def _template_kwargs(body: dict) -> dict:
    kw = _field_object(body, "chat_template_kwargs")
    if {"tools", "messages", "add_generation_prompt", "tokenize"} & set(kw):
        raise bad_request(
            "'chat_template_kwargs' cannot set tools/messages", "chat_template_kwargs"
        )
    check_nesting(kw, "'chat_template_kwargs'", "chat_template_kwargs")
    return dict(kw)


# --------------------------------------------------------------------------- entry points


def parse_chat(body: Any, served_model: str) -> ChatRequest:
    body = _obj(body)
    _, k_suffix = split_model(body.get("model"), served_model)
    _refuse_unsupported(body, chat=True)
    check_no_effect(body, CHAT_FIELDS)
    stream, include = _stream(body)
    k = _ext_k(body)
    return ChatRequest(
        model=body["model"],
        messages=_messages(body.get("messages")),
        sampling=_sampling(body, chat=True),
        stream=stream,
        include_usage=include,
        tools=_tools(body),
        template_kwargs={
            **reasoning_kwargs(body.get("reasoning_effort"), "reasoning_effort"),
            **_template_kwargs(body),
        },
        k=k if k is not None else k_suffix,
        speculate=_ext_speculate(body),
    )


def parse_completion(body: Any, served_model: str) -> CompletionRequest:
    body = _obj(body)
    _, k_suffix = split_model(body.get("model"), served_model)
    _refuse_unsupported(body, chat=False)
    check_no_effect(body, COMPLETION_FIELDS)
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if (
        isinstance(prompt, list)
        and prompt
        and all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in prompt)
    ):
        prompt = tuple(prompt)
    elif not isinstance(prompt, str) or not prompt:
        raise bad_request(
            "'prompt' must be a non-empty string or list of token ids (one prompt per request)",
            "prompt",
        )
    stream, include = _stream(body)
    k = _ext_k(body)
    return CompletionRequest(
        model=body["model"],
        prompt=prompt,
        sampling=_sampling(body, chat=False),
        stream=stream,
        include_usage=include,
        k=k if k is not None else k_suffix,
        speculate=_ext_speculate(body),
    )

"""Exact-history chat prompts: each turn's prompt extends the previous turn's tokens.

A multi-turn prompt is *not* a re-render of the whole chat through the template.
It is the previous turn's full token sequence (prompt + generated ids, end-of-turn
token included) followed by the templated text of the new user turn. That keeps the
KV cache a true prefix of the next prompt, so a turn prefills only its new message,
and it sidesteps templates that render a past turn differently from how it was
generated (Qwen3 drops `<think>...</think>` from earlier assistant turns; the
generation prompt's empty think block with `enable_thinking=False` also disappears).

The choice, where the template would render history differently: keep what the
model actually saw and produced (thinking included). The cost is context length
(think blocks stay in context); the gain is a cache that is always a prefix, which
hybrid models (recurrent state, untrimmable) need to reuse anything at all.

The templated delta is worked out generically, for any template: render the history
with a sentinel as the last assistant message, then render it again followed by the
new user message with the generation prompt; the text after the sentinel is the
end-of-turn text (e.g. `<|im_end|>\\n`) plus the new user turn plus the assistant
header. The end-of-turn token the model already generated is not repeated.
"""

from __future__ import annotations

import secrets
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from ssdmoe_tui.errors import SsdmoeError

Messages = Sequence[Mapping[str, Any]]
T = TypeVar("T")

# A chat template is code from the model's folder. Jinja's sandbox stops it reaching
# Python internals and caps each `range()`, not the total work: nested loops over
# `range(100000)` render for hours. Rendering is charged per line of template code run
# (a chat of a few turns costs a few thousand) and stopped past either budget.
RENDER_STEPS = 2_000_000
RENDER_SECONDS = 10.0
_JINJA_FILENAME = "<template>"  # what jinja's `from_string` compiles template code as


class ChatFormatError(ValueError):
    """The chat template cannot produce an exact-history delta for these messages."""


class ChatTemplateError(SsdmoeError):
    """The model's chat template failed (syntax, the sandbox, `raise_exception`, the
    render budget...): one line naming the template file and the reason."""


class _OverBudget(Exception):
    pass


class _Budget:
    """A per-thread `sys.settrace` hook that counts the lines of template code run."""

    def __init__(self, steps: int, seconds: float) -> None:
        self.left = steps
        self.deadline = time.monotonic() + seconds
        self.seconds = seconds
        self.steps = steps

    def trace(self, frame: Any, event: str, arg: Any) -> Any:
        if event == "call" and frame.f_code.co_filename == _JINJA_FILENAME:
            return self._line
        return None  # other code runs untraced (no per-line cost)

    def _line(self, frame: Any, event: str, arg: Any) -> Any:
        if event == "line":
            self.left -= 1
            if self.left < 0 or (self.left & 0x3FF == 0 and time.monotonic() > self.deadline):
                raise _OverBudget
        return self._line


def template_file(tokenizer: Any) -> str:
    """Where the chat template came from: chat_template.jinja / chat_template.json (newer
    layouts), else tokenizer_config.json, in the tokenizer's folder."""
    folder = Path(str(getattr(hf_tokenizer(tokenizer), "name_or_path", "") or ""))
    if str(folder) and folder.is_dir():
        for name in ("chat_template.jinja", "chat_template.json", "tokenizer_config.json"):
            if (folder / name).is_file():
                return str(folder / name)
        return f"{folder}'s chat template"
    return "the model's chat template"


def _reason(e: BaseException) -> str:
    import jinja2

    if isinstance(e, _OverBudget):
        return (
            f"rendering ran past its budget ({RENDER_STEPS:,} steps or {RENDER_SECONDS:.0f} s): "
            "a loop that does not end, or loops nested over huge ranges"
        )
    if isinstance(e, jinja2.TemplateSyntaxError):
        return f"syntax error at line {e.lineno}: {e.message}"
    if isinstance(e, jinja2.exceptions.SecurityError):
        return f"refused by the template sandbox: {e}"
    if isinstance(e, jinja2.UndefinedError):
        return f"undefined value: {e}"
    if isinstance(e, RecursionError):
        return "recursion too deep (a macro that calls itself without end?)"
    if isinstance(e, MemoryError):
        return "out of memory while rendering"
    if isinstance(e, NameError):
        return f"cannot be compiled ({e})"
    if isinstance(e, jinja2.TemplateError):  # raise_exception(...) and the rest
        return str(e) or "template error"
    text = str(e).strip().splitlines()[0] if str(e).strip() else ""
    return text or "failed while rendering"


def guarded(tokenizer: Any, call: Callable[[], T]) -> T:
    """Run `call` (something that renders the chat template) under the render budget;
    any failure of the template is a ChatTemplateError naming the file."""

    budget = _Budget(RENDER_STEPS, RENDER_SECONDS)
    previous = sys.gettrace()
    sys.settrace(budget.trace)
    try:
        return call()
    except (ChatFormatError, ChatTemplateError):
        raise
    except Exception as e:  # noqa: BLE001 - template code is the model folder's: any failure
        # of it (jinja's own errors, the budget, a NameError jinja's compiler emits for a
        # literal 1e400, a TypeError of a filter...) is the template's, said in one line
        reason = " ".join(_reason(e).split())
        reason = reason if len(reason) <= 200 else reason[:197] + "..."
        raise ChatTemplateError(f"{template_file(tokenizer)}: chat template: {reason}") from None
    finally:
        sys.settrace(previous)


def hf_tokenizer(tokenizer: Any) -> Any:
    """The Hugging Face tokenizer behind an mlx-lm `TokenizerWrapper` (or the object itself)."""
    return getattr(tokenizer, "_tokenizer", tokenizer)


def render(
    tokenizer: Any, messages: Messages, *, add_generation_prompt: bool, **template_kwargs: Any
) -> str:
    """The chat template's text for `messages` (no tokenization)."""
    tok = hf_tokenizer(tokenizer)
    if getattr(tok, "chat_template", None) is None:
        raise ChatFormatError("the tokenizer has no chat template")
    msgs = template_messages(tokenizer, messages, template_kwargs)
    kw = template_options(tokenizer, template_kwargs)
    text = guarded(
        tokenizer,
        lambda: tok.apply_chat_template(
            msgs,
            tokenize=False,
            add_generation_prompt=add_generation_prompt,
            **kw,
        ),
    )
    if not isinstance(text, str):  # some versions return a list for batched input
        raise ChatFormatError(f"chat template returned {type(text).__name__}, not text")
    return text


def _kind(tokenizer: Any, template_kwargs: Mapping[str, Any]) -> str:
    from ssdmoe_tui.prompting.reply_format import template_kind, template_text

    override = template_kwargs.get("chat_template")
    return template_kind(override if isinstance(override, str) else template_text(tokenizer))


def _harmony(tokenizer: Any, template_kwargs: Mapping[str, Any]) -> bool:
    return _kind(tokenizer, template_kwargs) == "harmony"


def template_messages(
    tokenizer: Any, messages: Messages, template_kwargs: Mapping[str, Any] | None = None
) -> list[dict[str, Any]]:
    """`messages` as the template takes them: for a harmony template, a reply kept as
    generated (channel markers in its content) is taken apart into the fields the
    template reads (`harmony.template_message`); DeepSeek's templates join a call's
    arguments as text (a JSON object fails them: "can only concatenate str"); other
    templates get the messages as they are."""
    msgs = [dict(m) for m in messages]
    kind = _kind(tokenizer, template_kwargs or {})
    if kind == "harmony":
        from ssdmoe_tui.prompting.harmony import template_message

        return [template_message(m) if m.get("role") == "assistant" else m for m in msgs]
    if kind == "deepseek":
        return [_deepseek_message(m) if m.get("tool_calls") else m for m in msgs]
    return msgs


def _deepseek_message(msg: dict[str, Any]) -> dict[str, Any]:
    import json

    calls = []
    for call in msg["tool_calls"]:
        fn = call.get("function") if isinstance(call, dict) else None
        if isinstance(fn, dict) and not isinstance(fn.get("arguments"), str):
            call = {**call, "function": {**fn, "arguments": json.dumps(fn.get("arguments") or {},
                                                                       ensure_ascii=False)}}  # fmt: skip
        calls.append(call)
    return {**msg, "tool_calls": calls}


def template_options(tokenizer: Any, template_kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """The template's variables; for a harmony template, every tool has a description
    (gpt-oss's writes `tool.description` unguarded, and the APIs make it optional)."""
    kw = dict(template_kwargs)
    tools = kw.get("tools")
    if not tools or not _harmony(tokenizer, kw):
        return kw
    kw["tools"] = [_described(t) for t in tools]
    return kw


def _described(tool: Any) -> Any:
    if not isinstance(tool, dict):
        return tool
    fn = tool.get("function")
    if isinstance(fn, dict) and "description" not in fn:
        return {**tool, "function": {**fn, "description": ""}}
    return tool


def encode(tokenizer: Any, text: str) -> list[int]:
    """Token ids of template text. Special tokens in the text (BOS, `<|im_start|>`) are
    parsed from it; none are added, as `apply_chat_template(tokenize=True)` does."""
    return list(hf_tokenizer(tokenizer).encode(text, add_special_tokens=False))


def stop_token_ids(tokenizer: Any) -> set[int]:
    """Ids that end a generated turn (mlx-lm's `eos_token_ids`, else the HF `eos_token_id`)."""
    ids = getattr(tokenizer, "eos_token_ids", None)
    if ids:
        return {int(i) for i in ids}
    eos = getattr(hf_tokenizer(tokenizer), "eos_token_id", None)
    if eos is None:
        return set()
    return {int(i) for i in eos} if isinstance(eos, Iterable) else {int(eos)}


def special_token_ids(tokenizer: Any) -> set[int]:
    tok = hf_tokenizer(tokenizer)
    ids = set(getattr(tok, "all_special_ids", []) or [])
    decoder = getattr(tok, "added_tokens_decoder", None) or {}
    ids.update(int(i) for i, t in decoder.items() if getattr(t, "special", True))
    return ids


def first_turn_tokens(tokenizer: Any, messages: Messages, **template_kwargs: Any) -> list[int]:
    """The first prompt: the whole templated chat with the generation prompt."""
    return encode(
        tokenizer, render(tokenizer, messages, add_generation_prompt=True, **template_kwargs)
    )


def user_turn_delta(
    tokenizer: Any,
    history_tokens: Sequence[int],
    history_messages: Messages,
    new_user_text: str,
    **template_kwargs: Any,
) -> list[int]:
    """Tokens to append to `history_tokens` for a new user turn.

    `history_messages` ends with the assistant turn whose generated ids end
    `history_tokens`. If that turn ended with a stop token, the template's own
    end-of-turn token is not repeated (when it differs, e.g. gpt-oss's `<|return|>`
    vs `<|end|>`, the generated one stands in for it: history stays exact). If the
    turn was cut short (stopped by the user, or max tokens), the template's
    end-of-turn text is appended to close it.
    """
    return turn_delta(
        tokenizer,
        history_tokens,
        history_messages,
        [{"role": "user", "content": new_user_text}],
        **template_kwargs,
    )


def turn_delta(
    tokenizer: Any,
    history_tokens: Sequence[int],
    history_messages: Messages,
    new_messages: Messages,
    **template_kwargs: Any,
) -> list[int]:
    """Tokens to append to `history_tokens` for any new messages after the assistant turn
    that ends it (a user turn, tool results, ...), up to the generation prompt. The last
    assistant message is rendered as a sentinel without its tool calls: what the model
    generated for it (text and calls) is already in `history_tokens`; only the text the
    template puts after it is new. A template that cannot render a tool's result without
    the call before it (gpt-oss's) is given the calls: the new text is then what follows
    the history rendered alone. Rules as in `user_turn_delta`."""
    if not history_messages or history_messages[-1].get("role") != "assistant":
        raise ChatFormatError("history must end with an assistant turn")
    if not new_messages:
        raise ChatFormatError("no new message after the assistant turn")
    sentinel = f"SSDMOE{secrets.token_hex(8)}SENTINEL"
    msgs = template_messages(tokenizer, history_messages, template_kwargs)
    last_message = msgs[-1]
    msgs[-1] = {"role": "assistant", "content": sentinel}
    with_new = msgs + [dict(m) for m in new_messages]
    try:
        text = render(tokenizer, with_new, add_generation_prompt=True, **template_kwargs)
    except ChatTemplateError:
        # A template that names a tool's result after the call before it (gpt-oss's and
        # MiniMax-M2's: "Message has tool role, but there was no previous assistant
        # message with a tool call!") needs the calls: the new text is what follows the
        # history. A reply kept as generated has them in its text: they are parsed out.
        msgs[-1] = (
            last_message
            if last_message.get("tool_calls")
            else _calls_apart(tokenizer, last_message)
        )
        if not msgs[-1].get("tool_calls"):
            raise
        return _after_history(tokenizer, msgs, new_messages, template_kwargs)
    at = text.rfind(sentinel)
    if at < 0:
        raise ChatFormatError("the chat template dropped the last assistant message")
    delta = encode(tokenizer, text[at + len(sentinel) :])
    if not delta:
        raise ChatFormatError("the chat template produced no text for the new turn")
    last = history_tokens[-1] if len(history_tokens) else None
    if last is not None and last in stop_token_ids(tokenizer):
        # The token that closes an assistant turn in the template, if any: the first
        # token after the assistant's content when the history is rendered alone.
        alone = render(tokenizer, msgs, add_generation_prompt=False, **template_kwargs)
        cut = alone.rfind(sentinel)
        closing = encode(tokenizer, alone[cut + len(sentinel) :])[:1] if cut >= 0 else []
        if closing and delta[0] == closing[0]:
            if delta[0] == last or delta[0] in special_token_ids(tokenizer):
                delta = delta[1:]
        elif _harmony(tokenizer, template_kwargs) and delta[0] == _token_id(tokenizer, "<|end|>"):
            # gpt-oss renders a reply alone with <|return|>, in the middle with <|end|>;
            # the generated <|return|> (or <|call|>) stands in for that <|end|>
            delta = delta[1:]
    return delta


def _calls_apart(tokenizer: Any, message: Mapping[str, Any]) -> dict[str, Any]:
    """An assistant message whose text holds its tool-call blocks (as the model wrote
    them) as the template takes it: the text without the blocks, and the calls apart."""
    import json

    from ssdmoe_tui.prompting.output import Call, Content, OutputFilter
    from ssdmoe_tui.prompting.reply_format import reply_format_for

    fmt = reply_format_for(tokenizer).tool
    content = message.get("content")
    if fmt is None or not isinstance(content, str) or fmt.start not in content:
        return dict(message)
    filt = OutputFilter((), fmt, [{"type": "function", "function": {"name": ""}}])
    pieces = filt.feed(content) + filt.finish()
    calls = [{"id": p.call.id, "type": "function",
              "function": {"name": p.call.name, "arguments": json.loads(p.call.arguments)}}
             for p in pieces if isinstance(p, Call)]  # fmt: skip
    text = "".join(p.text for p in pieces if isinstance(p, Content)).strip()
    return {**message, "content": text, "tool_calls": calls} if calls else dict(message)


def _token_id(tokenizer: Any, token: str) -> int | None:
    tid = hf_tokenizer(tokenizer).convert_tokens_to_ids(token)
    return tid if isinstance(tid, int) else None


def _after_history(
    tokenizer: Any, history: list[dict[str, Any]], new_messages: Messages, kw: Mapping[str, Any]
) -> list[int]:
    """The tokens the new messages add: the history rendered with them, less the history
    rendered alone (which must be its prefix, else the delta is not exact)."""
    alone = render(tokenizer, history, add_generation_prompt=False, **kw)
    text = render(tokenizer, history + [dict(m) for m in new_messages],
                  add_generation_prompt=True, **kw)  # fmt: skip
    if not text.startswith(alone) or len(text) == len(alone):
        raise ChatFormatError("the chat template renders the history differently after a tool call")
    return encode(tokenizer, text[len(alone) :])


def next_turn_tokens(
    tokenizer: Any,
    history_tokens: Sequence[int],
    history_messages: Messages,
    new_user_text: str,
    **template_kwargs: Any,
) -> list[int]:
    """The next prompt: `history_tokens` unchanged, then the templated new user turn."""
    delta = user_turn_delta(
        tokenizer, history_tokens, history_messages, new_user_text, **template_kwargs
    )
    return list(history_tokens) + delta


def prompt_tokens(
    tokenizer: Any, messages: Messages, *, raw: bool = False, **template_kwargs: Any
) -> list[int]:
    """One prompt from `messages`: the chat template with the generation prompt when the
    tokenizer has one (and not `raw`), else the contents joined by newlines, tokenized
    as plain text. The same for `generate`, the chat service and the server.
    `template_kwargs` go to the template (e.g. `enable_thinking`)."""
    from ssdmoe_tui.options import check_text

    msgs = [{**m, "content": check_text(m["content"])} for m in messages]
    if not raw and getattr(tokenizer, "chat_template", None):
        msgs = template_messages(tokenizer, msgs, template_kwargs)
        kw = template_options(tokenizer, template_kwargs)
        return list(
            guarded(
                tokenizer,
                lambda: tokenizer.apply_chat_template(msgs, add_generation_prompt=True, **kw),
            )
        )
    return list(tokenizer.encode("\n".join(m["content"] for m in msgs)))

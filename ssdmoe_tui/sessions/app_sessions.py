"""The chat app's persistence hook (`SsdmoeApp(session_store=AppSessions())`).

Runs on the UI thread and imports no MLX. `open` starts or resumes a conversation;
`record` saves each finished exchange with its exact token ids, taken from the
engine's GenerationDone (prompt ids + generated ids); `keep_tool_results` saves a
reply's tool results as each call ends, ahead of the reply that reads them; `prompt`
builds each prompt from the stored token history (`turns.build_prompt`), so the engine
gets token ids only. The engine side (`kv_hooks.SessionKV`) keeps the KV checkpoints.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from ssdmoe_tui.chat.replies import ReplyStats, ShownTurn, k_range
from ssdmoe_tui.engine.run.protocol import GenerationDone
from ssdmoe_tui.prompting.chat_format import ChatFormatError
from ssdmoe_tui.sessions.expert_set import Loaded, load_working_set
from ssdmoe_tui.sessions.store import (
    CONVERSATION_FILE,
    FINISH_REASONS,
    ROLES,
    Conversation,
    SessionNotFound,
    SessionStore,
    Turn,
    new_id,
)
from ssdmoe_tui.sessions.turns import build_prompt
from ssdmoe_tui.tools.choice import ToolChoice


def tools_key(tools: Sequence[dict] | None) -> str:
    """Names the tools a prompt was templated with ("" for none)."""
    if not tools:
        return ""
    text = json.dumps(list(tools), sort_keys=True, ensure_ascii=False, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


class AppSessions:
    def __init__(self, store: SessionStore | None = None, system_prompt: str = "") -> None:
        self.store = store or SessionStore()
        self.system_prompt = system_prompt  # for conversations this side creates

    def open(self, resume: str | None) -> tuple[str, list[ShownTurn]]:
        """None: a new conversation (its folder is made by the first turn, so an unused
        window leaves nothing behind); "": the last one; else that id."""
        if resume is None:
            return new_id(), []
        conv_id = resume or self.store.last_opened()
        if conv_id is None:
            raise SessionNotFound("no saved conversation to resume")
        conv = self.store.get(conv_id)
        self.store.mark_opened(conv.id)
        return conv.id, [shown(t) for t in conv.turns]

    def model_of(self, session_id: str) -> tuple[str, str]:
        """(name, folder) of the model the saved conversation was last written with
        ("" for what was not saved: a conversation of an older version has no folder)."""
        conv = self._stored(session_id)
        return (conv.model_id, conv.model_path) if conv is not None else ("", "")

    def working_set(self, session_id: str, info: Any) -> Loaded:
        """The experts to warm on resuming `session_id` with the model `info` (saved with
        its KV checkpoint), or none, with one line when the saved one is not usable."""
        return load_working_set(self.store.folder(session_id), info)

    def _stored(self, session_id: str) -> Conversation | None:
        folder = self.store.folder(session_id)
        return self.store.get(session_id) if (folder / CONVERSATION_FILE).exists() else None

    def settings_of(self, session_id: str) -> dict[str, Any]:
        """The conversation's saved generation settings ({} for a new conversation)."""
        conv = self._stored(session_id)
        if conv is None:
            return {}
        # A conversation saved before it had settings still has its own system prompt.
        return {"system_prompt": conv.system_prompt, **conv.settings}

    def save_settings(self, session_id: str, settings: dict[str, Any]) -> None:
        """Keep edited settings with a saved conversation (a new one gets them with its
        first reply)."""
        conv = self._stored(session_id)
        if conv is not None and conv.settings != settings:
            conv.settings = dict(settings)
            self.store.save(conv, touch=False)

    def tool_choice_of(self, session_id: str) -> ToolChoice:
        """The servers and tools the saved conversation leaves off (none for a new one)."""
        conv = self._stored(session_id)
        return conv.tool_choice if conv is not None else ToolChoice()

    def save_tool_choice(self, session_id: str, choice: ToolChoice) -> None:
        """Keep a changed choice with a saved conversation (a new one gets it with its
        first reply)."""
        conv = self._stored(session_id)
        if conv is not None and conv.tool_choice != choice:
            conv.tool_choice = choice
            self.store.save(conv, touch=False)

    def prompt(
        self,
        session_id: str,
        messages: Sequence[Any],
        tokenizer: Any,
        info: Any,
        template_kwargs: dict[str, Any] | None = None,
    ) -> list[int] | None:
        """The exact-history prompt for `messages` (the chat as the app shows it, ending
        with the new user message or a reply's tool results): the stored conversation's
        token history plus the templated new messages. Creates the conversation on its
        first turn. Returns None (the caller then templates `messages` whole: correct,
        fewer cache hits) when the stored history is not this chat (edited, or an
        exchange not recorded)."""
        msgs = [as_message(m) for m in messages]
        system = msgs[0]["content"] if msgs and msgs[0]["role"] == "system" else ""
        chat = [m for m in msgs if m["role"] in ROLES]
        start = new_start(chat)
        if start is None:
            return None
        try:
            conv = self.store.get(session_id)
        except SessionNotFound:
            if start > 0:
                return None  # a history we never stored: the caller templates it
            conv = self.store.create(info.name, info.fingerprint, system, conv_id=session_id)
        kept = take_pending(conv)  # results saved as their calls ended: templated below
        stored = [(t.role, t.text) for t in conv.turns]
        if stored != [(m["role"], m["content"]) for m in chat[:start]]:
            return None
        before = (conv.model_id, conv.fingerprint, conv.model_path, conv.tokenizer_id,
                  conv.system_prompt, conv.tools_key)  # fmt: skip
        if conv.system_prompt != system:
            # A system prompt set mid-conversation (F9): the stored ids were made under
            # the old one, so every turn is rebuilt under the new one. The whole history
            # stays in context; only its cached prefix is lost.
            if conv.turns:  # set mid-conversation: the export shows each where it began
                conv.earlier_systems.append([conv.system_since, conv.system_prompt])
                conv.system_since = len(conv.turns)
            conv.system_prompt, conv.tokenizer_id = system, ""
        offered = tools_key((template_kwargs or {}).get("tools"))
        if conv.tools_key is not None and conv.tools_key != offered and conv.turns:
            # Other tools than the stored ids were made with (F10 turned some off, a
            # server stopped offering them): the history is templated again, so the
            # model is told only of the tools it has now (its cached prefix is lost).
            conv.tokenizer_id = ""
        conv.tools_key = offered  # None (an older file): taken as it is, not rebuilt
        conv.model_id, conv.fingerprint = info.name, info.fingerprint
        conv.model_path = getattr(info, "path", "")
        try:
            prompt, _ = build_prompt(tokenizer, conv, chat[start:], **(template_kwargs or {}))
        except ChatFormatError:
            return None
        after = (conv.model_id, conv.fingerprint, conv.model_path, conv.tokenizer_id,
                 conv.system_prompt, conv.tools_key)  # fmt: skip
        if after != before:
            conv.turns += kept
            self.store.save(conv, touch=False)
        return prompt

    def forget_if_empty(self, session_id: str) -> None:
        """Delete the conversation if it has no turn: `prompt` made it for a first turn
        that was never recorded (the prompt did not fit the context, the engine failed)."""
        conv = self._stored(session_id)
        if conv is not None and not conv.turns and not conv.replaced:
            self.store.delete(session_id)

    def rewind(self, session_id: str, keep: int) -> None:
        """Before a regenerate or an edit: keep the first `keep` turns; the exchange after
        them moves to `replaced` (still in the file and the exports, never lost), so the
        next prompt is built on the kept turns' exact token ids."""
        conv = self._stored(session_id)
        if conv is None or len(conv.turns) <= keep:
            return
        conv.replaced.append(conv.turns[keep:])
        conv.turns = conv.turns[:keep]
        self.store.save(conv)

    def keep_tool_results(self, session_id: str, messages: Sequence[Any]) -> None:
        """Save the tool results that end `messages` now, each as its call ends, so a
        crash before the model's next reply loses none (`--resume` shows the call and
        its result). They are stored without token ids (their ids are the templated
        prompt that feeds them back, made once the round is complete): `prompt` and
        `record` take such a pending run off and give it its ids. Atomic (`store.save`).
        Nothing is saved when the stored conversation is not this chat."""
        chat = [m for m in messages if m.role in ROLES]
        start = new_start(chat)
        if start is None or any(m.role != "tool" for m in chat[start:]):
            return
        conv = self._stored(session_id)
        if conv is None:
            return
        take_pending(conv)
        if [(t.role, t.text) for t in conv.turns] != [(m.role, m.content) for m in chat[:start]]:
            return
        conv.turns += [new_turn(m, []) for m in chat[start:]]
        self.store.save(conv)

    def record(
        self,
        session_id: str,
        messages: Sequence[Any],
        done: GenerationDone,
        model: str = "",
        settings: dict[str, Any] | None = None,
        thinking_tokens: int = 0,
        tool_choice: ToolChoice | None = None,
    ) -> None:
        """Save the exchange `done` answered. `messages` is the app's chat so far (the
        reply last, if it kept one). The stored turns mirror the app's history; their ids
        extend the stored token history when the prompt did (the normal case), otherwise
        the conversation is re-based on this prompt so its ids stay exact."""
        if done.finish_reason == "error":
            return
        chat = [m for m in messages if m.role in ROLES]
        reply = len(chat) if not chat or chat[-1].role != "assistant" else len(chat) - 1
        start = new_start(chat[:reply])
        if start is None:
            return
        conv = self._stored(session_id)
        if conv is not None:
            take_pending(conv)  # saved as their calls ended: recorded below with their ids
        if settings is not None and "system_prompt" in settings:
            system = str(settings["system_prompt"])
        else:
            system = conv.system_prompt if conv is not None else self.system_prompt
        if conv is None:
            conv = self.store.create(system_prompt=system, conv_id=session_id)
        if settings is not None:
            conv.settings = dict(settings)
        if tool_choice is not None:
            conv.tool_choice = tool_choice
        prompt = list(done.prompt_token_ids)
        history = conv.history_tokens()
        prior = [(m.role, m.content) for m in chat[:start]]
        same = [(t.role, t.text) for t in conv.turns] == prior and conv.system_prompt == system
        conv.system_prompt = system
        if same and prompt[: len(history)] == history:
            delta = prompt[len(history) :]
        else:  # the prompt was not built on the stored ids: re-base on it
            conv.turns = rebased(conv.turns, chat[:start])
            delta = prompt
        for i, m in enumerate(chat[start:reply]):  # the run's ids go on its first turn
            conv.turns.append(new_turn(m, delta if i == 0 else []))
        if reply == len(chat) and done.finish_reason == "cancelled":
            # A reply stopped before its first token: the prompt is kept, marked, so the
            # exports say what happened (a stored reply carries its own `stopped`).
            conv.turns[-1].stopped = True
        if reply < len(chat):  # the app kept the reply
            conv.turns.append(reply_turn(chat[reply], done, model, thinking_tokens))
        self.store.save(conv)
        self.store.mark_opened(conv.id)


def as_message(m: Any) -> dict[str, Any]:
    """A chat message (`prompting.Message`, or anything with role and content) as a dict."""
    if hasattr(m, "for_template"):
        return m.for_template()
    return {"role": m.role, "content": m.content}


def reply_turn(m: Any, done: GenerationDone, model: str, thinking_tokens: int) -> Turn:
    """The reply the app kept (`m`) as a stored turn: its ids, K and figures from `done`."""
    k = max(set(done.k_per_token), key=list(done.k_per_token).count, default=None)
    k_min, k_max = k_range(done.k_per_token)
    stats = ReplyStats.from_done(done, model)
    return Turn(
        "assistant",
        m.content,
        list(done.token_ids),
        k=k,
        stopped=done.finish_reason == "cancelled",
        k_min=k_min,
        k_max=k_max,
        model=model,
        decode_tok_s=stats.decode_tok_s,
        finish=done.finish_reason if done.finish_reason in FINISH_REASONS else "",
        kv_hit_rate=stats.kv_hit_rate,
        thinking_tokens=thinking_tokens,
        tool_calls=[dict(c) for c in getattr(m, "tool_calls", ())],
    )


def new_turn(m: Any, ids: list[int]) -> Turn:
    """A user or tool message as a stored turn with these ids."""
    name, call_id = getattr(m, "name", ""), getattr(m, "tool_call_id", "")
    return Turn(m.role, m.content, ids, tool_name=name, tool_call_id=call_id)


def take_pending(conv: Conversation) -> list[Turn]:
    """Take off (and return) the tool results `keep_tool_results` saved ahead of the
    reply that reads them: the run of tool turns after the last reply whose first turn
    has no token ids yet (a recorded run carries its ids on its first turn)."""
    start = len(conv.turns)
    while start > 0 and conv.turns[start - 1].role == "tool":
        start -= 1
    run = conv.turns[start:]
    if not run or run[0].token_ids or start == 0 or conv.turns[start - 1].role != "assistant":
        return []
    conv.turns = conv.turns[:start]
    return run


def new_start(chat: Sequence[Any]) -> int | None:
    """Where the messages after the last reply start (a user message, or tool results);
    None when the chat does not end with such messages."""
    role = (lambda m: m["role"]) if chat and isinstance(chat[0], dict) else (lambda m: m.role)
    if not chat or role(chat[-1]) == "assistant":
        return None
    start = len(chat)
    while start > 0 and role(chat[start - 1]) != "assistant":
        start -= 1
    return start


def rebased(turns: Sequence[Turn], prior: Sequence[Any]) -> list[Turn]:
    """The turns `prior` names, for a conversation re-based on one prompt: the new user
    turn then carries the whole prompt's ids, the earlier turns none (the next prompt
    rebuilds them per turn: `turns.build_prompt`). A stored turn with the same role and
    text keeps its metadata (time, K, model, speed, stopped)."""
    out = []
    for i, m in enumerate(prior):
        old = turns[i] if i < len(turns) else None
        if old is not None and (old.role, old.text) == (m.role, m.content):
            out.append(replace(old, token_ids=[]))
        else:
            out.append(new_turn(m, []))
    return out


def shown(turn: Turn) -> ShownTurn:
    """A stored turn as the transcript shows it: a reply keeps its model and stats line."""
    if turn.role == "tool":
        return ShownTurn(turn.role, turn.text, name=turn.tool_name, call_id=turn.tool_call_id)
    if turn.role != "assistant":
        return ShownTurn(turn.role, turn.text)
    k_min = turn.k_min if turn.k_min is not None else turn.k
    k_max = turn.k_max if turn.k_max is not None else turn.k
    stats = ReplyStats(
        turn.model,
        len(turn.token_ids),
        turn.decode_tok_s,
        k_min,
        k_max,
        turn.kv_hit_rate,
        turn.thinking_tokens,
    )
    finish = turn.finish or ("cancelled" if turn.stopped else "stop")
    calls = tuple(dict(c) for c in turn.tool_calls)
    return ShownTurn(turn.role, turn.text, stats, turn.stopped, finish, tool_calls=calls)

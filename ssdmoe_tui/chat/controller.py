"""The chat's state, without Textual: which model is loaded, what is loading, the
conversation, the reply in flight.

The model state changes here and only here. The app calls a method for what the user
asked (`open_model`, `set_expert_cache`, `set_k`, `send`) and for what the engine said
(`model_loaded`, `engine_error`, `reply_done`); a request that cannot go now raises
`Refused` with one line for the user, and nothing changes. The loaded model stays
`model` until another one has loaded or the engine says it is gone (a fatal error), so a
typo or a bad value never costs the working model, and a bad value is never stored.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from ssdmoe_tui.chat.remote import ChatTurn
from ssdmoe_tui.chat.replies import ReplyStats, ShownTurn
from ssdmoe_tui.chat.thinking import prompt_opens_thinking, template_kwargs, thinking_tokens
from ssdmoe_tui.chat.tool_overflow import results_past_context
from ssdmoe_tui.config import ChatSettings, GenSettings
from ssdmoe_tui.engine.run.protocol import (
    EngineClient,
    EngineError,
    Generate,
    GenerationDone,
    LoadModel,
    ModelInfo,
    SetExpertCache,
    SetK,
    WarmExperts,
)
from ssdmoe_tui.errors import user_message
from ssdmoe_tui.options import CacheBudget, check_k
from ssdmoe_tui.prompting.message import Message
from ssdmoe_tui.tools.choice import ToolChoice


class Refused(Exception):
    """The request cannot go now; the message is one line for the user."""


class SessionStore(Protocol):
    """Conversation persistence (`sessions.app_sessions.AppSessions`); optional."""

    def open(self, resume: str | None) -> tuple[str, list[ShownTurn]]:
        """Start a session (or resume `resume`, "" = the latest): its id and turns."""
        ...

    def record(
        self,
        session_id: str,
        messages: Sequence[Message],
        done: GenerationDone,
        model: str = "",
        settings: dict[str, Any] | None = None,
        thinking_tokens: int = 0,
        tool_choice: ToolChoice | None = None,
    ) -> None:
        """Called after every finished reply with the whole conversation so far."""
        ...

    def prompt(
        self,
        session_id: str,
        messages: Sequence[Message],
        tokenizer: Any,
        info: ModelInfo,
        template_kwargs: dict[str, Any] | None = None,
    ) -> list[int] | None:
        """The exact-history prompt ids for `messages` (new user message last), or None
        when the stored conversation is not this chat (the template renders it then)."""
        ...

    def settings_of(self, session_id: str) -> dict[str, Any]:
        """A saved conversation's generation settings ({} if none)."""
        ...

    def save_settings(self, session_id: str, settings: dict[str, Any]) -> None: ...

    def rewind(self, session_id: str, keep: int) -> None:
        """Keep the first `keep` stored turns; the rest stays reachable as replaced."""
        ...

    def keep_tool_results(self, session_id: str, messages: Sequence[Message]) -> None:
        """Save the tool results that end `messages` (a reply's calls answered so far)
        with the conversation now, before the reply that reads them is recorded."""
        ...

    def working_set(self, session_id: str, info: ModelInfo) -> Any:
        """The experts to warm on resume: `.working_set` (None: none) and `.warning`."""
        ...


@dataclass(frozen=True)
class Loaded:
    """What `model_loaded` decided: the K to show, and warnings for the user."""

    k: int
    warnings: tuple[str, ...] = ()


@dataclass(frozen=True)
class Failure:
    """What an engine error meant: a reply ended, and/or the model is gone."""

    reply_failed: bool = False
    model_lost: bool = False


@dataclass
class ChatController:
    settings: ChatSettings
    engine: EngineClient | None = None
    sessions: SessionStore | None = None
    model: ModelInfo | None = None  # the model the engine holds and serves
    tokenizer: Any = None  # the model's tokenizer: messages become prompt ids here
    loading: str | None = None  # a model (or expert-cache change) on its way; None: none
    session_id: str | None = None
    history: list[Message] = field(default_factory=list)
    inflight: str | None = None  # request awaiting its GenerationDone
    last_done: GenerationDone | None = None
    on_warning: Callable[[str], None] | None = None  # persistence problems, one line
    _abandoned: set[str] = field(default_factory=set)
    _prompt: Message | None = None  # the user turn of the reply in flight
    _sent_request: Generate | ChatTurn | None = None  # the request of the reply in flight
    _pending_cache: str | None = None
    _wanted_k: int | None = None
    _requests: int = 0
    gen: GenSettings = field(init=False)  # the open conversation's generation settings
    thinking_inside: bool = False  # the reply in flight starts in an open <think> block
    engine_starting: bool = False  # the app builds the engine (after its first frame)
    _warm_for: str | None = None  # a resumed conversation whose experts are not warmed yet
    tools: Any = None  # tools.loop.ToolLoop when MCP servers are configured
    # The open conversation's servers and tools turned off (F10): saved with it
    # (`Conversation.tool_choice`), read back when it is opened again.
    tool_choice: ToolChoice = field(default_factory=ToolChoice)
    _sent: int = 0  # messages the request in flight appended to the history
    cannot_use_tools: str = ""  # why the loaded model cannot use the MCP tools ("" it can)

    def __post_init__(self) -> None:
        self.gen = self.defaults()

    @property
    def remote(self) -> bool:
        """The engine is a server's (`chat.remote.RemoteEngine`): it takes the chat as
        messages, its model and expert cache are the server's own."""
        return self.engine is not None and self.engine.takes_messages

    def defaults(self) -> GenSettings:
        """A new conversation's settings: the config's (and the command line's)."""
        return GenSettings.from_config(self.settings)

    # ------------------------------------------------------------------ model lifecycle

    def open_model(self, path: str, k: int | None = None) -> None:
        """Load (or switch to) a model. The current one serves until the new one has
        loaded; `k` is applied once the model's range is known."""
        if self.engine is None:
            raise Refused("The engine is not running.")
        self.abandon_reply()
        self.loading = path
        self._wanted_k = k
        self._pending_cache = None
        self.engine.submit(LoadModel(path=path, expert_cache=self.settings.expert_cache))

    def use_engine(self, engine: EngineClient | None, loading: str | None) -> EngineClient | None:
        """Another engine from now on (a server's, or this app's own again; None while
        it is built): the model the old one held goes with it, and `loading` says what
        comes next. Returns the old engine, for the caller to shut down. Not while a
        reply streams (the app refuses that first)."""
        old, self.engine = self.engine, engine
        self.model = None
        self.cannot_use_tools = ""
        self.tokenizer = None
        self.loading = loading
        self._pending_cache = None
        self._wanted_k = self.gen.k  # the conversation's K, once the new model is there
        return old

    def set_expert_cache(self, size: str) -> None:
        """Reload the model with another expert-cache budget; a bad size changes nothing."""
        try:
            CacheBudget.parse(size)
        except ValueError as e:
            raise Refused(str(e)) from None
        if self.engine is None or self.model is None:
            raise Refused("No model loaded.")
        if self.remote:
            raise Refused(
                f"{self.model.name} is served by {self.model.server}: its expert cache is "
                "the server's (--expert-cache of ssdmoe serve)"
            )
        if self.loading is not None:
            raise Refused("A model is loading; try again when it has loaded.")
        self.abandon_reply()
        self.loading = self.model.path
        self._pending_cache = size
        self._wanted_k = None
        self.engine.submit(SetExpertCache(size=size))

    def check_k(self, k: int) -> None:
        if self.model is None:
            raise Refused("No model loaded yet.")
        try:
            check_k(k, self.model.num_experts)
        except ValueError as e:
            raise Refused(str(e)) from None

    def set_k(self, k: int) -> None:
        """Applies from the next token (the engine's runner owns K). While a model loads
        the engine has no runner to take it (its error, without a request id, would read
        as a failed load): the K waits and applies once the model has loaded."""
        self.check_k(k)
        if self.loading is not None:
            self._wanted_k = k
            return
        if self.engine is not None:
            self.engine.submit(SetK(k))

    def model_loaded(self, info: ModelInfo, tokenizer: Any = None) -> Loaded:
        self.model = info
        if tokenizer is not None:
            self.tokenizer = tokenizer
        self.loading = None
        if self._pending_cache is not None:
            self.settings.expert_cache = self._pending_cache  # stored once it worked
            self._pending_cache = None
        self.warm()
        self.cannot_use_tools = self._why_no_tools()
        said = (self.cannot_use_tools,) if self.cannot_use_tools else ()
        wanted, self._wanted_k = self._wanted_k, None
        if wanted is None or wanted == info.k:
            return Loaded(info.k, said)
        try:
            self.set_k(wanted)
        except Exception as e:  # noqa: BLE001 - the model works at its own K
            why = str(e) if isinstance(e, Refused) else user_message(e)
            if self.settings.k == wanted:
                self.settings.k = None  # a bad value is not kept (nor offered again)
            return Loaded(info.k, (f"k = {wanted} not used ({why}); K is {info.k}", *said))
        return Loaded(wanted, said)

    def _why_no_tools(self) -> str:
        """One line when MCP servers are configured but the loaded model cannot use their
        tools (its template drops them, or writes no call the parser reads), else "". A
        server's model says so itself, in each reply's warnings."""
        from ssdmoe_tui.prompting.tool_support import why_no_tools

        loop = self.tools
        if loop is None or not loop.servers.configured or self.remote or self.model is None:
            return ""
        why = why_no_tools(self.tokenizer) if self.tokenizer is not None else None
        if why is None:
            return ""
        names = ", ".join(n for n, s in loop.servers.servers.items() if s.config.enabled)
        return (
            f"{self.model.name} cannot use the tools of the MCP servers configured ({names}): "
            f"{why}. F4 picks another model."
        )

    def engine_error(self, error: EngineError) -> Failure:
        """A failed reply gives its turn back (the user can send it again); a failed load
        or setting ends the loading; only a fatal error drops the model."""
        reply_failed = error.request_id is not None and error.request_id == self.inflight
        if reply_failed:
            self._abandoned.discard(error.request_id)  # type: ignore[arg-type]
            self.inflight = None
            prompt, self._prompt = self._prompt, None
            if self._prompt_is_last(prompt):  # not when its conversation has gone
                del self.history[-self._sent :]
                self._forget_if_empty()  # e.g. a first prompt longer than the context
        elif error.request_id is None:
            self.loading = None
            self._pending_cache = None
            self._wanted_k = None
        if error.fatal:
            self.model = None
        return Failure(reply_failed=reply_failed, model_lost=error.fatal)

    # ------------------------------------------------------------------ chat

    def why_not_send(self) -> str | None:
        if self.inflight is not None:
            if self.inflight in self._abandoned:
                return "Still stopping the previous reply; send again in a moment."
            return "A reply is still streaming: Esc stops it."
        if self.engine is None:
            if self.engine_starting:
                return "The engine is starting; send again in a moment."
            return "The engine is not running."
        if self.loading is not None:
            return "The model is still loading."
        if self.model is None:
            return "No model is loaded: F4 picks one, ctrl+p → Open model…"
        if self.tokenizer is None and not self.remote:
            return "The model's tokenizer is not loaded."
        return None

    def prepare(self, text: str) -> Generate | ChatTurn:
        """The Generate for one user turn, recorded as in flight; `submit` sends it (the
        app shows the empty reply in between, so no token arrives before it). Refused
        when it cannot go now. A server's engine gets the chat as messages (ChatTurn):
        the server templates it on its own exact history."""
        if why := self.why_not_send():
            raise Refused(why)
        if self.tools is not None:
            self.tools.begin()
        return self._request((Message("user", text),))

    def prepare_results(self, results: Sequence[Message]) -> Generate | ChatTurn:
        """The request that feeds a reply's tool results (`role="tool"` messages) back to
        the model, which then continues. Refused like `prepare`."""
        if why := self.why_not_send():
            raise Refused(why)
        return self._request(tuple(results))

    def keep_tool_results(self, results: Sequence[Message]) -> None:
        """The round's tool results so far, saved with the conversation as each call
        ends (before its result is shown): they were saved only with the model's next
        reply, so a crash in between lost a result the user had seen. `prepare_results`
        then feeds them as before; the store gives them their token ids then."""
        keep = getattr(self.sessions, "keep_tool_results", None)  # a store may keep none
        if keep is None or self.session_id is None or not results:
            return
        try:
            keep(self.session_id, (*self.history, *results))
        except Exception as e:  # noqa: BLE001 - persistence must not stop the tool loop
            self._warn(f"tool result not saved: {user_message(e)}")

    def tool_specs(self) -> list[dict]:
        """The tools offered to the model now (those this conversation has on), as the
        chat template takes them."""
        if self.tools is None:
            return []
        return [t.for_template() for t in self.tools.offered(self.tool_choice)]

    def set_tool_choice(self, choice: ToolChoice) -> None:
        """The servers and tools this conversation has off from now on (F10), saved with
        it; the next prompt offers the model only the others."""
        if choice == self.tool_choice:
            return
        self.tool_choice = choice
        save = getattr(self.sessions, "save_tool_choice", None)  # a store may keep none
        if save is not None and self.session_id is not None:
            try:
                save(self.session_id, choice)
            except Exception as e:  # noqa: BLE001 - it still applies in this window
                self._warn(f"tool choice not saved: {user_message(e)}")

    def split_reply(self, text: str, calls: tuple[dict[str, str], ...] = ()) -> Any:
        """A reply's text and the tool calls in it (`tools.calls.SplitReply`): none when
        no MCP server is configured. A server's reply (`calls`: what its API returned)
        has its calls apart already."""
        from ssdmoe_tui.tools.calls import SplitReply, from_dicts, split_reply

        if self.tools is None:
            return SplitReply(text, ())
        if calls or self.remote:
            return SplitReply(text, from_dicts(calls))
        return split_reply(text, self.tokenizer, self.tool_specs())

    def _request(self, new: tuple[Message, ...]) -> Generate | ChatTurn:
        prompt = new[-1]
        if self.remote:
            return self._turn(new)
        ids = self._prompt_ids(self._with_system((*self.history, *new)))
        self._prompt = prompt
        self._sent = len(new)
        self.history.extend(new)
        self.thinking_inside = prompt_opens_thinking(ids, self.tokenizer)
        self._requests += 1
        request = Generate(
            request_id=f"r{self._requests}",
            prompt_tokens=tuple(ids),
            sampling=self.gen.sampling(),
            session_id=self.session_id,
            speculate=self.gen.speculate,
        )
        self.inflight, self._sent_request = request.request_id, request
        return request

    def _turn(self, new: tuple[Message, ...]) -> ChatTurn:
        messages = self._with_system((*self.history, *new))
        self._prompt = new[-1]
        self._sent = len(new)
        self.history.extend(new)
        self.thinking_inside = False  # the server's reasoning arrives in its own block
        self._requests += 1
        request = ChatTurn(
            request_id=f"r{self._requests}",
            messages=messages,
            sampling=self.gen.sampling(),
            thinking=self.gen.thinking,
            tools=tuple(self.tool_specs()),
            speculate=self.gen.speculate,
        )
        self.inflight, self._sent_request = request.request_id, request
        return request

    def _prompt_ids(self, messages: tuple[Message, ...]) -> list[int]:
        """The conversation's exact token history plus the templated new turn (a stored
        conversation), else the whole chat through the template. One line if the
        template cannot render it."""
        from ssdmoe_tui.prompting.chat_format import prompt_tokens

        assert self.model is not None
        kw = template_kwargs(self.gen.thinking)
        if tools := self.tool_specs():
            kw["tools"] = tools
        try:
            ids = None
            if self.sessions is not None and self.session_id is not None:
                ids = self.sessions.prompt(
                    self.session_id, messages, self.tokenizer, self.model, kw
                )
            if not ids:
                ids = prompt_tokens(self.tokenizer, [m.for_template() for m in messages], **kw)
            self._check_tools_fit(len(ids), messages, kw)
            self._check_results_fit(len(ids), messages)
            return ids
        except Refused:
            self._forget_if_empty()  # made for this first turn, which does not go
            raise
        except Exception as e:  # noqa: BLE001 - a template or text error: one line, no turn
            raise Refused(user_message(e)) from None

    def _check_tools_fit(self, n: int, messages: tuple[Message, ...], kw: dict) -> None:
        """A prompt past the context only because of the MCP tools offered is refused
        naming them: the engine's refusal ("the prompt is 598,987 tokens... shorten it")
        sent the user to shorten a message of a few words. Past the context without the
        tools too, the engine's refusal stands."""
        from ssdmoe_tui.prompting.chat_format import prompt_tokens

        ctx = self.model.max_context if self.model is not None else 0
        if not ctx or n < ctx or not kw.get("tools"):
            return
        bare = {key: v for key, v in kw.items() if key != "tools"}
        without = len(prompt_tokens(self.tokenizer, [m.for_template() for m in messages], **bare))
        if without >= ctx:
            return
        servers = Counter(t.server for t in self.tools.offered(self.tool_choice))
        named = ", ".join(f"{name} ({count:,})" for name, count in servers.most_common(4))
        raise Refused(
            f"the prompt is {n:,} tokens but the model's context is {ctx:,}: the "
            f"{len(kw['tools']):,} MCP tools offered take {n - without:,} of them (server "
            f"{named}{', ...' if len(servers) > 4 else ''}); offer fewer with enabled_tools "
            "in config.toml"
        )

    def _check_results_fit(self, n: int, messages: tuple[Message, ...]) -> None:
        """A tool round's turn past the context is refused naming the tools whose
        results overflow it, before anything is sent (the engine's refusal told the
        user to shorten a message they had not written)."""
        ctx = self.model.max_context if self.model is not None else 0
        if ctx and n >= ctx:
            numbers = f"the prompt would be {n:,} tokens of {ctx:,}"
            if why := results_past_context(messages, numbers):
                raise Refused(why)

    def submit(self, request: Generate | ChatTurn) -> None:
        assert self.engine is not None
        self.engine.submit(request)

    def _with_system(self, messages: tuple[Message, ...]) -> tuple[Message, ...]:
        if self.gen.system_prompt:
            return (Message("system", self.gen.system_prompt), *messages)
        return messages

    def reply_done(self, done: GenerationDone) -> ReplyStats | None:
        """Settle the reply `done` ends: its stats for the header, or None when it is not
        one to show (another request's, or one whose conversation has gone: a new chat,
        another conversation opened). A reply abandoned while its conversation stays (a
        model or cache switch) is settled like a stopped one: what arrived is kept, so the
        history matches the screen and the next prompt does not follow an unanswered one."""
        if done.request_id != self.inflight:
            return None
        self.last_done = done
        prompt, self._prompt = self._prompt, None
        try:
            if done.request_id in self._abandoned and not self._prompt_is_last(prompt):
                return None
            if done.finish_reason != "error" and (done.text or done.tool_calls):
                self.history.append(Message("assistant", done.text, tool_calls=done.tool_calls))
            model = self.model.name if self.model else ""
            if done.k_per_token:
                self.gen.k = done.k_per_token[-1]  # the K this conversation goes on with
            thinking = thinking_tokens(
                done.token_ids, self.tokenizer, done.text, self.thinking_inside
            )
            if self.sessions is not None and self.session_id is not None:
                try:
                    self.sessions.record(
                        self.session_id,
                        tuple(self.history),
                        done,
                        model,
                        self.gen.as_dict(),
                        thinking_tokens=thinking,
                        tool_choice=self.tool_choice,
                    )
                except Exception as e:  # noqa: BLE001 - persistence must not stop the chat
                    self._warn(f"session not saved: {user_message(e)}")
            return replace(ReplyStats.from_done(done, model), thinking_tokens=thinking)
        finally:
            self._abandoned.discard(done.request_id)
            self._sent_request = None
            self.inflight = None  # last: a new prompt may go once this reply is settled

    def stop(self) -> None:
        if self.inflight is not None and self.engine is not None:
            self.engine.cancel()

    def settle_unanswered(self, text: str = "") -> None:
        """The app is closing and the engine has not answered the stop in time: the reply
        in flight is settled as stopped with what arrived (`text`), so its prompt (and its
        attachments) is saved with the conversation, as an exchange without a reply when
        nothing arrived. The engine's own GenerationDone, if it comes, is then ignored."""
        request = self._sent_request
        if self.inflight is None or request is None:
            return
        prompt = request.prompt_tokens if isinstance(request, Generate) else ()
        self.reply_done(GenerationDone(self.inflight, text, tuple(prompt), (), "cancelled", ()))

    def _forget_if_empty(self) -> None:
        """A conversation made for a first turn that never got recorded leaves no empty
        "0 turns" entry in the conversations list."""
        forget = getattr(self.sessions, "forget_if_empty", None)
        if forget is not None and self.session_id is not None:
            try:
                forget(self.session_id)
            except Exception as e:  # noqa: BLE001 - an extra list entry, nothing worse
                self._warn(f"empty conversation not removed: {user_message(e)}")

    def _prompt_is_last(self, prompt: Message | None) -> bool:
        """The conversation still ends with this reply's user turn."""
        return prompt is not None and bool(self.history) and self.history[-1] is prompt

    def abandon_reply(self) -> None:
        """Stop the streaming reply; its GenerationDone still clears `inflight` (and
        settles it, when its conversation is still the open one)."""
        if self.inflight is not None:
            self._abandoned.add(self.inflight)
            if self.engine is not None:
                self.engine.cancel()

    # ------------------------------------------------------------------ conversations

    def open_session(self, resume: str | None) -> list[ShownTurn]:
        """Start (None) or resume a conversation; raises (one line) if it cannot be read,
        leaving the current one as it was."""
        if self.sessions is None:
            self.session_id = None
            if resume is not None:
                raise Refused("--resume: saved sessions are not available here")
            return []
        session_id, turns = self.sessions.open(resume)
        saved = self.sessions.settings_of(session_id) if resume is not None else {}
        self.session_id = session_id
        chat = [t for t in turns if t.role in ("user", "assistant", "tool")]
        self.history = [
            Message(t.role, t.content, t.name, t.call_id, t.tool_calls)  # type: ignore[arg-type]
            for t in chat
        ]
        self.gen = GenSettings.from_saved(saved, self.defaults())
        choice_of = getattr(self.sessions, "tool_choice_of", None)
        self.tool_choice = (
            choice_of(session_id) if resume is not None and choice_of else ToolChoice()
        )
        self._warm_for = session_id if resume is not None else None
        self.warm()
        return turns

    def warm(self) -> None:
        """Warm resume: once a resumed conversation and a loaded model are both here, ask
        the engine to read the conversation's saved expert working set back in the
        background (its first reply then starts on a warm cache). Once per opening."""
        conv_id = self._warm_for
        find = getattr(self.sessions, "working_set", None)  # a store may keep none
        if conv_id is None or conv_id != self.session_id or find is None:
            return
        if self.engine is None or self.model is None or self.loading is not None:
            return  # model_loaded calls again
        self._warm_for = None
        if self.remote:
            return  # a server's cache is its own (and its model card has no fingerprint)
        try:
            got = find(conv_id, self.model)
        except Exception as e:  # noqa: BLE001 - a colder resume, nothing worse
            self._warn(f"expert working set not read: {user_message(e)}")
            return
        if got.warning:
            self._warn(got.warning)
        if got.working_set:
            self.engine.submit(WarmExperts(got.working_set))

    def set_gen(self, gen: GenSettings) -> None:
        """New settings for this conversation (already checked); K applies at once."""
        if gen.k is not None and gen.k != self.gen.k:
            self.set_k(gen.k)
        self.gen = gen
        if self.sessions is not None and self.session_id is not None:
            try:
                self.sessions.save_settings(self.session_id, gen.as_dict())
            except Exception as e:  # noqa: BLE001 - they still apply in this window
                self._warn(f"settings not saved: {user_message(e)}")

    def redo(self, text: str | None = None) -> Generate | ChatTurn:
        """Regenerate the last reply (`text` None: the same prompt, a new sample or, with
        temperature 0, the same greedy reply at the K now set) or edit and resend the
        last prompt. The replaced exchange is kept by the store; the prompt up to it is
        the stored exact history, so the engine reuses its KV prefix."""
        if why := self.why_not_send():
            raise Refused(why)
        last = max((i for i, m in enumerate(self.history) if m.role == "user"), default=None)
        if last is None:
            raise Refused("Nothing to regenerate yet: send a message first.")
        prompt = self.history[last].content if text is None else text
        if self.sessions is not None and self.session_id is not None:
            try:
                self.sessions.rewind(self.session_id, last)
            except Exception as e:  # noqa: BLE001 - the redo still works, less cached
                self._warn(f"conversation not updated: {user_message(e)}")
        del self.history[last:]
        return self.prepare(prompt)

    def last_prompt(self) -> str | None:
        return next((m.content for m in reversed(self.history) if m.role == "user"), None)

    def new_chat(self) -> None:
        self.abandon_reply()
        self.history.clear()
        self.gen = self.defaults()
        self.tool_choice = ToolChoice()

    def _warn(self, text: str) -> None:
        if self.on_warning is not None:
            self.on_warning(text)

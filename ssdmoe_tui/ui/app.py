"""The chat app: transcript, prompt, engine panel, K control.

The state lives in `ssdmoe_tui.chat.controller.ChatController` (no Textual): this
module shows it. The engine thread posts each protocol event as its own typed message
(`ui.messages`), handled here with `@on`; screens and the palette post request messages
instead of calling the app. Nothing here imports mlx or safetensors
(tests/test_ui_layering.py checks).
"""

from __future__ import annotations

import asyncio
import functools
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from textual import on
from textual.app import App, ComposeResult, SystemCommand
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.css.query import NoMatches
from textual.screen import Screen
from textual.widgets import Footer

from ssdmoe_tui.chat.controller import ChatController, Engine, Refused, SessionStore
from ssdmoe_tui.chat.progress import LoadProgress
from ssdmoe_tui.chat.replies import ShownTurn
from ssdmoe_tui.config import (
    DEFAULT_THEME,
    ChatSettings,
    GenSettings,
    config_path,
    set_config_value,
)
from ssdmoe_tui.engine.protocol import EngineError, Generate, GenerationDone, ModelInfo
from ssdmoe_tui.errors import user_message
from ssdmoe_tui.ui.commands import SsdmoeCommands
from ssdmoe_tui.ui.messages import (
    AskModelPath,
    ConversationDeleted,
    EngineFailed,
    EngineNotice,
    ModelReady,
    OpenConversation,
    OpenModel,
    PhaseEntered,
    ReplyDone,
    RequestExpertCache,
    RequestK,
    SampleArrived,
    TokensArrived,
    engine_message,
)
from ssdmoe_tui.ui.screens.conversations import (
    ConversationOps,
    ConversationsScreen,
    is_saved,
    resumed_notice,
    store_of,
)
from ssdmoe_tui.ui.screens.dialogs import AskScreen, ConfirmScreen
from ssdmoe_tui.ui.screens.gen_settings import GenSettingsScreen
from ssdmoe_tui.ui.screens.keys import KeysScreen
from ssdmoe_tui.ui.screens.models import OTHER, ModelsScreen
from ssdmoe_tui.ui.theming import load_themes
from ssdmoe_tui.ui.widgets.engine_panel import PHASE_LABELS, EnginePanel
from ssdmoe_tui.ui.widgets.k_slider import KSlider
from ssdmoe_tui.ui.widgets.prompt_input import PromptInput
from ssdmoe_tui.ui.widgets.status_bar import StatusBar
from ssdmoe_tui.ui.widgets.transcript import (
    AssistantMessage,
    ChatMessage,
    Transcript,
)
from ssdmoe_tui.ui.widgets.welcome import Welcome

__all__ = ["ChatSettings", "SsdmoeApp"]

EngineFactory = Callable[[Callable[[object], None]], Engine]
K_ECHO_GRACE_S = 1.0  # samples this soon after a K change may predate it: not reflected


def default_engine(post: Callable[[object], None]) -> Engine:
    # Imported here: the service module is light, but keeping the import lazy lets the
    # UI start (and tests build it) even where the engine cannot.
    from ssdmoe_tui.engine.service import EngineService

    return EngineService(post=post)  # no persistence: `commands/chat.py` injects it


def while_mounted(handler: Callable) -> Callable:
    """An engine message may land while the app exits and its widgets are gone."""

    @functools.wraps(handler)
    async def run(self: SsdmoeApp, message: Any) -> None:
        try:
            await handler(self, message)
        except NoMatches:
            if self.is_running and not self._exit:
                raise  # a real bug; while exiting, the widgets are simply gone

    return run


class SsdmoeApp(App[int]):
    CSS_PATH = "app.tcss"
    TITLE = "ssdmoe"
    COMMANDS = App.COMMANDS | {SsdmoeCommands}
    ENABLE_COMMAND_PALETTE = True
    HORIZONTAL_BREAKPOINTS = [(0, "-narrow"), (100, "-wide")]
    VERTICAL_BREAKPOINTS = [(0, "-short"), (36, "-tall")]
    BINDINGS = [
        Binding("ctrl+q", "quit", "Quit", id="app.quit", priority=True),
        Binding("escape", "stop", "Stop", id="app.stop"),
        Binding("ctrl+n", "new_chat", "New chat", id="app.new_chat"),
        Binding("ctrl+down", "k_step(-1)", "K−", id="app.k_down"),
        Binding("ctrl+up", "k_step(1)", "K+", id="app.k_up"),
        Binding("f2", "toggle_panel", "Panel", id="app.toggle_panel"),
        Binding("f1", "keys", "Keys", id="app.keys"),
        Binding("ctrl+o,f3", "conversations", "Conversations", show=False, id="app.conversations"),
        Binding("f4", "models", "Switch model", show=False, id="app.models"),
        Binding(
            "ctrl+p", "command_palette", "Commands", show=False, id="app.palette", priority=True
        ),
        Binding("ctrl+end", "pin", "Follow", show=False, id="app.pin"),
        # Not ctrl+y (the prompt, a TextArea, takes it as redo) nor F5-F7 (it selects with them).
        Binding("f8", "copy_last", "Copy reply", show=False, id="app.copy_last"),
        Binding("ctrl+g", "regenerate", "Regenerate", show=False, id="app.regenerate"),
        Binding("ctrl+l", "edit_last", "Edit last prompt", show=False, id="app.edit_last"),
        Binding("f9", "gen_settings", "Settings", show=False, id="app.settings"),
    ]

    def __init__(
        self,
        settings: ChatSettings | None = None,
        *,
        engine_factory: EngineFactory | None = default_engine,
        session_store: SessionStore | None = None,
    ) -> None:
        """`engine_factory=None` starts no engine: events can then be fed with
        `feed()` (the layout snapshot test does this for fixed values)."""
        super().__init__()
        self.settings = settings or ChatSettings()
        self.engine_factory = engine_factory
        self.session_store = session_store
        self.chat = ChatController(
            self.settings,
            sessions=session_store,
            on_warning=lambda text: self.notify(text, severity="warning", markup=False),
        )
        self.current: AssistantMessage | None = None
        self.load_progress = LoadProgress()
        self.editing = False  # the prompt holds the last prompt, to be edited and resent
        self._finishing: str | None = None  # a finished reply whose widget is settling
        self.events_seen: dict[str, int] = {}
        self._fallback_theme: str | None = None
        themes, self._theme_warnings = load_themes()
        for theme in themes:
            self.register_theme(theme)

    # The chat's state, read through (tests and screens read these names).
    @property
    def engine(self) -> Engine | None:
        return self.chat.engine

    @property
    def model_info(self) -> ModelInfo | None:
        return self.chat.model

    @property
    def loading_path(self) -> str | None:
        return self.chat.loading

    @property
    def session_id(self) -> str | None:
        return self.chat.session_id

    @property
    def history(self) -> list:
        return self.chat.history

    @property
    def inflight(self) -> str | None:
        """The reply in flight, until its widget has settled too."""
        return self.chat.inflight or self._finishing

    @property
    def last_done(self) -> GenerationDone | None:
        return self.chat.last_done

    # ------------------------------------------------------------------ layout

    def compose(self) -> ComposeResult:
        yield StatusBar(id="status")
        with Horizontal(id="main"):
            with Vertical(id="chat"):
                yield Transcript(id="transcript")
                yield PromptInput(
                    id="prompt", placeholder="Ask anything (Enter sends, ctrl+j newline)"
                )
            yield EnginePanel(id="panel")
        yield Footer()

    @property
    def transcript(self) -> Transcript:
        return self.query_one(Transcript)

    @property
    def panel(self) -> EnginePanel:
        return self.query_one(EnginePanel)

    @property
    def status_bar(self) -> StatusBar:
        return self.query_one(StatusBar)

    @property
    def prompt(self) -> PromptInput:
        return self.query_one(PromptInput)

    @property
    def k_control(self) -> KSlider:
        return self.query_one(KSlider)

    @property
    def welcome(self) -> Welcome | None:
        found = self.query(Welcome)
        return found.first() if found else None

    async def on_mount(self) -> None:
        self._apply_theme(self.settings.theme)
        self.theme_changed_signal.subscribe(self, self._remember_theme)
        self._apply_keymap(self.settings.keymap)
        for warning in (*self.settings.warnings, *self._theme_warnings):
            self.notify(warning, severity="warning", timeout=10, markup=False)
        self.prompt.focus()
        await self._open_session(self.settings.resume)
        if self.engine_factory is not None and not self.settings.model and not self.history:
            await self.transcript.mount(Welcome())  # the demo model: say what happens
        if self.engine_factory is not None:
            try:
                self.chat.engine = self.engine_factory(self._post_from_engine)
                self.chat.engine.start()
            except Exception as e:  # noqa: BLE001 - e.g. MLX missing: say so, keep the UI
                self.chat.engine = None
                self.status_bar.phase = "no engine"
                self.notify(f"the engine did not start: {user_message(e)}", severity="error")
                return
            self.open_model(self.settings.model, k=self.chat.gen.k)

    async def on_unmount(self) -> None:
        engine, self.chat.engine = self.chat.engine, None
        if engine is not None:
            engine.cancel()
            await asyncio.to_thread(engine.shutdown, 5.0)

    def _apply_theme(self, name: str) -> None:
        if name in self.available_themes:
            self.theme = name
            return
        self.notify(
            f"unknown theme {name!r}; using {DEFAULT_THEME} (config.toml is left as it is)",
            severity="warning",
            markup=False,
        )
        self._fallback_theme = DEFAULT_THEME  # not the user's choice: never written back
        self.theme = DEFAULT_THEME

    def _apply_keymap(self, keymap: dict[str, str]) -> None:
        known = {b.id for _, bindings in self.binding_groups() for b in bindings if b.id}
        unknown = sorted(set(keymap) - known)
        if unknown:
            self.notify(
                f"config keymap: unknown binding id(s) {', '.join(unknown)} (F1 lists them)",
                severity="warning",
            )
        self.set_keymap({k: v for k, v in keymap.items() if k in known})

    def binding_groups(self) -> list[tuple[str, list[Binding]]]:
        def of(cls: type) -> list[Binding]:
            return [b for b in cls.BINDINGS if isinstance(b, Binding)]

        return [
            ("app", of(SsdmoeApp)),
            ("prompt", of(PromptInput)),
            ("transcript", of(Transcript)),
            ("message", of(ChatMessage)),
            ("K control", of(KSlider)),
            ("dialogs", of(ConfirmScreen) + of(AskScreen) + of(GenSettingsScreen)),
            ("conversations", of(ConversationsScreen)),
            ("models", of(ModelsScreen)),
        ]

    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        for command in super().get_system_commands(screen):
            if command.title != "Keys":  # ours (F1) lists every binding with its id
                yield command

    # ------------------------------------------------------------------ engine link

    def _post_from_engine(self, event: object) -> None:
        """Called on the engine thread: queue the event's message, never block."""
        message = engine_message(event)
        if message is None:
            return
        name = type(event).__name__
        self.events_seen[name] = self.events_seen.get(name, 0) + 1
        try:
            self.post_message(message)
        except RuntimeError:  # the app's loop has closed (shutting down)
            pass

    def feed(self, event: object) -> None:
        """Deliver an event as if the engine had posted it."""
        self._post_from_engine(event)

    @on(TokensArrived)
    @while_mounted
    async def _tokens(self, message: TokensArrived) -> None:
        event = message.event
        if self.current is not None and event.request_id == self.current.request_id:
            await self.current.append(event.text)

    @on(SampleArrived)
    @while_mounted
    async def _sample(self, message: SampleArrived) -> None:
        sample = message.event
        self.panel.show_sample(sample)
        # The K control shows the K the engine decodes with (a token's K), unless the user
        # has just moved it (a sample taken before the change reached the engine would
        # undo it on screen). Idle samples may predate a K set between replies.
        control = self.k_control
        decoding = self.chat.inflight is not None and sample.generated_tokens > 0
        recent = time.monotonic() - control.user_changed_at < K_ECHO_GRACE_S
        if decoding and sample.k and control.num_experts and sample.k != control.k and not recent:
            control.set_k(sample.k, notify=False)
            self.status_bar.k = control.k

    @on(PhaseEntered)
    @while_mounted
    async def _phase(self, message: PhaseEntered) -> None:
        event = message.event
        self.panel.show_phase(event)
        if event.phase in ("loading", "indexing") and self.chat.loading is not None:
            self.load_progress.update(event.phase, event.done, event.total, event.detail)
            self.panel.show_load(self.load_progress)
            if welcome := self.welcome:
                welcome.show_progress(event.phase, event.done, event.total, event.detail)
        label = PHASE_LABELS.get(event.phase, event.phase)
        if event.total and event.phase in ("prefill", "loading", "indexing"):
            label += f" {event.done}/{event.total}"
        self.status_bar.phase = label

    @on(ReplyDone)
    @while_mounted
    async def _reply_done(self, message: ReplyDone) -> None:
        await self._on_done(message.event)

    @on(ModelReady)
    @while_mounted
    async def _model_ready(self, message: ModelReady) -> None:
        info = message.event.info
        loaded = self.chat.model_loaded(info)
        if welcome := self.welcome:
            welcome.loaded(info.name)
        self.panel.show_model(info, k=loaded.k)
        self.status_bar.loading = ""
        self.status_bar.k = loaded.k
        self.status_bar.info = info
        source = " from the repacked copy" if info.expert_source == "repacked" else ""
        slots = f", {info.slot_placement} slots" if info.slot_placement != "none" else ""
        await self.transcript.add_notice(
            f"Loaded {info.name} ({info.model_type}): {info.num_experts} experts in "
            f"{info.num_layers} MoE layers, trained K {info.trained_k}, K {loaded.k}, "
            f"{info.device} {info.dtype}, {info.reader} reader{source}{slots}."
        )
        for warning in loaded.warnings:
            self.notify(warning, severity="warning", timeout=10, markup=False)
        if info.expert_source_note:
            self.notify(f"Repacked copy not used: {info.expert_source_note}", timeout=8)

    @on(EngineFailed)
    @while_mounted
    async def _engine_failed(self, message: EngineFailed) -> None:
        await self._on_error(message.event)

    @on(EngineNotice)
    def _engine_notice(self, message: EngineNotice) -> None:
        self.notify(message.event.message, timeout=8, markup=False)

    async def _on_done(self, done: GenerationDone) -> None:
        if done.request_id != self.chat.inflight:
            return
        message, self.current = self.current, None
        self._finishing = done.request_id
        try:
            stats = self.chat.reply_done(done)
            if stats is not None and message is not None and message.is_attached:
                await message.finish(done.text, done.finish_reason, stats.detail())
        finally:
            self._finishing = None

    async def _on_error(self, error: EngineError) -> None:
        self.notify(error.message, title="engine error", severity="error", timeout=12, markup=False)
        failure = self.chat.engine_error(error)
        if failure.reply_failed:
            message, self.current = self.current, None
            if message is not None and message.is_attached:
                await message.finish(message.text, "error", error.message)
        self.status_bar.loading = ""
        self.status_bar.info = self.chat.model
        if failure.model_lost:
            if welcome := self.welcome:
                welcome.failed(error.message)
            self.status_bar.phase = "idle"
            self.panel.show_model(None)
            await self.transcript.add_notice(
                f"No model loaded: {error.message}  (F4 or ctrl+p → Open model…)",
                classes="error",
            )
        elif error.request_id is None and self.chat.model is not None:
            await self.transcript.add_notice(
                f"{self.chat.model.name} is still loaded and unchanged: {error.message}",
                classes="error",
            )

    # ------------------------------------------------------------------ chat

    @on(PromptInput.Submitted)
    async def _on_prompt(self, event: PromptInput.Submitted) -> None:
        if self.editing:
            await self.redo(event.text)
        else:
            await self.send(event.text)

    async def send(self, text: str) -> bool:
        """Send one user turn; False (with a notice) when it cannot go now."""
        if why := self.chat.why_not_send():
            self.notify(why, severity="warning")
            return False
        self.prompt.clear()
        await self.transcript.add_user(text)
        await self._start_reply(self.chat.prepare(text))
        return True

    async def redo(self, text: str | None = None) -> bool:
        """Regenerate the last reply (`text` None) or resend the edited last prompt; the
        replaced turns stay on screen, marked, and in the conversation file."""
        try:
            request = self.chat.redo(text)
        except Refused as e:
            self.notify(str(e), severity="warning")
            return False
        self.editing = False
        self.prompt.clear()
        messages = self.transcript.messages()
        last_user = max(
            (i for i, m in enumerate(messages) if not isinstance(m, AssistantMessage)), default=0
        )
        for message in messages[last_user if text is not None else last_user + 1 :]:
            if not message.has_class("replaced"):
                message.mark_replaced()
        if text is not None:
            await self.transcript.add_user(text)
        await self._start_reply(request)
        return True

    def action_regenerate(self) -> None:
        self.call_later(self.redo)

    def action_edit_last(self) -> None:
        text = self.chat.last_prompt()
        if text is None:
            self.notify("No prompt to edit yet.", severity="warning")
            return
        if why := self.chat.why_not_send():
            self.notify(why, severity="warning")
            return
        self.editing = True
        self.prompt.load_text(text)
        self.prompt.move_cursor(self.prompt.document.end)
        self.prompt.focus()
        self.notify("Editing the last prompt: Enter resends it, Esc cancels.")

    def action_gen_settings(self) -> None:
        if isinstance(self.screen, GenSettingsScreen):
            return
        current = replace(self.chat.gen, k=self.k_control.k if self.model_info else None)
        experts = self.model_info.num_experts if self.model_info else 0

        def chosen(gen: GenSettings | None) -> None:
            if gen is None:
                return
            try:
                self.chat.set_gen(gen)
            except Refused as e:
                self.notify(str(e), severity="error")
                return
            if gen.k is not None and self.model_info is not None:
                self.k_control.set_k(gen.k, notify=False)
                self.status_bar.k = self.k_control.k
            self.notify("Settings saved for this conversation.")

        self.push_screen(GenSettingsScreen(current, experts), chosen)

    async def _start_reply(self, request: Generate) -> None:
        assert self.chat.model is not None
        self.current = await self.transcript.add_assistant(request.request_id, self.chat.model.name)
        self.transcript.action_pin()
        self.panel.clear_history()
        self.chat.submit(request)
        return True

    def action_stop(self) -> None:
        """Stop the streaming reply; what arrived stays, marked as stopped."""
        self.chat.stop()

    async def action_new_chat(self) -> None:
        self._abandon_reply()
        self.editing = False
        self.chat.new_chat()
        await self.transcript.clear()
        self.panel.clear_history()
        await self._open_session(None)
        await self.transcript.add_notice("New chat.")
        self.prompt.focus()

    def _abandon_reply(self) -> None:
        self.chat.abandon_reply()
        self.current = None

    async def _open_session(self, resume: str | None) -> None:
        try:
            turns = self.chat.open_session(resume)
        except Refused as e:
            self.notify(str(e), severity="warning")
            return
        except Exception as e:  # noqa: BLE001 - a bad session file must not stop the chat
            self.notify(f"could not open the session: {user_message(e)}", severity="error")
            self.chat.session_id = None
            return
        await self._show_turns(turns)
        if resume is not None and self.session_id is not None:
            await self.transcript.add_notice(resumed_notice(store_of(self), self.session_id, None))

    async def _show_turns(self, turns: Sequence[ShownTurn]) -> None:
        for turn in turns:
            if turn.role == "user":
                await self.transcript.add_user(turn.content)
            elif turn.role == "assistant":
                stats = turn.reply
                message = await self.transcript.add_assistant("", stats.model if stats else "")
                reason = "cancelled" if turn.stopped else "stop"
                await message.finish(turn.content, reason, stats.detail() if stats else "")

    # ------------------------------------------------------------------ conversations

    def action_conversations(self) -> None:
        store = store_of(self)
        if store is None:
            self.notify("Conversations are not saved in this window.", severity="warning")
        elif not isinstance(self.screen, ConversationsScreen):
            self.push_screen(ConversationsScreen(store, self.session_id), self._conversation_chosen)

    async def _conversation_chosen(self, conv_id: str | None) -> None:
        if conv_id:
            await self.open_conversation(conv_id)

    @on(OpenConversation)
    async def _open_conversation_requested(self, message: OpenConversation) -> None:
        await self.open_conversation(message.conv_id)

    async def open_conversation(self, conv_id: str) -> bool:
        """Show a saved conversation in this window; its KV checkpoint loads (engine side)
        with the next turn. The current chat stays as it is if this fails."""
        if conv_id == self.session_id:
            return True
        if self.inflight is not None or self.session_store is None:
            why = "saved conversations are not available here"
            if self.inflight is not None:
                why = "a reply is still streaming: Esc stops it first"
            self.notify(f"Not opened: {why}.", severity="warning")
            return False
        before = (self.chat.session_id, list(self.chat.history))
        try:
            turns = self.chat.open_session(conv_id)
        except Exception as e:  # noqa: BLE001 - one line; the current chat is untouched
            self.chat.session_id, self.chat.history = before
            self.notify(
                f"could not open the conversation: {user_message(e)}",
                severity="error",
                markup=False,
            )
            return False
        await self.transcript.clear()
        self.panel.clear_history()
        await self._show_turns(turns)
        self.editing = False
        if self.chat.gen.k is not None and self.model_info is not None:
            self.request_k(self.chat.gen.k)  # the conversation goes on at its own K
        model = self.model_info.name if self.model_info else None
        await self.transcript.add_notice(resumed_notice(store_of(self), conv_id, model))
        self.transcript.action_pin()
        self.prompt.focus()
        return True

    @on(ConversationDeleted)
    def conversation_deleted(self, message: ConversationDeleted) -> None:
        """The open conversation was deleted: the window starts a new one (its text
        would otherwise be saved again by the next turn)."""
        if message.conv_id == self.session_id:
            self.call_later(self.action_new_chat)

    def _saved_conversation(self) -> tuple[ConversationOps, str] | None:
        store = store_of(self)
        if store is None:
            self.notify("Conversations are not saved in this window.", severity="warning")
            return None
        if not is_saved(store, self.session_id):
            self.notify("This chat is saved after its first reply.", severity="warning")
            return None
        return ConversationOps(self, store), self.session_id  # type: ignore[return-value]

    def action_rename_conversation(self) -> None:
        if found := self._saved_conversation():
            found[0].rename(found[1])

    def action_delete_conversation(self) -> None:
        if found := self._saved_conversation():
            found[0].delete(found[1])

    def action_export_conversation(self, fmt: str) -> None:
        if found := self._saved_conversation():
            found[0].export(found[1], fmt)

    async def action_quit(self) -> None:
        if isinstance(self.screen, ConfirmScreen):
            return  # already asking
        if self.inflight is None:
            self.exit(0)
            return

        def answered(yes: bool | None) -> None:
            if yes:
                self.action_stop()
                self.exit(0)

        self.push_screen(
            ConfirmScreen("A reply is streaming. Quit anyway?", yes="Quit", no="Keep going"),
            answered,
        )

    def action_pin(self) -> None:
        self.transcript.action_pin()

    def action_copy_last(self) -> None:
        replies = [m for m in self.transcript.messages() if isinstance(m, AssistantMessage)]
        if replies and replies[-1].text:
            replies[-1].action_copy_message()
        else:
            self.notify("No reply to copy yet.", severity="warning")

    def action_keys(self) -> None:
        if not isinstance(self.screen, KeysScreen):
            self.push_screen(KeysScreen(self.binding_groups(), dict(self.settings.keymap)))

    def action_toggle_panel(self) -> None:
        panel = self.panel
        panel.display = not panel.display
        if not panel.display and self.focused is not None and panel in self.focused.ancestors:
            self.prompt.focus()

    # ------------------------------------------------------------------ K, cache, model

    @on(KSlider.Changed)
    def _on_k_changed(self, event: KSlider.Changed) -> None:
        self.status_bar.k = event.k
        try:
            self.chat.set_k(event.k)  # thread-safe; applies from the next token
        except Refused as e:
            self.notify(str(e), severity="error")

    def action_k_step(self, delta: int) -> None:
        control = self.k_control
        if not control.num_experts:
            self.notify("No model loaded yet.", severity="warning")
            return
        control.set_k(control.k + delta)

    @on(RequestK)
    def _k_requested(self, message: RequestK) -> None:
        self.request_k(message.k)

    def request_k(self, k: int) -> None:
        try:
            self.chat.check_k(k)
        except Refused as e:
            self.notify(str(e), severity="error")
            return
        self.k_control.set_k(k)

    def action_ask_k(self) -> None:
        control = self.k_control
        if not control.num_experts:
            self.notify("No model loaded yet.", severity="warning")
            return

        def done(value: str | None) -> None:
            if value:
                try:
                    self.request_k(int(value))
                except ValueError:
                    self.notify(f"K must be a whole number, not {value!r}", severity="error")

        self.push_screen(
            AskScreen(
                f"K (experts per token), 1..{control.num_experts}",
                str(control.k),
                hint=f"The model was trained with K = {control.trained_k}; lower is faster, "
                "and trades quality for speed.",
            ),
            done,
        )

    @on(RequestExpertCache)
    def _cache_requested(self, message: RequestExpertCache) -> None:
        self.request_expert_cache(message.size)

    def request_expert_cache(self, size: str) -> None:
        """The engine reloads the model with the new budget (ModelLoaded follows); a
        bad size is refused here and changes nothing."""
        try:
            self.chat.set_expert_cache(size)
        except Refused as e:
            self.notify(str(e), severity="error", markup=False)
            return
        self.current = None
        model = self.chat.model
        self.status_bar.loading = f"{model.name if model else ''} with a {size} expert cache"

    def action_ask_expert_cache(self) -> None:
        current = self.model_info.expert_cache_budget if self.model_info else None
        hint = f"Now {current:,} bytes. " if current is not None else ""

        def done(value: str | None) -> None:
            if value:
                self.request_expert_cache(value)

        self.push_screen(
            AskScreen("Expert-cache budget", "auto", hint=hint + "auto, 512M, 4G, ..."), done
        )

    @on(OpenModel)
    def _open_model_requested(self, message: OpenModel) -> None:
        self.open_model(message.path)

    def open_model(self, path: str, k: int | None = None) -> None:
        """Load (or switch to) a model; progress and errors arrive as events. The loaded
        model stays loaded if this one fails."""
        try:
            self.chat.open_model(path, k)
        except Refused as e:
            self.notify(str(e), severity="warning")
            return
        self.current = None
        self.load_progress = LoadProgress()
        self.status_bar.loading = path or "the demo model"

    def action_models(self) -> None:
        if isinstance(self.screen, ModelsScreen):
            return
        current = self.model_info.path if self.model_info else self.loading_path

        def chosen(path: str | None) -> None:
            if path is None:
                return
            if path == OTHER:
                self.action_ask_model()
            elif self.model_info is not None and path and Path(path) == Path(self.model_info.path):
                self.notify(f"{self.model_info.name} is already loaded.", markup=False)
            else:
                self.open_model(path)

        # The loaded model's own folder is listed even when no scanned folder holds it.
        extra = [self.model_info.path] if self.model_info else []
        self.push_screen(ModelsScreen(current, extra), chosen)

    @on(AskModelPath)
    def action_ask_model(self) -> None:
        def done(value: str | None) -> None:
            if value is not None:
                self.open_model(os.path.expanduser(value))

        self.push_screen(
            AskScreen(
                "Open model",
                self.model_info.path if self.model_info else "",
                placeholder="/path/to/checkpoint or org/repo (empty: the demo model)",
                hint="A folder with config.json and *.safetensors, or a Hugging Face repo id.",
            ),
            done,
        )

    def action_open_model_folder(self) -> None:
        if self.model_info is None:
            self.notify("No model loaded.", severity="warning")
            return
        folder = Path(self.model_info.path)
        opener = "open" if sys.platform == "darwin" else "xdg-open"
        has_display = sys.platform == "darwin" or bool(
            os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY")
        )
        if has_display and shutil.which(opener):
            subprocess.Popen(  # noqa: S603 - fixed program, path as one argument
                [opener, str(folder)],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )
        self.copy_to_clipboard(str(folder))
        self.notify(f"{folder}  (path copied)", title="model folder")

    def action_show_config_path(self) -> None:
        path = self.settings.config.path if self.settings.config else config_path()
        self.copy_to_clipboard(str(path))
        self.notify(f"{path}  (path copied)", title="config")

    # ------------------------------------------------------------------ themes

    def choose_theme(self, name: str) -> None:
        self.theme = name

    def _remember_theme(self, theme: Any) -> None:
        if self._fallback_theme is not None and theme.name == self._fallback_theme:
            self._fallback_theme = None  # the fallback for an unknown theme: not a choice
            return
        self._fallback_theme = None
        loaded = self.settings.config
        if loaded is None or theme.name == self.settings.theme:
            return
        self.settings.theme = theme.name
        problem = set_config_value(loaded, "theme", theme.name)
        if problem:
            self.notify(f"theme {theme.name}: {problem}", severity="warning")

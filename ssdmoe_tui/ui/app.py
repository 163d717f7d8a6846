"""The chat app: transcript, prompt, engine panel, K control.

The engine thread owns MLX. This app only sends commands (`submit`, `set_k`,
`cancel`) and receives protocol events, each wrapped in an `EngineEvent` message
and handed to `App.post_message`, which is thread-safe and never blocks the engine.
Nothing here imports mlx or safetensors (tests/test_ui_layering.py checks).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from textual import on
from textual.app import App, ComposeResult, SystemCommand
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.css.query import NoMatches
from textual.message import Message as TextualMessage
from textual.screen import Screen
from textual.widgets import Footer

from ssdmoe_tui.config import DEFAULT_THEME, LoadedConfig, config_path, set_config_value
from ssdmoe_tui.engine.protocol import (
    EngineError,
    Generate,
    GenerationDone,
    LoadModel,
    Message,
    ModelInfo,
    ModelLoaded,
    Notice,
    PhaseChanged,
    SetExpertCache,
    StatsSample,
    Tokens,
)
from ssdmoe_tui.ui.commands import SsdmoeCommands
from ssdmoe_tui.ui.fmt import fmt_rate
from ssdmoe_tui.ui.screens.conversations import (
    ConversationOps,
    ConversationsScreen,
    is_saved,
    resumed_notice,
    store_of,
)
from ssdmoe_tui.ui.screens.dialogs import AskScreen, ConfirmScreen
from ssdmoe_tui.ui.screens.keys import KeysScreen
from ssdmoe_tui.ui.screens.models import ModelsScreen
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


class Engine(Protocol):
    """What the app needs from `ssdmoe_tui.engine.service.EngineService`."""

    def start(self) -> None: ...
    def submit(self, command: Any) -> None: ...
    def set_k(self, k: int) -> None: ...
    def cancel(self) -> None: ...
    def shutdown(self, timeout: float = 5.0) -> None: ...


class SessionStore(Protocol):
    """Hook for conversation persistence (built elsewhere; the app works without it)."""

    def open(self, resume: str | None) -> tuple[str, list[Message]]:
        """Start a session (or resume `resume`, "" = the latest); returns its id and turns."""
        ...

    def record(self, session_id: str, messages: Sequence[Message], done: GenerationDone) -> None:
        """Called after every finished reply with the whole conversation so far."""
        ...


EngineFactory = Callable[[Callable[[object], None]], Engine]


def default_engine(post: Callable[[object], None]) -> Engine:
    # Imported here: the service module is light, but keeping the import lazy lets the
    # UI start (and tests build it) even where the engine cannot.
    from ssdmoe_tui.engine.service import EngineService

    return EngineService(post=post)  # no persistence: `commands/chat.py` injects it


@dataclass
class ChatSettings:
    """Everything the app starts from: config.toml merged with CLI flags."""

    model: str = ""  # "" = the embedded demo model
    k: int | None = None
    expert_cache: str = "auto"
    theme: str = DEFAULT_THEME
    max_tokens: int = 1024
    system_prompt: str = ""
    keymap: dict[str, str] = field(default_factory=dict)
    resume: str | None = None
    config: LoadedConfig | None = None  # where to remember the theme; None: never write
    warnings: tuple[str, ...] = ()


class EngineEvent(TextualMessage):
    """A protocol event from the engine thread."""

    def __init__(self, event: object) -> None:
        super().__init__()
        self.event = event


class SsdmoeApp(App[int]):
    CSS_PATH = "app.tcss"
    TITLE = "ssdmoe"
    COMMANDS = App.COMMANDS | {SsdmoeCommands}
    ENABLE_COMMAND_PALETTE = True
    HORIZONTAL_BREAKPOINTS = [(0, "-narrow"), (100, "-wide")]
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
        Binding("ctrl+y", "copy_last", "Copy reply", show=False, id="app.copy_last"),
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
        self.engine: Engine | None = None
        self.session_store = session_store
        self.session_id: str | None = None
        self.model_info: ModelInfo | None = None
        self.loading_path: str | None = None
        self.k: int | None = self.settings.k
        self.history: list[Message] = []
        self.inflight: str | None = None  # request id awaiting GenerationDone
        self._abandoned: set[str] = set()  # replies whose chat was cleared while streaming
        self.current: AssistantMessage | None = None
        self.last_done: GenerationDone | None = None
        self.events_seen: dict[str, int] = {}
        self._request_counter = 0
        themes, self._theme_warnings = load_themes()
        for theme in themes:
            self.register_theme(theme)

    # ------------------------------------------------------------------ layout

    def compose(self) -> ComposeResult:
        yield StatusBar(id="status")
        with Horizontal(id="main"):
            with Vertical(id="chat"):
                yield Transcript(id="transcript")
                yield PromptInput(
                    id="prompt",
                    placeholder="Ask anything · Enter sends · shift+enter/ctrl+j newline · ↑ history",
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

    async def on_mount(self) -> None:
        self._apply_theme(self.settings.theme)
        self.theme_changed_signal.subscribe(self, self._remember_theme)
        self._apply_keymap(self.settings.keymap)
        for warning in (*self.settings.warnings, *self._theme_warnings):
            self.notify(warning, severity="warning", timeout=10)
        self.prompt.focus()
        await self._open_session(self.settings.resume)
        if self.engine_factory is not None:
            try:
                self.engine = self.engine_factory(self._post_from_engine)
                self.engine.start()
            except Exception as e:  # noqa: BLE001 - e.g. MLX missing: say so, keep the UI
                from ssdmoe_tui.errors import user_message

                self.engine = None
                self.status_bar.phase = "no engine"
                self.notify(f"the engine did not start: {user_message(e)}", severity="error")
                return
            self.open_model(self.settings.model, k=self.settings.k)

    async def on_unmount(self) -> None:
        engine, self.engine = self.engine, None
        if engine is not None:
            engine.cancel()
            await asyncio.to_thread(engine.shutdown, 5.0)

    def _apply_theme(self, name: str) -> None:
        if name in self.available_themes:
            self.theme = name
        else:
            self.notify(f"unknown theme {name!r}; using {DEFAULT_THEME}", severity="warning")
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
        from ssdmoe_tui.ui.screens.dialogs import AskScreen, ConfirmScreen

        def of(cls: type) -> list[Binding]:
            return [b for b in cls.BINDINGS if isinstance(b, Binding)]

        return [
            ("app", of(SsdmoeApp)),
            ("prompt", of(PromptInput)),
            ("transcript", of(Transcript)),
            ("message", of(ChatMessage)),
            ("K control", of(KSlider)),
            ("dialogs", of(ConfirmScreen) + of(AskScreen)),
            ("conversations", of(ConversationsScreen)),
            ("models", of(ModelsScreen)),
        ]

    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        for command in super().get_system_commands(screen):
            if command.title != "Keys":  # ours (F1) lists every binding with its id
                yield command

    # ------------------------------------------------------------------ engine link

    def _post_from_engine(self, event: object) -> None:
        """Called on the engine thread: queue the event, never block."""
        try:
            self.post_message(EngineEvent(event))
        except RuntimeError:  # the app's loop has closed (shutting down)
            pass

    def feed(self, event: object) -> None:
        """Deliver an event as if the engine had posted it."""
        self.post_message(EngineEvent(event))

    async def on_engine_event(self, message: EngineEvent) -> None:
        event = message.event
        name = type(event).__name__
        self.events_seen[name] = self.events_seen.get(name, 0) + 1
        try:
            await self._handle(event)
        except NoMatches:
            if self.is_running and not self._exit:
                raise  # a real bug; while exiting, the widgets are simply gone

    async def _handle(self, event: object) -> None:
        if isinstance(event, Tokens):
            if self.current is not None and event.request_id == self.current.request_id:
                await self.current.append(event.text)
        elif isinstance(event, StatsSample):
            self.panel.show_sample(event)
        elif isinstance(event, PhaseChanged):
            self.panel.show_phase(event)
            label = PHASE_LABELS.get(event.phase, event.phase)
            if event.total and event.phase in ("prefill", "loading", "indexing"):
                label += f" {event.done}/{event.total}"
            self.status_bar.phase = label
        elif isinstance(event, GenerationDone):
            await self._on_done(event)
        elif isinstance(event, ModelLoaded):
            await self._on_model_loaded(event.info)
        elif isinstance(event, EngineError):
            await self._on_error(event)
        elif isinstance(event, Notice):
            self.notify(event.message, timeout=8)

    async def _on_model_loaded(self, info: ModelInfo) -> None:
        self.model_info = info
        self.loading_path = None
        self.k = info.k
        self.panel.show_model(info)
        self.status_bar.loading = ""
        self.status_bar.k = info.k
        self.status_bar.info = info
        source = " from the repacked copy" if info.expert_source == "repacked" else ""
        slots = f", {info.slot_placement} slots" if info.slot_placement != "none" else ""
        await self.transcript.add_notice(
            f"Loaded {info.name} ({info.model_type}): {info.num_experts} experts in "
            f"{info.num_layers} MoE layers, trained K {info.trained_k}, K {info.k}, "
            f"{info.device} {info.dtype}, {info.reader} reader{source}{slots}."
        )
        if info.expert_source_note:
            self.notify(f"Repacked copy not used: {info.expert_source_note}", timeout=8)

    async def _on_done(self, done: GenerationDone) -> None:
        if done.request_id != self.inflight:
            return
        message, self.current = self.current, None
        self.last_done = done
        try:
            if done.request_id in self._abandoned:
                return  # the chat was cleared or the model switched while it streamed
            stats = done.stats or {}
            detail = f"{len(done.token_ids)} tokens"
            if isinstance(stats.get("decode_tok_s"), (int, float)):
                detail += f" · {fmt_rate(stats['decode_tok_s'])}"
            if message is not None and message.is_attached:
                await message.finish(done.text, done.finish_reason, detail)
            if done.finish_reason != "error" and done.text:
                self.history.append(Message("assistant", done.text))
            if self.session_store is not None and self.session_id is not None:
                try:
                    self.session_store.record(self.session_id, tuple(self.history), done)
                except Exception as e:  # noqa: BLE001 - persistence must not kill the chat
                    from ssdmoe_tui.errors import user_message

                    self.notify(f"session not saved: {user_message(e)}", severity="warning")
        finally:
            self._abandoned.discard(done.request_id)
            self.inflight = None  # last: a new prompt may go once this reply is settled

    async def _on_error(self, error: EngineError) -> None:
        self.notify(error.message, title="engine error", severity="error", timeout=12)
        if error.request_id is not None and error.request_id == self.inflight:
            message, self.current = self.current, None
            abandoned = error.request_id in self._abandoned
            self._abandoned.discard(error.request_id)
            self.inflight = None
            if message is not None and message.is_attached:
                await message.finish(message.text, "error", error.message)
            if not abandoned and self.history and self.history[-1].role == "user":
                self.history.pop()  # the turn failed; the user can send it again
        if error.fatal or (error.request_id is None and self.loading_path is not None):
            self.model_info = None
            self.loading_path = None
            self.status_bar.loading = ""
            self.status_bar.info = None
            self.status_bar.phase = "idle"
            self.panel.show_model(None)
            await self.transcript.add_notice(
                f"No model loaded: {error.message}  (ctrl+p → Open model…)", classes="error"
            )

    # ------------------------------------------------------------------ chat

    @on(PromptInput.Submitted)
    async def _on_prompt(self, event: PromptInput.Submitted) -> None:
        await self.send(event.text)

    async def send(self, text: str) -> bool:
        """Send one user turn; False (with a notice) when it cannot go now."""
        if self.inflight is not None:
            if self.inflight in self._abandoned:
                self.notify("Still stopping the previous reply; send again in a moment.")
            else:
                self.notify("A reply is still streaming: Esc stops it.", severity="warning")
            return False
        if self.engine is None or self.model_info is None:
            why = (
                "The model is still loading."
                if self.loading_path is not None
                else ("No model is loaded: ctrl+p → Open model…")
            )
            self.notify(why, severity="warning")
            return False
        self.prompt.clear()
        await self.transcript.add_user(text)
        self.history.append(Message("user", text))
        self._request_counter += 1
        request_id = f"r{self._request_counter}"
        self.current = await self.transcript.add_assistant(request_id, self.model_info.name)
        self.inflight = request_id
        self.transcript.action_pin()
        self.panel.clear_history()
        messages = tuple(self.history)
        if self.settings.system_prompt:
            messages = (Message("system", self.settings.system_prompt), *messages)
        self.engine.submit(
            Generate(
                request_id=request_id,
                messages=messages,
                max_tokens=self.settings.max_tokens,
                session_id=self.session_id,
            )
        )
        return True

    def action_stop(self) -> None:
        """Stop the streaming reply; what arrived stays, marked as stopped."""
        if self.inflight is not None and self.engine is not None:
            self.engine.cancel()

    async def action_new_chat(self) -> None:
        self._abandon_reply()
        self.history.clear()
        await self.transcript.clear()
        self.panel.clear_history()
        await self._open_session(None)
        await self.transcript.add_notice("New chat.")
        self.prompt.focus()

    def _abandon_reply(self) -> None:
        """Stop the streaming reply and drop it; its GenerationDone still clears `inflight`."""
        if self.inflight is not None:
            self._abandoned.add(self.inflight)
            self.current = None
            if self.engine is not None:
                self.engine.cancel()

    async def _open_session(self, resume: str | None) -> None:
        if self.session_store is None:
            self.session_id = None
            if resume is not None:
                self.notify("--resume: saved sessions are not available here", severity="warning")
            return
        try:
            self.session_id, turns = self.session_store.open(resume)
        except Exception as e:  # noqa: BLE001 - a bad session file must not stop the chat
            from ssdmoe_tui.errors import user_message

            self.notify(f"could not open the session: {user_message(e)}", severity="error")
            self.session_id = None
            return
        await self._show_turns(turns)

    async def _show_turns(self, turns: Sequence[Message]) -> None:
        for turn in turns:
            if turn.role == "user":
                await self.transcript.add_user(turn.content)
            elif turn.role == "assistant":
                message = await self.transcript.add_assistant("", "")
                await message.finish(turn.content, "stop")
        self.history = [t for t in turns if t.role in ("user", "assistant")]

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

    async def open_conversation(self, conv_id: str) -> bool:
        """Show a saved conversation in this window; its KV checkpoint loads (engine side)
        with the next turn. The current chat stays as it is if this fails."""
        from ssdmoe_tui.errors import user_message

        if conv_id == self.session_id:
            return True
        if self.inflight is not None or self.session_store is None:
            why = "saved conversations are not available here"
            if self.inflight is not None:
                why = "a reply is still streaming: Esc stops it first"
            self.notify(f"Not opened: {why}.", severity="warning")
            return False
        try:
            session_id, turns = self.session_store.open(conv_id)
        except Exception as e:  # noqa: BLE001 - one line; the current chat is untouched
            self.notify(
                f"could not open the conversation: {user_message(e)}",
                severity="error",
                markup=False,
            )
            return False
        self.history.clear()
        await self.transcript.clear()
        self.panel.clear_history()
        self.session_id = session_id
        await self._show_turns(turns)
        model = self.model_info.name if self.model_info else None
        await self.transcript.add_notice(resumed_notice(store_of(self), session_id, model))
        self.transcript.action_pin()
        self.prompt.focus()
        return True

    def conversation_deleted(self, conv_id: str) -> None:
        """The open conversation was deleted: the window starts a new one (its text
        would otherwise be saved again by the next turn)."""
        if conv_id == self.session_id:
            self.call_later(self.action_new_chat)

    def _saved_conversation(self) -> tuple[ConversationOps, str] | None:
        store = store_of(self)
        if store is None:
            self.notify("Conversations are not saved in this window.", severity="warning")
            return None
        if not is_saved(store, self.session_id):
            self.notify("This chat is saved after its first reply.", severity="warning")
            return None
        return ConversationOps(self, store), self.session_id

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
        if replies:
            replies[-1].action_copy_message()

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
        self.k = event.k
        self.status_bar.k = event.k
        if self.engine is not None:
            self.engine.set_k(event.k)  # thread-safe; applies from the next token

    def action_k_step(self, delta: int) -> None:
        slider = self.query_one(KSlider)
        if not slider.num_experts:
            self.notify("No model loaded yet.", severity="warning")
            return
        slider.set_k(slider.k + delta)

    def request_k(self, k: int) -> None:
        slider = self.query_one(KSlider)
        if not slider.num_experts:
            self.notify("No model loaded yet.", severity="warning")
        elif not 1 <= k <= slider.num_experts:
            self.notify(f"K must be 1..{slider.num_experts}, not {k}", severity="error")
        else:
            slider.set_k(k)

    def action_ask_k(self) -> None:
        slider = self.query_one(KSlider)
        if not slider.num_experts:
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
                f"K (experts per token), 1..{slider.num_experts}",
                str(slider.k),
                hint=f"The model was trained with K = {slider.trained_k}; lower is faster, "
                "and trades quality for speed.",
            ),
            done,
        )

    def request_expert_cache(self, size: str) -> None:
        """The engine reloads the model with the new budget (ModelLoaded follows)."""
        if self.engine is None:
            return
        if self.model_info is None:
            self.notify("No model loaded.", severity="warning")
            return
        path = self.model_info.path
        self._abandon_reply()
        self.settings.expert_cache = size
        self.model_info = None
        self.loading_path = path
        self.status_bar.info = None
        self.status_bar.loading = f"{Path(path).name} with a {size} expert cache"
        self.engine.submit(SetExpertCache(size=size))

    def action_ask_expert_cache(self) -> None:
        current = self.model_info.expert_cache_budget if self.model_info else None
        hint = f"Now {current:,} bytes. " if current is not None else ""

        def done(value: str | None) -> None:
            if value:
                self.request_expert_cache(value)

        self.push_screen(
            AskScreen("Expert-cache budget", "auto", hint=hint + "auto, 512M, 4G, ..."), done
        )

    def open_model(self, path: str, k: int | None = None) -> None:
        """Load (or switch to) a model; progress and errors arrive as events."""
        if self.engine is None:
            return
        self._abandon_reply()
        self.model_info = None
        self.loading_path = path
        self.status_bar.info = None
        self.status_bar.loading = path or "the demo model"
        self.panel.show_model(None)
        self.engine.submit(LoadModel(path=path, k=k, expert_cache=self.settings.expert_cache))

    def action_models(self) -> None:
        if isinstance(self.screen, ModelsScreen):
            return
        current = self.model_info.path if self.model_info else self.loading_path

        def chosen(path: str | None) -> None:
            if path is None:
                return
            if self.model_info is not None and path and Path(path) == Path(self.model_info.path):
                self.notify(f"{self.model_info.name} is already loaded.", markup=False)
            else:
                self.open_model(path)

        # The loaded model's own folder is listed even when no scanned folder holds it.
        extra = [self.model_info.path] if self.model_info else []
        self.push_screen(ModelsScreen(current, extra), chosen)

    def action_ask_model(self) -> None:
        def done(value: str | None) -> None:
            if value is not None:
                self.open_model(os.path.expanduser(value))

        self.push_screen(
            AskScreen(
                "Open model",
                self.model_info.path if self.model_info else "",
                placeholder="/path/to/checkpoint (empty: the demo model)",
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
        loaded = self.settings.config
        if loaded is None or theme.name == self.settings.theme:
            return
        self.settings.theme = theme.name
        problem = set_config_value(loaded, "theme", theme.name)
        if problem:
            self.notify(f"theme {theme.name}: {problem}", severity="warning")

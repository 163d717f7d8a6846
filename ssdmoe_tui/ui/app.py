"""The chat app: it composes the screen, routes each engine event to the controller and
the widgets that show it, and owns the app-wide keys.

The state lives in `ssdmoe_tui.chat.controller.ChatController` (no Textual). The chat
column (`widgets/chat_pane.py`) owns sending and the streaming reply, the engine panel
shows samples and follows the engine's K, and what the keys and palette do is in
`ui/actions/` (model, conversations, keys, theme). The engine thread posts each protocol
event as its own typed message (`ui.messages`), handled here with `@on`, in arrival
order; screens post request messages instead of calling the app, and the palette
calls `ui/actions`.
Nothing here imports mlx or safetensors (tests/test_layering.py checks).
"""

from __future__ import annotations

import asyncio
import functools
import signal
import time
from collections.abc import Callable, Iterable
from dataclasses import replace
from pathlib import Path
from typing import Any

from textual import on
from textual.app import App, ComposeResult, SystemCommand
from textual.binding import Binding
from textual.containers import Horizontal
from textual.css.query import NoMatches
from textual.notifications import SeverityLevel
from textual.screen import Screen
from textual.timer import Timer
from textual.widgets import Footer

from ssdmoe_tui import paths
from ssdmoe_tui.atomic import atomic_write_text
from ssdmoe_tui.chat.controller import ChatController, Refused, SessionStore
from ssdmoe_tui.chat.progress import (
    COMPILING,
    FIRST_REPLY_NOTE,
    LoadProgress,
    PrefillClock,
)
from ssdmoe_tui.config import ChatSettings
from ssdmoe_tui.engine.run.protocol import EngineClient, EngineError, ModelInfo
from ssdmoe_tui.errors import user_message
from ssdmoe_tui.terminal_text import visible
from ssdmoe_tui.ui.actions import attach, conversations, gen_settings, model, tools
from ssdmoe_tui.ui.actions.keys import apply_keymap, binding_groups
from ssdmoe_tui.ui.actions.theme import ThemeChoice
from ssdmoe_tui.ui.child import child
from ssdmoe_tui.ui.commands import SsdmoeCommands
from ssdmoe_tui.ui.messages import (
    AskModelPath,
    ConversationDeleted,
    EngineFailed,
    EngineNotice,
    ExpertsReady,
    ModelReady,
    PhaseEntered,
    ReplyDone,
    SampleArrived,
    TokensArrived,
    engine_message,
)
from ssdmoe_tui.ui.screens.dialogs import ConfirmScreen
from ssdmoe_tui.ui.screens.keys import KeysScreen
from ssdmoe_tui.ui.theming import load_themes
from ssdmoe_tui.ui.widgets.chat_pane import ChatPane
from ssdmoe_tui.ui.widgets.engine_panel import PHASE_LABELS, EnginePanel
from ssdmoe_tui.ui.widgets.k_slider import KSlider
from ssdmoe_tui.ui.widgets.status_bar import StatusBar
from ssdmoe_tui.ui.widgets.transcript import AssistantMessage
from ssdmoe_tui.ui.widgets.welcome import Welcome
from ssdmoe_tui.units import human_bytes

__all__ = ["ChatSettings", "SsdmoeApp"]

EngineFactory = Callable[[Callable[[object], None]], EngineClient]

#: How long a quit waits for the engine to answer the stop of the reply in flight (a
#: prefill stops within its chunk: well under this on the demo, on a busy machine too).
QUIT_SETTLE_S = 5.0


def default_engine(post: Callable[[object], None]) -> EngineClient:
    # Imported here: the service module is light, but keeping the import lazy lets the
    # UI start (and tests build it) even where the engine cannot.
    from ssdmoe_tui.engine.run.service import EngineService

    return EngineService(post=post)  # no persistence: `commands/chat.py` injects it


def screenshots_dir() -> Path:
    return paths.data_dir() / "screenshots"


def save_svg(folder: Path, svg: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / time.strftime("ssdmoe-%Y%m%d-%H%M%S.svg")
    atomic_write_text(path, svg)
    return path


def in_app_words(error: EngineError) -> EngineError:
    """The engine's errors name command-line flags (`--model X: no such file or folder`);
    in the app the model was typed in a dialog, so the flag goes."""
    text = error.message
    if text.startswith("--model "):
        text = "model " + text[len("--model ") :]
    return replace(error, message=text) if text != error.message else error


def loaded_notice(info: ModelInfo, k: int) -> str:
    """The transcript's line for a model now in use: loaded here, or a server's."""
    if info.server:
        return (
            f"Attached to the server at {info.server.removeprefix('http://')}: {info.name} "
            f"({info.model_type}), {info.num_experts} experts, trained K {info.trained_k}, "
            f"K {k} (sent with each request), {info.device} {info.dtype}. Its prompt cache "
            "and expert cache are its own; this conversation is saved here as text."
        )
    source = " from the repacked copy" if info.expert_source == "repacked" else ""
    slots = f", {info.slot_placement} slots" if info.slot_placement != "none" else ""
    return (
        f"Loaded {info.name} ({info.model_type}): {info.num_experts} experts in "
        f"{info.num_layers} MoE layers, trained K {info.trained_k}, K {k}, "
        f"{info.device} {info.dtype}, {info.reader} reader{source}{slots}."
    )


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


def tool_loop(settings: ChatSettings) -> Any:
    """The tool loop over the config's MCP servers (None when none is configured)."""
    if not settings.mcp_servers:
        return None
    from ssdmoe_tui.tools.loop import ToolLoop
    from ssdmoe_tui.tools.servers import ToolServers

    return ToolLoop(ToolServers(settings.mcp_servers, log_dir=paths.cache_dir() / "mcp-logs"))


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
        Binding("ctrl+home", "top", "Transcript top", show=False, id="app.top"),
        # Not ctrl+y (the prompt, a TextArea, takes it as redo) nor F5-F7 (it selects with them).
        Binding("f8", "copy_last", "Copy reply", show=False, id="app.copy_last"),
        Binding("ctrl+g", "regenerate", "Regenerate", show=False, id="app.regenerate"),
        Binding("ctrl+l", "edit_last", "Edit last prompt", show=False, id="app.edit_last"),
        Binding("f9", "gen_settings", "Settings", show=False, id="app.settings"),
        Binding("ctrl+t", "toggle_thinking", "Thinking", show=False, id="app.thinking"),
        Binding("f10", "tools", "Tools", show=False, id="app.tools"),
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
        self.chat.tools = tool_loop(self.settings)
        self.load_progress = LoadProgress()
        self.prefill_clock = PrefillClock()
        # MLX-CUDA's first run: the first reply compiles the GPU kernels (minutes); its
        # phases say so until it is done (chat/progress.py COMPILING)
        self.compiling_kernels = False
        # What the chat waits on that is not the engine (an approval, a tool running; set
        # by ui/actions/tools.show_phase): the engine's late "saving"/"idle" of the reply
        # before it does not replace it in the header (it read "idle" at the approval)
        self.app_phase = ""
        self._prefill_timer: Timer | None = None
        self.events_seen: dict[str, int] = {}
        self._quitting = False
        self.themes = ThemeChoice(self)
        themes, self._theme_warnings = load_themes()
        for theme in themes:
            self.register_theme(theme)

    @property
    def inflight(self) -> str | None:
        """The reply in flight, until its widget has settled too."""
        return self.chat.inflight or self.chat_pane.finishing

    # ------------------------------------------------------------------ layout

    def compose(self) -> ComposeResult:
        yield StatusBar(id="status")
        with Horizontal(id="main"):
            yield ChatPane(self.chat, id="chat")
            yield EnginePanel(id="panel")
        yield Footer()

    chat_pane = child(ChatPane)
    panel = child(EnginePanel)
    status_bar = child(StatusBar)

    async def on_mount(self) -> None:
        self._catch_sigterm(True)
        self.themes.apply(self.settings.theme)
        apply_keymap(self, self.settings.keymap)
        for warning in (*self.settings.warnings, *self._theme_warnings):
            self.notify(warning, severity="warning", timeout=10, markup=False)
        pane = self.chat_pane
        pane.prompt.focus()
        tools.watch_stops(self)
        tools.start_at_launch(self)
        await pane.open_session(self.settings.resume)
        path = self.settings.model
        if self.settings.resume is not None and self.chat.history:
            self.panel.new_conversation(resumed=True)
            if not self.settings.attach:
                path, why = conversations.resume_model(self, path)
                if why:
                    await pane.transcript.add_notice(why)
        demo = not self.settings.model and not self.settings.attach
        if self.engine_factory is not None and demo and not self.chat.history:
            await pane.transcript.mount(Welcome())  # the demo model: say what happens
            pane.transcript.show_top()  # its top first, at any size
        if self.settings.attach:  # `ssdmoe --attach URL`: a server's model, none of ours
            attach.attach(self, self.settings.attach)
        elif self.engine_factory is not None:
            # Draw first: building the engine imports MLX, mlx-lm and transformers
            # (seconds on a busy machine), so it happens off the UI thread, after mount.
            self.status_bar.phase = "starting the engine"
            self.run_worker(
                self.start_local_engine(path),
                group="engine-start",
                exit_on_error=False,
            )

    async def start_local_engine(self, path: str) -> None:
        """Build this app's own engine (off the UI thread) and open `path` on it."""
        if self.engine_factory is None:
            self.chat.use_engine(None, None)
            self.status_bar.loading = ""
            self.notify("This app has no engine of its own.", severity="error")
            return
        self.chat.engine_starting = True
        try:
            engine = await asyncio.to_thread(self.engine_factory, self.feed)
            engine.start()
        except Exception as e:  # noqa: BLE001 - e.g. MLX missing: say so, keep the UI
            self.chat.engine_starting = False
            self.chat.use_engine(None, None)
            self.status_bar.phase = "no engine"
            self.notify(f"the engine did not start: {user_message(e)}", severity="error")
            return
        if self._exit or not self.is_running:  # quit while it was being built
            await asyncio.to_thread(engine.shutdown, 5.0)
            return
        self.chat.use_engine(engine, None)
        self.chat.engine_starting = False
        model.open_model(self, path, k=self.chat.gen.k)

    def _catch_sigterm(self, on: bool) -> None:
        """SIGTERM ends the app like ctrl+q; without this Python dies on it at once and
        leaves the terminal in the alternate screen with mouse reporting on."""
        try:
            loop = asyncio.get_running_loop()
            if on:
                loop.add_signal_handler(signal.SIGTERM, self._terminated)
            else:
                loop.remove_signal_handler(signal.SIGTERM)
        except (RuntimeError, ValueError, NotImplementedError):  # not the main thread; Windows
            pass

    async def on_unmount(self) -> None:
        self._catch_sigterm(False)
        engine, self.chat.engine = self.chat.engine, None
        if engine is not None:
            engine.cancel()
            await asyncio.to_thread(engine.shutdown, 5.0)
        if self.chat.tools is not None:  # no MCP server outlives the app
            await asyncio.to_thread(self.chat.tools.servers.close)

    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        for command in super().get_system_commands(screen):
            if command.title == "Screenshot":  # Textual's says nothing when it fails
                yield SystemCommand(
                    "Screenshot",
                    f"Save an SVG of the screen in {screenshots_dir()}",
                    lambda: self.set_timer(0.1, self.save_screenshot_here),
                )
            elif command.title != "Keys":  # ours (F1) lists every binding with its id
                yield command

    def notify(
        self,
        message: str,
        *,
        title: str = "",
        severity: SeverityLevel = "information",
        timeout: float | None = None,
        markup: bool = True,
    ) -> None:
        """Every toast (a widget's `notify` comes here too): a tool's note, a server's
        error or a file name may hold control characters, shown escaped, never raw."""
        super().notify(
            visible(message), title=visible(title), severity=severity, timeout=timeout,
            markup=markup,
        )  # fmt: skip

    def save_screenshot_here(self) -> None:
        """The palette's Screenshot: the file's path, or where it tried and why not."""
        folder = screenshots_dir()
        try:
            path = save_svg(folder, self.export_screenshot())
        except OSError as e:
            self.notify(
                f"Screenshot not saved: cannot write in {folder}: {e.strerror or e}",
                severity="error",
                markup=False,
            )
            return
        self.copy_to_clipboard(str(path))
        self.notify(f"Screenshot saved: {path} (path copied)", markup=False)

    # ------------------------------------------------------------------ engine link

    def feed(self, event: object) -> None:
        """The engine's `post` callback, called on the engine thread (tests call it to
        feed fixed events): queue the event's message, never block."""
        message = engine_message(event)
        if message is None:
            return
        name = type(event).__name__
        self.events_seen[name] = self.events_seen.get(name, 0) + 1
        try:
            self.post_message(message)
        except RuntimeError:  # the app's loop has closed (shutting down)
            pass

    @on(TokensArrived)
    @while_mounted
    async def _tokens(self, message: TokensArrived) -> None:
        await self.chat_pane.show_tokens(message.event)

    @on(SampleArrived)
    @while_mounted
    async def _sample(self, message: SampleArrived) -> None:
        sample = message.event
        self.panel.show_sample(sample)
        decoding = self.chat.inflight is not None and sample.generated_tokens > 0
        if self.panel.follow_k(sample, decoding):
            self.status_bar.k = self.panel.k_control.k

    @on(PhaseEntered)
    @while_mounted
    async def _phase(self, message: PhaseEntered) -> None:
        event = message.event
        self.panel.show_phase(event)
        if event.phase in ("loading", "indexing") and self.chat.loading is not None:
            self.load_progress.update(event.phase, event.done, event.total, event.detail)
            self.panel.show_load(self.load_progress)
            if welcome := self.chat_pane.welcome:
                welcome.show_progress(event.phase, event.done, event.total, event.detail)
        if event.phase in ("idle", "saving") and self.app_phase:
            self._stop_prefill_clock()
            return  # the tool loop's phase stands until it ends or a reply starts
        if event.phase == "prefill" and event.total:
            self.prefill_clock.report(event.done, event.total)
            self._show_prefill()
            if self._prefill_timer is None:  # moves between the engine's chunk reports
                self._prefill_timer = self.set_interval(0.25, self._show_prefill)
            return
        if event.phase == "decoding" and event.total:
            self.prefill_clock.report(event.total, event.total)  # its rate, for the next
        self._stop_prefill_clock()
        label = PHASE_LABELS.get(event.phase, event.phase)
        if event.total and event.phase in ("loading", "indexing"):
            label += f" {event.done}/{event.total}"
        if self.compiling_kernels and event.phase == "decoding":
            label += f" · {COMPILING}"
        self.status_bar.phase = label

    def _show_prefill(self) -> None:
        clock = self.prefill_clock
        note = COMPILING if self.compiling_kernels else ""
        phase = f"{PHASE_LABELS['prefill']} {clock.text(rate=False)}"
        self.status_bar.phase = f"{phase} · {note}" if note else phase
        self.panel.show_prefill(clock, note)

    def _stop_prefill_clock(self) -> None:
        if self._prefill_timer is not None:
            self._prefill_timer.stop()
            self._prefill_timer = None

    @on(ReplyDone)
    @while_mounted
    async def _reply_done(self, message: ReplyDone) -> None:
        self._stop_prefill_clock()  # a reply stopped during its prefill
        if self.compiling_kernels:  # its prefill rate was the compiler's: forgotten
            self.compiling_kernels = False
            self.prefill_clock.rate = None
        else:
            self.prefill_clock.learn((message.event.stats or {}).get("prefill_tok_s"))
        self.panel.show_ranks((message.event.stats or {}).get("distributed"))
        await self.chat_pane.reply_done(message.event)

    @on(ModelReady)
    @while_mounted
    async def _model_ready(self, message: ModelReady) -> None:
        info = message.event.info
        loaded = self.chat.model_loaded(info, message.event.tokenizer)
        self.compiling_kernels = self.load_progress.compiling
        if welcome := self.chat_pane.welcome:
            welcome.loaded(info.name, compiling=self.compiling_kernels)
        self.panel.show_model(info, k=loaded.k)
        self.status_bar.loading = ""
        self.status_bar.k = loaded.k
        self.status_bar.info = info
        await self.chat_pane.transcript.add_notice(loaded_notice(info, loaded.k))
        if self.compiling_kernels:
            await self.chat_pane.transcript.add_notice(FIRST_REPLY_NOTE)
        await self.chat_pane.split_restored()
        if self.chat_pane.welcome is not None and not self.chat.history:
            # The card's top says what the demo is: the notice must not scroll it away
            # (at 80x24 they do not both fit). Sending pins the transcript again.
            self.chat_pane.transcript.show_top()
        for warning in loaded.warnings:
            self.notify(warning, severity="warning", timeout=10, markup=False)
        if info.expert_source_note:
            self.notify(f"Repacked copy not used: {info.expert_source_note}", timeout=8)

    @on(EngineFailed)
    @while_mounted
    async def _engine_failed(self, message: EngineFailed) -> None:
        error = in_app_words(message.event)
        self.notify(error.message, title="engine error", severity="error", timeout=12, markup=False)
        failure = self.chat.engine_error(error)
        if failure.reply_failed:
            await self.chat_pane.reply_failed(error)
        self.status_bar.loading = ""
        self.status_bar.info = self.chat.model
        transcript = self.chat_pane.transcript
        if failure.model_lost:
            if welcome := self.chat_pane.welcome:
                welcome.failed(error.message)
            self.status_bar.phase = "idle"
            self.panel.show_model(None)
            await transcript.add_notice(
                f"No model loaded: {error.message}  (F4 or ctrl+p → Open model…)",
                classes="error",
            )
        elif error.request_id is None and self.chat.model is not None:
            await transcript.add_notice(
                f"{self.chat.model.name} is still loaded and unchanged: {error.message}",
                classes="error",
            )

    @on(EngineNotice)
    def _engine_notice(self, message: EngineNotice) -> None:
        self.notify(message.event.message, timeout=8, markup=False)

    @on(ExpertsReady)
    def _experts_warmed(self, message: ExpertsReady) -> None:
        """Warm resume: how much of the conversation's expert working set is in memory."""
        w = message.event
        if w.read or w.cancelled:
            how = f"stopped by the next request after {w.read}" if w.cancelled else f"{w.read}"
            self.notify(
                f"expert cache warmed: {how} of {w.requested} experts read "
                f"({human_bytes(w.bytes_read)}, {w.seconds:.1f} s)",
                timeout=5,
                markup=False,
            )

    # ------------------------------------------------------------------ requests from widgets and screens

    @on(KSlider.Changed)
    def _k_changed(self, event: KSlider.Changed) -> None:
        self.status_bar.k = event.k
        try:
            self.chat.set_k(event.k)  # thread-safe; applies from the next token
        except Refused as e:
            self.notify(str(e), severity="error")

    @on(AskModelPath)
    def _ask_model_requested(self) -> None:
        model.ask_model(self)

    @on(ConversationDeleted)
    def _conversation_deleted(self, message: ConversationDeleted) -> None:
        """The open conversation was deleted: the window starts a new one (its text
        would otherwise be saved again by the next turn)."""
        if message.conv_id == self.chat.session_id:
            self.call_later(self.action_new_chat)

    # ------------------------------------------------------------------ app-wide keys

    async def action_quit(self) -> None:
        if isinstance(self.screen, ConfirmScreen):
            return  # already asking
        tool = tools.running(self.chat_pane)
        if self.inflight is None and not tool:
            self.exit(0)
            return

        def answered(yes: bool | None) -> None:
            if yes:
                tools.stop(self.chat_pane)  # a call in flight is cancelled
                self._quit_saving(0)

        busy = "A tool call is under way" if tool else "A reply is streaming"
        self.push_screen(
            ConfirmScreen(f"{busy}. Quit anyway?", yes="Quit", no="Keep going"), answered
        )

    async def quit_saving(self, code: int = 0) -> None:
        """Exit with the reply in flight stopped and saved (`settle_reply`)."""
        if self._quitting:
            return
        self._quitting = True
        await self.settle_reply()
        self.exit(code)

    async def settle_reply(self) -> None:
        """Stop the reply in flight and keep it in its own conversation: the engine's
        answer to the stop (what arrived, or the prompt as an exchange without a reply
        when it was still prefilling) is awaited a few seconds; past that, the controller
        settles it with what is on screen. Run from a worker, never a handler: the
        engine's answer (ReplyDone) is handled on the app's own queue meanwhile."""
        if self.chat.inflight is None:
            return
        self.chat.stop()
        end = time.monotonic() + QUIT_SETTLE_S
        # `inflight`, not the controller's alone: until the reply's widget has finished
        # too (a new chat removing it mid-finish cancelled the removal's wait).
        while self.inflight is not None and time.monotonic() < end:
            await asyncio.sleep(0.05)
        current = self.chat_pane.current
        self.chat.settle_unanswered(current.text if current is not None else "")

    def _terminated(self) -> None:
        """SIGTERM (a closed session, `kill`): leave as ctrl+q does (the terminal
        restored by Textual's driver, the reply in flight saved), status 143."""
        self._quit_saving(128 + signal.SIGTERM)

    def _quit_saving(self, code: int) -> None:
        # A worker, not a callback: the app's own queue must go on meanwhile, since the
        # engine's answer to the stop (ReplyDone) is handled on it.
        self.run_worker(self.quit_saving(code), group="quit", exit_on_error=False)

    def action_stop(self) -> None:
        """Stop the streaming reply (what arrived stays, marked as stopped) and the
        tool loop; while editing the last prompt (ctrl+l), leave the edit."""
        self.chat_pane.cancel_edit()
        self.chat.stop()
        tools.stop(self.chat_pane)

    def action_tools(self) -> None:
        tools.show(self)

    def action_new_chat(self) -> None:
        # A worker: the reply in flight is settled first, and its end comes on the queue.
        self.run_worker(self.new_chat(), group="new-chat", exclusive=True, exit_on_error=False)

    async def new_chat(self) -> None:
        """ctrl+n: the reply in flight (or the tool loop) is stopped and kept in its
        conversation, as a quit keeps it (a first prompt still in its prefill is not
        lost, and leaves no empty conversation), then a new chat starts."""
        pane = self.chat_pane
        tools.stop(pane)
        await self.settle_reply()
        await pane.start_over()
        self.panel.new_conversation()
        await pane.open_session(None)
        model.reset_k(self)
        await pane.transcript.add_notice("New chat.")
        pane.prompt.focus()

    def action_regenerate(self) -> None:
        self.call_later(self.chat_pane.redo)

    def action_edit_last(self) -> None:
        self.chat_pane.edit_last()

    def action_gen_settings(self) -> None:
        gen_settings.edit(self)

    def action_k_step(self, delta: int) -> None:
        model.step_k(self, delta)

    def action_pin(self) -> None:
        self.chat_pane.transcript.action_pin()

    def action_top(self) -> None:
        """The transcript's first line (it stops following the stream; End follows again)."""
        self.chat_pane.transcript.scroll_home(animate=False)

    def action_page(self, direction: int) -> None:
        """PageUp / PageDown while the prompt has focus: scroll the transcript a page."""
        transcript = self.chat_pane.transcript
        if direction < 0:
            transcript.scroll_page_up(animate=False)
        else:
            transcript.scroll_page_down(animate=False)

    def action_toggle_thinking(self) -> None:
        """Show or hide the reasoning of the last reply that has some."""
        replies = [
            m
            for m in self.chat_pane.transcript.messages()
            if isinstance(m, AssistantMessage) and m.split.has_thinking
        ]
        if replies:
            replies[-1].action_toggle_thinking()
        else:
            self.notify("No reply with thinking yet.", severity="warning")

    def action_copy_last(self) -> None:
        messages = self.chat_pane.transcript.messages()
        replies = [m for m in messages if isinstance(m, AssistantMessage)]
        if replies and replies[-1].answer:
            replies[-1].action_copy_message()
        else:
            self.notify("No reply to copy yet.", severity="warning")

    def action_keys(self) -> None:
        if not isinstance(self.screen, KeysScreen):
            self.push_screen(KeysScreen(binding_groups(type(self)), dict(self.settings.keymap)))

    def action_toggle_panel(self) -> None:
        panel = self.panel
        panel.display = not panel.display
        if not panel.display and self.focused is not None and panel in self.focused.ancestors:
            self.chat_pane.prompt.focus()

    def action_conversations(self) -> None:
        conversations.choose(self)

    def action_models(self) -> None:
        model.choose_model(self)

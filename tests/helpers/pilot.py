"""Driving the real app through Textual's pilot: waiting on what the app shows or emits,
pressing keys while the engine decodes, and recording what a step showed as it happened
(notifications, decode rates, stop latency) so a fast run cannot outpace the check."""

from __future__ import annotations

import time
from collections.abc import Callable

from textual import events
from textual.widgets import Input

from ssdmoe_tui.commands.chat import engine_factory
from ssdmoe_tui.engine.run.protocol import GenerationDone
from ssdmoe_tui.sessions.app_sessions import AppSessions
from ssdmoe_tui.sessions.store import SessionStore
from ssdmoe_tui.ui.app import ChatSettings, SsdmoeApp
from ssdmoe_tui.ui.screens.conversations import ConversationsScreen, resumed_notice, store_of
from ssdmoe_tui.ui.screens.gen_settings import GenSettingsScreen
from ssdmoe_tui.ui.screens.models import ModelsScreen
from ssdmoe_tui.ui.widgets.transcript import AssistantMessage, Notice

SIZE = (120, 40)


def session_app(settings: ChatSettings, store: SessionStore | None = None) -> SsdmoeApp:
    """The app as `ssdmoe` runs it: the real engine thread and a sessions store (the KV
    hooks, conversations on disk)."""
    return SsdmoeApp(
        settings,
        engine_factory=engine_factory,
        session_store=AppSessions(store if store is not None else SessionStore()),
    )


# A wait's bound guards against a hang; it is no claim about speed (benchmarks measure
# that). Under two suites at once on two cores, steps that take a fraction of a second
# quietly have taken more than 5 s, so no wait gives up before this.
MIN_WAIT_S = 30.0


async def wait_until(pilot, cond: Callable[[], object], timeout: float = 60.0, what: str = ""):
    """Return once `cond()` holds; fail after `timeout` seconds, never fewer than
    MIN_WAIT_S. Callers pass a timeout only to allow more (a model load, a long reply)."""
    timeout = max(timeout, MIN_WAIT_S)
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return
        await pilot.pause(0.02)
    raise AssertionError(f"timed out after {timeout}s waiting for {what or cond}")


async def loaded(pilot, app: SsdmoeApp, timeout: float = 120.0) -> None:
    await wait_until(pilot, lambda: app.chat.model is not None, timeout, "the model to load")


async def opened(pilot, app: SsdmoeApp, conv_id: str, timeout: float = MIN_WAIT_S) -> None:
    """Wait until the saved conversation `conv_id` is open in `app`. Its id is set first,
    then the transcript is cleared and refilled: a wait on the id alone can read the old
    transcript, or a half-built one (under two suites at once it read the reply before
    its prompt). The open's last step is its "Resumed ..." notice, so that is waited for."""

    def done() -> bool:
        if app.chat.session_id != conv_id:
            return False
        children = app.chat_pane.transcript.children
        model = app.chat.model.name if app.chat.model else None
        return (
            bool(children)
            and isinstance(children[-1], Notice)
            and str(children[-1].render()) == resumed_notice(store_of(app), conv_id, model)
        )

    await wait_until(pilot, done, timeout, f"conversation {conv_id} to open")


# The demo model's greedy reply to this prompt is long (over a thousand tokens).
LONG_PROMPT = "start"


async def tap(pilot, *keys: str) -> None:
    """Press keys without `pilot.press`'s wait for an idle process: while the engine
    decodes, the process is never idle and every press would cost about two seconds."""
    for key in keys:
        pilot.app.post_message(events.Key(key, key if len(key) == 1 else None))
        await pilot.pause(0.02)
    await pilot.pause(0.05)


async def type_and_send(pilot, text: str) -> None:
    app: SsdmoeApp = pilot.app
    app.chat_pane.prompt.focus()
    keys = ["space" if c == " " else c for c in text]
    await pilot.press(*keys)
    await tap(pilot, "enter")


async def next_reply(
    pilot, app: SsdmoeApp, before: GenerationDone | None, timeout: float = 60.0, what: str = ""
) -> GenerationDone:
    """The GenerationDone of the reply after `before` (`app.chat.last_done` taken before
    the step that starts it: a send, a regenerate, a resend), once the app has settled it.

    This waits on the event the step leads to, never on `app.inflight`: a fast reply may
    have come and gone before a poll sees it streaming, and on a slow machine it may not
    have started when the step returns."""
    await wait_until(
        pilot,
        lambda: app.chat.last_done is not before and app.inflight is None,
        timeout,
        what or "a reply",
    )
    return app.chat.last_done


async def send(pilot, text: str, timeout: float = 60.0, what: str = "") -> GenerationDone:
    """Type `text`, send it, and wait for its reply (`next_reply`)."""
    app: SsdmoeApp = pilot.app
    before = app.chat.last_done
    await type_and_send(pilot, text)
    return await next_reply(pilot, app, before, timeout, what or f"the reply to {text!r}")


async def streaming(pilot, app: SsdmoeApp, tokens: int) -> AssistantMessage:
    """Wait until the reply has streamed `tokens` increments, and check it still streams.
    A test that acts mid-stream takes the `mid_stream` fixture (tests/conftest.py), so the
    reply lasts long enough to act in on any machine."""
    await wait_until(
        pilot,
        lambda: (
            app.inflight is None
            or (app.chat_pane.current and app.chat_pane.current.appends >= tokens)
        ),
        60,
        f"{tokens} increments",
    )
    assert app.inflight is not None, (
        f"the reply ended ({app.chat.last_done.finish_reason}, {len(app.chat.last_done.token_ids)} "
        "tokens) before the test could act mid-stream: LONG_PROMPT needs a longer reply"
    )
    return app.chat_pane.current


async def long_reply(pilot, app: SsdmoeApp, increments: int) -> AssistantMessage:
    """Send LONG_PROMPT and wait until its reply has streamed `increments` increments
    (`streaming`: it still streams then)."""
    await type_and_send(pilot, LONG_PROMPT)
    return await streaming(pilot, app, increments)


def screen_text(app: SsdmoeApp) -> str:
    """What the terminal shows now, as plain text."""
    return "\n".join(strip.text for strip in app.screen._compositor.render_strips())


def terminal_output(app: SsdmoeApp) -> str:
    """What Textual would write to the terminal to draw the screen now, escape sequences
    and all (the headless driver writes nothing, so it is rendered here as `_display`
    renders it): the one place to look for a raw control sequence that reached it."""
    return app.screen._compositor.render_full_update().render_segments(app.console)


def replies(app: SsdmoeApp) -> list[AssistantMessage]:
    return list(app.query(AssistantMessage))


def errors(app: SsdmoeApp) -> list[str]:
    return [n.message for n in app._notifications if n.severity == "error"]


def record_notifications(app: SsdmoeApp) -> list[tuple[str, str]]:
    """Every (severity, message) the app notifies, kept (on screen they expire, and a
    slow shared machine can outlast their timeout)."""
    said: list[tuple[str, str]] = []
    notify = app.notify

    def record(message: str, **kw) -> object:
        said.append((kw.get("severity", "information"), message))
        return notify(message, **kw)

    app.notify = record
    return said


def warnings(app: SsdmoeApp) -> list[str]:
    return [n.message for n in app._notifications if n.severity == "warning"]


def record_decode_rates(app: SsdmoeApp) -> list[tuple[bool, float]]:
    """(streaming?, decode tok/s shown) after every sample the panel shows.

    Pilot key presses wait for the process to go idle, which a decoding engine
    thread never is, so polling between presses would miss the stream."""
    seen: list[tuple[bool, float]] = []
    show = app.panel.show_sample

    def show_and_record(sample) -> None:
        show(sample)
        text = app.panel.shown["decode"]
        rate = float(text.split()[0]) if text[0].isdigit() else 0.0
        seen.append((app.inflight is not None, rate))

    app.panel.show_sample = show_and_record
    return seen


def record_stop_latency(app: SsdmoeApp) -> list[float]:
    """Seconds from the Esc action to the GenerationDone that ends the reply."""
    marks: dict[str, float] = {}
    latencies: list[float] = []
    stop, on_done = app.action_stop, app.chat_pane.reply_done

    def timed_stop() -> None:
        marks["stop"] = time.monotonic()
        stop()

    async def timed_done(done) -> None:
        if "stop" in marks:
            latencies.append(time.monotonic() - marks.pop("stop"))
        await on_done(done)

    app.action_stop = timed_stop
    app.chat_pane.reply_done = timed_done
    return latencies


async def open_settings(pilot) -> GenSettingsScreen:
    """F9's generation settings, once the dialog is the screen."""
    app = pilot.app
    await pilot.press("f9")
    await wait_until(pilot, lambda: isinstance(app.screen, GenSettingsScreen), what="F9")
    return app.screen


async def save_settings(pilot, screen: GenSettingsScreen, **values: str) -> None:
    """Type `values` into F9's boxes by setting name (`#set-NAME`) and press save: the
    dialog closes, or stays up naming the bad value (`settings_error`)."""
    for name, value in values.items():
        screen.query_one(f"#set-{name}", Input).value = value
    screen.action_save()
    await pilot.pause()


def settings_error(screen: GenSettingsScreen) -> str:
    """The line F9 shows under its boxes after a save it refused."""
    return str(screen.query_one("#settings-error").render())


async def open_picker(pilot, app: SsdmoeApp) -> ModelsScreen:
    """F4's model picker, once its scan has listed the models."""
    await pilot.press("f4")
    await wait_until(pilot, lambda: isinstance(app.screen, ModelsScreen), what="the picker")
    screen = app.screen
    await wait_until(pilot, lambda: screen.entries is not None, what="the scan")
    return screen


def option_text(screen: ModelsScreen, option_id: str) -> str:
    options = screen.option_list
    return str(options.get_option_at_index(options.get_option_index(option_id)).prompt)


async def open_list(pilot, app: SsdmoeApp, key: str = "ctrl+o") -> ConversationsScreen:
    """The conversation list, once it shows its first listing."""
    await pilot.press(key)
    await wait_until(pilot, lambda: isinstance(app.screen, ConversationsScreen), what="the list")
    screen = app.screen
    await wait_until(pilot, lambda: screen.shown_query is not None, what="the listing")
    return screen

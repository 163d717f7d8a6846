"""ctrl+o: saved conversations. Search as you type, open, rename, delete, export.

Everything goes through `SessionStore` (no MLX). Opening one shows its transcript at
once; the engine loads its KV checkpoint lazily, on the next turn. Every failure is a
one-line notification, and nothing here drops text the user has not confirmed away.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.text import Text
from textual import on, work
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Input, Label, OptionList
from textual.widgets.option_list import Option

from ssdmoe_tui import paths
from ssdmoe_tui.errors import user_message
from ssdmoe_tui.sessions.store import CONVERSATION_FILE, SessionStore, Summary
from ssdmoe_tui.ui.child import child
from ssdmoe_tui.ui.messages import ConversationDeleted

EXPORT_FORMATS = {"md": "Markdown", "json": "JSON"}


def n_turns(n: int) -> str:
    """`1 turn`, `2 turns` (was `(1 turns)` in the delete question)."""
    return f"{n} turn" + ("" if n == 1 else "s")


def exports_dir() -> Path:
    """Where exports go when the user names no place."""
    return paths.data_dir() / "exports"


def store_of(app: Any) -> SessionStore | None:
    """The app's conversation store (AppSessions.store), or None when nothing is saved."""
    store = getattr(getattr(app, "session_store", None), "store", None)
    return store if isinstance(store, SessionStore) else None


def is_saved(store: SessionStore, conv_id: str | None) -> bool:
    """True once the conversation has a file (AppSessions writes it with the first reply)."""
    try:
        return conv_id is not None and (store.folder(conv_id) / CONVERSATION_FILE).is_file()
    except Exception:  # noqa: BLE001 - not an id this store made
        return False


def resumed_notice(store: SessionStore | None, conv_id: str, model: str | None) -> str:
    """The transcript line after opening a conversation (its model, if another one)."""
    try:
        conv = store.get(conv_id) if store is not None else None
    except Exception:  # noqa: BLE001 - the id is a fine label too
        conv = None
    if conv is None:
        return f"Resumed {conv_id}."
    text = f"Resumed “{conv.display_title}” ({n_turns(conv.n_turns)})."
    if conv.replaced:
        n = len(conv.replaced)
        text += f" {n} replaced exchange{'' if n == 1 else 's'} kept (in its exports)."
    if model and conv.model_id and conv.model_id != model:
        text += f" It was made with {conv.model_id}; it goes on with {model}."
    return text


def export_target(text: str, conv_id: str, fmt: str) -> Path:
    """The export file for what the user typed: empty = the default exports folder; an
    existing folder, or a path without a suffix, = a folder (made if needed); else a file."""
    raw = text.strip()
    dest = Path(raw).expanduser() if raw else exports_dir()
    if dest.is_dir() or not dest.suffix:
        dest.mkdir(parents=True, exist_ok=True)
        return dest / f"conversation-{conv_id}.{fmt}"
    dest.parent.mkdir(parents=True, exist_ok=True)
    return dest


def when(ts: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(ts))


class ConversationOps:
    """Rename / delete / export with their dialogs, for the list and the command palette.

    `done` callbacks run after a change went through (the list refreshes itself)."""

    def __init__(self, app: App, store: SessionStore) -> None:
        self.app = app
        self.store = store

    def _fail(self, what: str, error: BaseException) -> None:
        self.app.notify(
            f"{what}: {user_message(error)}", severity="error", timeout=10, markup=False
        )

    def rename(self, conv_id: str, done: Callable[[], object] | None = None) -> None:
        from ssdmoe_tui.ui.screens.dialogs import AskScreen

        try:
            current = self.store.get(conv_id).display_title
        except Exception as e:  # noqa: BLE001 - e.g. not saved yet: one line
            self._fail("cannot rename", e)
            return

        def answered(title: str | None) -> None:
            if not title:
                return
            try:
                conv = self.store.rename(conv_id, title)
            except Exception as e:  # noqa: BLE001
                self._fail("not renamed", e)
                return
            self.app.notify(f"Renamed to “{conv.display_title}”", markup=False)
            if done is not None:
                done()

        self.app.push_screen(
            AskScreen("Rename conversation", current, hint="One line; esc keeps the old title."),
            answered,
        )

    def delete(self, conv_id: str, done: Callable[[], object] | None = None) -> None:
        from ssdmoe_tui.ui.screens.dialogs import ConfirmScreen

        try:
            conv = self.store.get(conv_id)
            title, turns = conv.display_title, conv.n_turns
        except Exception as e:  # noqa: BLE001 - unreadable: it can still be deleted
            title, turns = conv_id, 0
            self.app.notify(user_message(e), severity="warning", markup=False)

        def answered(yes: bool | None) -> None:
            if not yes:
                return
            try:
                self.store.delete(conv_id)
            except Exception as e:  # noqa: BLE001
                self._fail("not deleted", e)
                return
            self.app.notify(f"Deleted “{title}”", markup=False)
            self.app.post_message(ConversationDeleted(conv_id))
            if done is not None:
                done()

        self.app.push_screen(
            ConfirmScreen(
                f"Delete “{title}” ({n_turns(turns)})? Its text and KV checkpoints are removed.",
                yes="Delete",
                no="Keep",
            ),
            answered,
        )

    def export(self, conv_id: str, fmt: str) -> None:
        from ssdmoe_tui.ui.screens.dialogs import AskScreen

        def answered(text: str | None) -> None:
            if text is not None:
                self.export_now(conv_id, fmt, text)

        self.app.push_screen(
            AskScreen(
                f"Export as {EXPORT_FORMATS[fmt]}",
                "",
                placeholder=str(exports_dir()),
                hint=f"A folder or a .{fmt} file; empty: {exports_dir()}",
            ),
            answered,
        )

    def export_now(self, conv_id: str, fmt: str, where: str = "") -> Path | None:
        try:
            path = self.store.export_to(conv_id, export_target(where, conv_id, fmt), fmt)
        except Exception as e:  # noqa: BLE001 - bad folder, not saved yet, disk full: one line
            self._fail("not exported", e)
            return None
        self.app.copy_to_clipboard(str(path))
        self.app.notify(
            f"{path}  (path copied)", title=f"exported ({EXPORT_FORMATS[fmt]})", markup=False
        )
        return path


class ConversationsScreen(ModalScreen[str | None]):
    """Returns the id of the conversation to open, or None."""

    BINDINGS = [
        Binding("escape", "close", "Close", id="conversations.close"),
        Binding("up", "move(-1)", "Up", show=False, id="conversations.up"),
        Binding("down", "move(1)", "Down", show=False, id="conversations.down"),
        Binding("f2", "rename", "Rename", id="conversations.rename"),
        Binding("f8,shift+delete", "delete", "Delete", id="conversations.delete"),
        Binding("f5", "export('md')", "Export Markdown", id="conversations.export_md"),
        Binding("f6", "export('json')", "Export JSON", id="conversations.export_json"),
    ]

    def __init__(self, store: SessionStore, current: str | None = None) -> None:
        super().__init__(classes="dialog-screen")
        self.store = store
        self.current = current
        self.summaries: list[Summary] = []
        self.shown_query: str | None = None  # the query the list shows (None: loading)
        self.problems_told = False
        self.unreadable: list[Summary] = []

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog wide", id="conversations"):
            yield Label("Conversations", classes="dialog-title")
            yield Input(placeholder="Search titles and messages…", id="conv-search")
            yield OptionList(id="conv-list", classes="picker-list")
            yield Label(
                "enter open · F2 rename · F8 delete · export: F5 Markdown, F6 JSON · esc",
                classes="dialog-hint",
            )

    search_input = child(Input, "#conv-search")
    option_list = child(OptionList, "#conv-list")

    def on_mount(self) -> None:
        self.search_input.focus()
        self.refresh_list()

    @property
    def ops(self) -> ConversationOps:
        return ConversationOps(self.app, self.store)

    # -------------------------------------------------------------- the list
    def refresh_list(self) -> None:
        self._search(self.search_input.value)

    @on(Input.Changed, "#conv-search")
    def _typed(self, event: Input.Changed) -> None:
        self._search(event.value)

    @work(exclusive=True, group="conversations-search")
    async def _search(self, text: str) -> None:
        problems: list[str] = []
        unreadable: list[Summary] = []
        found = await asyncio.to_thread(
            self.store.search, text, problems.append, unreadable=unreadable
        )
        self.unreadable = unreadable  # listed (below the others) so they can be deleted
        self._show(found, text, problems)

    def _show(self, found: list[Summary], query: str, problems: list[str]) -> None:
        keep = self.selected_id
        self.summaries = found
        options = self.option_list
        options.clear_options()
        if not found and not self.unreadable:
            empty = "No conversation matches." if query.strip() else "No saved conversations yet."
            options.add_option(Option(Text(empty, style="italic"), disabled=True))
        for i, s in enumerate(found):
            if i:
                options.add_option(None)  # a separator line
            options.add_option(Option(self._prompt(s, bool(query.strip())), id=s.id))
        for i, s in enumerate(self.unreadable):  # shown as such: F8 still deletes one
            if i or found:
                options.add_option(None)
            row = Text(s.title, style="bold italic", no_wrap=True, overflow="ellipsis")
            row.append("\n" + s.problem, style="dim")
            options.add_option(Option(row, id=s.id))
        ids = [s.id for s in found + self.unreadable]
        if ids:
            options.highlighted = ids.index(keep) if keep in ids else 0
        if problems and not self.problems_told:
            self.problems_told = True  # once per opening, not on every keystroke
            shown = problems[0] + (f" (+{len(problems) - 1} more)" if len(problems) > 1 else "")
            self.app.notify(f"unreadable: {shown}", severity="warning", markup=False)
        self.shown_query = query

    def _prompt(self, s: Summary, searching: bool) -> Text:
        text = Text(s.title, style="bold", no_wrap=True, overflow="ellipsis")
        if s.id == self.current:
            text.append("  (open)", style="italic")
        detail = [when(s.updated), s.model_id or "model unknown", n_turns(s.n_turns)]
        text.append("\n" + " · ".join(detail), style="dim")
        if searching and s.snippet:
            text.append("\n" + s.snippet, style="italic")
        return text

    @property
    def selected_id(self) -> str | None:
        options = self.option_list
        index = options.highlighted
        if index is None or index >= options.option_count:
            return None
        return options.get_option_at_index(index).id

    # -------------------------------------------------------------- actions
    def action_move(self, delta: int) -> None:
        if delta < 0:
            self.option_list.action_cursor_up()
        else:
            self.option_list.action_cursor_down()

    @on(Input.Submitted, "#conv-search")
    def _enter(self, event: Input.Submitted) -> None:
        event.stop()
        self.open_selected()

    @on(OptionList.OptionSelected, "#conv-list")
    def _picked(self, event: OptionList.OptionSelected) -> None:
        event.stop()
        self.open_selected()

    def open_selected(self) -> None:
        conv_id = self.selected_id
        if conv_id is not None:
            self.dismiss(conv_id)

    def _need_selection(self) -> str | None:
        conv_id = self.selected_id
        if conv_id is None:
            self.app.notify("No conversation selected.", severity="warning")
        return conv_id

    def action_rename(self) -> None:
        if conv_id := self._need_selection():
            self.ops.rename(conv_id, self.refresh_list)

    def action_delete(self) -> None:
        if conv_id := self._need_selection():
            self.ops.delete(conv_id, self._after_delete)

    def _after_delete(self) -> None:
        self.current = getattr(getattr(self.app, "chat", None), "session_id", self.current)
        self.refresh_list()

    def action_export(self, fmt: str) -> None:
        if conv_id := self._need_selection():
            self.ops.export(conv_id, fmt)

    def action_close(self) -> None:
        self.dismiss(None)

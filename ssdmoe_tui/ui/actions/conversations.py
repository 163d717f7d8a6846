"""Saved conversations: choose one (ctrl+o), open it, rename, delete, export this one."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ssdmoe_tui import paths
from ssdmoe_tui.errors import printable, user_message
from ssdmoe_tui.ui.actions.model import request_k
from ssdmoe_tui.ui.screens.conversations import (
    ConversationOps,
    ConversationsScreen,
    is_saved,
    resumed_notice,
    store_of,
)


def choose(app: Any) -> None:
    store = store_of(app)
    if store is None:
        app.notify("Conversations are not saved in this window.", severity="warning")
    elif not isinstance(app.screen, ConversationsScreen):

        async def chosen(conv_id: str | None) -> None:
            if conv_id:
                await open_conversation(app, conv_id)

        app.push_screen(ConversationsScreen(store, app.chat.session_id), chosen)


async def open_conversation(app: Any, conv_id: str) -> bool:
    """Show a saved conversation in this window; its KV checkpoint loads (engine side)
    with the next turn. The current chat stays as it is if this fails."""
    chat = app.chat
    if conv_id == chat.session_id:
        return True
    if app.inflight is not None or app.session_store is None:
        why = "saved conversations are not available here"
        if app.inflight is not None:
            why = "a reply is still streaming: Esc stops it first"
        app.notify(f"Not opened: {why}.", severity="warning")
        return False
    before = (chat.session_id, list(chat.history))
    try:
        turns = chat.open_session(conv_id)
    except Exception as e:  # noqa: BLE001 - one line; the current chat is untouched
        chat.session_id, chat.history = before
        app.notify(
            f"could not open the conversation: {user_message(e)}",
            severity="error",
            markup=False,
        )
        return False
    pane = app.chat_pane
    await pane.transcript.clear()
    app.panel.new_conversation(resumed=bool(turns))
    await pane.show_turns(turns)
    pane.editing, pane.given_back = False, None
    if chat.gen.k is not None and chat.model is not None:
        request_k(app, chat.gen.k)  # the conversation goes on at its own K
    model = chat.model.name if chat.model else None
    await pane.transcript.add_notice(resumed_notice(store_of(app), conv_id, model))
    pane.transcript.action_pin()
    pane.prompt.focus()
    return True


def _same_model(asked: str, name: str, folder: str) -> bool:
    """Whether `asked` (a folder or repo id as typed) names the saved model."""
    if not asked:  # the demo
        return folder == str(paths.demo_model_dir()) or name == paths.demo_model_dir().name
    if folder and Path(asked).expanduser().resolve() == Path(folder).resolve():
        return True
    return asked.rstrip("/").rsplit("/", 1)[-1] == name


def resume_model(app: Any, asked: str) -> tuple[str, str | None]:
    """`--resume`: the model to open (`asked`, from the command line or config.toml, or
    "" for the demo) and the line that says so. With no model asked for, the
    conversation's own is opened again from the folder it was saved with; where that is
    gone (or another model was asked for), the line says which model wrote it, and its
    K is not carried over to a model it was not chosen for."""
    store, chat = app.session_store, app.chat
    model_of = getattr(store, "model_of", None)
    if model_of is None or chat.session_id is None:
        return asked, None
    name, folder = model_of(chat.session_id)
    if not name or _same_model(asked, name, folder):
        return asked, None
    shown = printable(name, 80)
    if not asked and folder and Path(folder).is_dir():
        return folder, f"Reopened on this conversation's own model, {shown}."
    chat.gen.k = chat.defaults().k  # a K chosen for its own model
    if asked:
        return asked, (
            f"This conversation was written by {shown}; it goes on with "
            f"{printable(asked, 120)}, as asked (at that model's K)."
        )
    where = f" ({printable(folder, 120)})" if folder else ""
    return "", (
        f"This conversation was written by {shown}, which is not found here{where}: it "
        "goes on with the demo model (F4 picks another)."
    )


def _saved(app: Any) -> tuple[ConversationOps, str] | None:
    store = store_of(app)
    if store is None:
        app.notify("Conversations are not saved in this window.", severity="warning")
        return None
    if not is_saved(store, app.chat.session_id):
        app.notify("This chat is saved after its first reply.", severity="warning")
        return None
    return ConversationOps(app, store), app.chat.session_id


def rename(app: Any) -> None:
    if found := _saved(app):
        found[0].rename(found[1])


def delete(app: Any) -> None:
    if found := _saved(app):
        found[0].delete(found[1])


def export(app: Any, fmt: str) -> None:
    if found := _saved(app):
        found[0].export(found[1], fmt)

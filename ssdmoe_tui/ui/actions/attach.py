"""Attach to a running `ssdmoe serve` on this machine, and come back to a model of our own.

Attached, the chat's engine is `chat.remote.RemoteEngine`: the app's own engine is shut
down first (its model's memory and machine-wide claim go back), so a chat and an agent
share the server's one loaded model. Picking a local model in F4 later builds the app's
own engine again (`SsdmoeApp.start_local_engine`). A server that wants an API key gets
it from `$SSDMOE_API_KEY` or a dialog; it is kept in memory only, never written."""

from __future__ import annotations

import asyncio
import os
from typing import Any

from ssdmoe_tui.chat.remote import RemoteEngine
from ssdmoe_tui.errors import user_message
from ssdmoe_tui.options import is_loopback_url
from ssdmoe_tui.ui.screens.dialogs import AskScreen

API_KEY_ENV = "SSDMOE_API_KEY"


def attach(app: Any, url: str, *, key_required: bool | None = None) -> None:
    """Use the server at `url` as the chat's engine (asks for its key if it needs one).

    `key_required`: what the server's claim says (F4); None: not known (`--attach URL`),
    then `$SSDMOE_API_KEY` goes along if set and the server is on loopback. A server
    that wants no key gets none."""
    if app.inflight is not None:
        app.notify("A reply is streaming: Esc stops it, then attach again.", severity="warning")
        return
    if app.chat.engine_starting or app.chat.loading is not None:
        # The old engine's late events (ModelLoaded, errors) would land on the server's
        # session, and a load cut short by the swap could keep its memory and claim.
        app.notify("A model is loading; attach again once it is ready.", severity="warning")
        return
    key = env_key_for(url, key_required)
    if key_required and key is None:

        def given(value: str | None) -> None:
            if value:
                _start(app, url, value)

        app.push_screen(
            AskScreen(
                f"API key of the server at {url.removeprefix('http://')}",
                placeholder="the server's --api-key (kept in memory only)",
                hint=f"Or set {API_KEY_ENV} before starting ssdmoe.",
                password=True,
            ),
            given,
        )
        return
    _start(app, url, key)


def env_key_for(url: str, key_required: bool | None) -> str | None:
    """`$SSDMOE_API_KEY` if it goes to `url` on its own: only to a server on this
    machine's loopback (a lock claim can advertise no other), and not to one that said
    it wants no key; elsewhere the key is asked for."""
    if key_required is False or not is_loopback_url(url):
        return None
    return os.environ.get(API_KEY_ENV) or None


def _start(app: Any, url: str, key: str | None) -> None:
    try:
        remote = RemoteEngine(url, app.feed, api_key=key)
    except ValueError as e:
        app.notify(str(e), severity="error", markup=False)
        return
    app.status_bar.loading = f"the server at {remote.where}"
    app.chat_pane.current = None
    app.run_worker(_swap(app, remote), group="engine-swap", exclusive=True, exit_on_error=False)


async def _swap(app: Any, remote: RemoteEngine) -> None:
    old = app.chat.use_engine(remote, f"the server at {remote.where}")
    if old is not None:
        await asyncio.to_thread(old.shutdown, 5.0)  # its model and claim go back
    try:
        remote.start()
    except Exception as e:  # noqa: BLE001 - a thread that cannot start: one line
        app.notify(f"cannot attach: {user_message(e)}", severity="error", markup=False)


def detach(app: Any, path: str) -> None:
    """Leave the server: this app's own engine is built again and opens `path`."""
    if app.inflight is not None:
        app.notify("A reply is streaming: Esc stops it, then pick the model again.")
        return
    remote = app.chat.use_engine(None, path or "the demo model")
    app.status_bar.loading = path or "the demo model"
    app.run_worker(_rebuild(app, remote, path), group="engine-swap", exclusive=True)


async def _rebuild(app: Any, remote: Any, path: str) -> None:
    if remote is not None:
        await asyncio.to_thread(remote.shutdown, 5.0)
    await app.start_local_engine(path)

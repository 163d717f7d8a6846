"""K, the expert-cache budget and the model: ask, validate through the controller, apply.

The controller (`chat.controller`) refuses a bad value before anything changes; these
functions only say so on screen or pass the value on to the K control / the engine."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from ssdmoe_tui import paths
from ssdmoe_tui.chat.controller import Refused
from ssdmoe_tui.chat.progress import LoadProgress
from ssdmoe_tui.config import config_path
from ssdmoe_tui.ui.actions import attach
from ssdmoe_tui.ui.screens.dialogs import AskScreen, ConfirmScreen
from ssdmoe_tui.ui.screens.models import OTHER, ModelsScreen, served_url


def request_k(app: Any, k: int) -> None:
    """Set K on the K control (which tells the engine), or say why not."""
    try:
        app.chat.check_k(k)
    except Refused as e:
        app.notify(str(e), severity="error")
        return
    app.panel.k_control.set_k(k)


def reset_k(app: Any) -> None:
    """A new chat starts from the config: its K (none set: the model's trained K), not
    the last chat's."""
    info = app.chat.model
    if info is None:
        return
    k = app.chat.gen.k or info.trained_k
    try:
        app.chat.check_k(k)
    except Refused:
        k = info.trained_k
    if k != app.panel.k_control.k:
        app.panel.k_control.set_k(k)


def step_k(app: Any, delta: int) -> None:
    control = app.panel.k_control
    if not control.num_experts:
        app.notify("No model loaded yet.", severity="warning")
        return
    control.set_k(control.k + delta)


def ask_k(app: Any) -> None:
    control = app.panel.k_control
    if not control.num_experts:
        app.notify("No model loaded yet.", severity="warning")
        return

    def done(value: str | None) -> None:
        if value:
            try:
                request_k(app, int(value))
            except ValueError:
                app.notify(f"K must be a whole number, not {value!r}", severity="error")

    app.push_screen(
        AskScreen(
            f"K (experts per token), 1..{control.num_experts}",
            str(control.k),
            hint=f"The model was trained with K = {control.trained_k}; lower is faster, "
            "and trades quality for speed.",
        ),
        done,
    )


def request_expert_cache(app: Any, size: str) -> None:
    """The engine reloads the model with the new budget (ModelLoaded follows); a bad size
    is refused here and changes nothing."""
    try:
        app.chat.set_expert_cache(size)
    except Refused as e:
        app.notify(str(e), severity="error", markup=False)
        return
    app.chat_pane.current = None
    model = app.chat.model
    app.status_bar.loading = f"{model.name if model else ''} with a {size} expert cache"


def ask_expert_cache(app: Any) -> None:
    model = app.chat.model
    current = model.expert_cache_budget if model else None
    hint = f"Now {current:,} bytes. " if current is not None else ""

    def done(value: str | None) -> None:
        if value:
            request_expert_cache(app, value)

    app.push_screen(
        AskScreen("Expert-cache budget", "auto", hint=hint + "auto, 512M, 4G, ..."), done
    )


def open_model(app: Any, path: str, k: int | None = None) -> None:
    """Load (or switch to) a model; progress and errors arrive as events. The loaded
    model stays loaded if this one fails. Attached to a server, this app's own engine
    is built again first."""
    if app.chat.remote:
        attach.detach(app, path)
        return
    try:
        app.chat.open_model(path, k)
    except Refused as e:
        app.notify(str(e), severity="warning")
        return
    app.chat_pane.current = None
    app.load_progress = LoadProgress()
    app.status_bar.loading = path or "the demo model"


def choose_model(app: Any) -> None:
    """F4: the models found on this machine, or "Other…"."""
    if isinstance(app.screen, ModelsScreen):
        return
    info = app.chat.model
    current = info.path if info else app.chat.loading

    def chosen(path: str | None) -> None:
        if path is None:
            return
        loaded = app.chat.model
        server = served_url(path)
        if server is not None:
            if loaded is not None and loaded.server == server.url:
                app.notify(f"Already attached to {server.url}.", markup=False)
            else:
                attach.attach(app, server.url, key_required=server.key_required)
        elif path == OTHER:
            ask_model(app)
        elif loaded is not None and path and Path(path) == Path(loaded.path):
            app.notify(f"{loaded.name} is already loaded.", markup=False)
        else:
            open_model(app, path)

    # The loaded model's own folder is listed even when no scanned folder holds it.
    extra = [info.path] if info and not info.server else []
    app.push_screen(ModelsScreen(current, extra), chosen)


def same_model(path: str, info: Any) -> bool:
    """Whether `path` (as typed; "" is the demo) names the loaded model's folder."""
    if info is None or info.server:
        return False
    try:
        wanted = Path(path).resolve() if path else paths.demo_model_dir().resolve()
        return wanted == Path(info.path).resolve()
    except (OSError, RuntimeError):  # a loop of links: not the same, the load says why
        return False


def ask_model(app: Any) -> None:
    def done(value: str | None) -> None:
        if value is None:
            return
        path = os.path.expanduser(value)
        loaded = app.chat.model
        if not same_model(path, loaded):
            open_model(app, path)
            return

        def answered(yes: bool | None) -> None:
            if yes:
                open_model(app, path)

        app.push_screen(  # the dialog opens on the loaded model's folder: Enter alone
            ConfirmScreen(f"{loaded.name} is already loaded. Load it again?", yes="Reload",
                          no="Keep it"),
            answered,
        )  # fmt: skip

    info = app.chat.model
    app.push_screen(
        AskScreen(
            "Open model",
            info.path if info else "",
            placeholder="/path/to/checkpoint or org/repo (empty: the demo model)",
            hint="A folder with config.json and *.safetensors, or a Hugging Face repo id.",
        ),
        done,
    )


def open_model_folder(app: Any) -> None:
    if app.chat.model is None:
        app.notify("No model loaded.", severity="warning")
        return
    folder = Path(app.chat.model.path)
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
    app.copy_to_clipboard(str(folder))
    app.notify(f"{folder}  (path copied)", title="model folder")


def show_config_path(app: Any) -> None:
    path = app.settings.config.path if app.settings.config else config_path()
    app.copy_to_clipboard(str(path))
    app.notify(f"{path}  (path copied)", title="config")

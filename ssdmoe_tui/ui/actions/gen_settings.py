"""F9: this conversation's generation settings (system prompt, sampling, max tokens, K,
speculative decoding)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from ssdmoe_tui.chat.controller import Refused
from ssdmoe_tui.config import GenSettings
from ssdmoe_tui.ui.screens.gen_settings import GenSettingsScreen


def cuda_note(app: Any, mode: str) -> str:
    """What speculation does on MLX-CUDA, said when it is chosen there (F9's tooltip and
    the panel's say it too): a verify pass's logits differ from one-token decode (up to
    0.28 on the H200), so near-ties may flip tokens; `auto` drafts nothing there."""
    info = app.chat.model
    if info is None or "cuda" not in info.device.lower() or mode in ("", "off"):
        return ""
    if mode == "auto":
        return " On MLX-CUDA auto drafts nothing: replies are plain decoding."
    return (
        " On MLX-CUDA a verify pass's logits differ from one-token decode: "
        "near-ties may flip tokens against plain decoding."
    )


def edit(app: Any) -> None:
    """Open the settings dialog on the conversation's values (K as the control shows it);
    the controller checks and stores what comes back, and the K control follows."""
    if isinstance(app.screen, GenSettingsScreen):
        return
    info = app.chat.model
    control = app.panel.k_control
    current = replace(app.chat.gen, k=control.k if info else None)

    def chosen(gen: GenSettings | None) -> None:
        if gen is None:
            return
        try:
            app.chat.set_gen(gen)
        except Refused as e:
            app.notify(str(e), severity="error")
            return
        if gen.k is not None and app.chat.model is not None:
            control.set_k(gen.k, notify=False)
            app.status_bar.k = control.k
        app.notify("Settings saved for this conversation." + cuda_note(app, gen.speculate))

    screen = GenSettingsScreen(
        current, info.num_experts if info else 0, tools=app.chat.tools is not None
    )
    app.push_screen(screen, chosen)


def toggle_thinking(app: Any) -> None:
    """The palette's "Thinking on/off": this conversation's `enable_thinking`."""
    gen = replace(app.chat.gen, thinking=not app.chat.gen.thinking)
    try:
        app.chat.set_gen(gen)
    except Refused as e:
        app.notify(str(e), severity="error")
        return
    state = "on" if gen.thinking else "off"
    app.notify(f"Thinking {state} for this conversation (from the next reply).")


def set_speculate(app: Any, mode: str) -> None:
    """The palette's "Speculative decoding: MODE": this conversation's `speculate`."""
    gen = replace(app.chat.gen, speculate=mode)
    try:
        app.chat.set_gen(gen)
    except Refused as e:
        app.notify(str(e), severity="error")
        return
    app.notify(
        f"Speculative decoding {mode} for this conversation (from the next reply)."
        + cuda_note(app, mode)
    )

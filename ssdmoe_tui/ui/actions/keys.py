"""Key bindings by group (F1 lists them with their ids) and the config's [keymap]."""

from __future__ import annotations

from typing import Any

from textual.binding import Binding

from ssdmoe_tui.ui.screens.conversations import ConversationsScreen
from ssdmoe_tui.ui.screens.dialogs import AskScreen, ConfirmScreen
from ssdmoe_tui.ui.screens.gen_settings import GenSettingsScreen
from ssdmoe_tui.ui.screens.models import ModelsScreen
from ssdmoe_tui.ui.widgets.k_slider import KSlider
from ssdmoe_tui.ui.widgets.prompt_input import PromptInput
from ssdmoe_tui.ui.widgets.transcript import ChatMessage, Transcript


def binding_groups(app_class: type) -> list[tuple[str, list[Binding]]]:
    def of(cls: type) -> list[Binding]:
        return [b for b in cls.BINDINGS if isinstance(b, Binding)]

    return [
        ("app", of(app_class)),
        ("prompt", of(PromptInput)),
        ("transcript", of(Transcript)),
        ("message", of(ChatMessage)),
        ("K control", of(KSlider)),
        ("dialogs", of(ConfirmScreen) + of(AskScreen) + of(GenSettingsScreen)),
        ("conversations", of(ConversationsScreen)),
        ("models", of(ModelsScreen)),
    ]


def apply_keymap(app: Any, keymap: dict[str, str]) -> None:
    """The config's [keymap]: binding id -> keys; an unknown id is named once, skipped."""
    known = {b.id for _, bindings in binding_groups(type(app)) for b in bindings if b.id}
    unknown = sorted(set(keymap) - known)
    if unknown:
        app.notify(
            f"config keymap: unknown binding id(s) {', '.join(unknown)} (F1 lists them)",
            severity="warning",
        )
    app.set_keymap({k: v for k, v in keymap.items() if k in known})

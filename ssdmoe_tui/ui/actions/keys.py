"""Key bindings by group (F1 lists them with their ids) and the config's [keymap]."""

from __future__ import annotations

from typing import Any

from textual.binding import Binding

from ssdmoe_tui.config import Binding as ConfigBinding
from ssdmoe_tui.config import Bindings
from ssdmoe_tui.ui.screens.conversations import ConversationsScreen
from ssdmoe_tui.ui.screens.dialogs import AskScreen, ConfirmScreen
from ssdmoe_tui.ui.screens.gen_settings import GenSettingsScreen
from ssdmoe_tui.ui.screens.models import ModelsScreen
from ssdmoe_tui.ui.screens.tool_approval import ToolApprovalScreen
from ssdmoe_tui.ui.screens.tools import ToolsScreen
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
        ("tool call", of(ToolApprovalScreen)),
        ("tools (F10)", of(ToolsScreen)),
    ]


def app_bindings(app_class: type) -> Bindings:
    """The app's bindings by scope (`config.Bindings`), so the config loader checks the
    [keymap] where it reads the file: bindings that answer in the same place (one screen
    or widget) shadow each other on one key; the same key in two scopes is ordinary
    (focus decides)."""
    classes = [app_class, PromptInput, Transcript, ChatMessage, KSlider, ConfirmScreen,
               AskScreen, GenSettingsScreen, ConversationsScreen, ModelsScreen,
               ToolApprovalScreen, ToolsScreen]  # fmt: skip
    return Bindings(
        tuple(
            tuple(
                ConfigBinding(b.id or "", b.action, b.key)
                for b in cls.BINDINGS
                if isinstance(b, Binding)
            )
            for cls in classes
        )
    )


def apply_keymap(app: Any, keymap: dict[str, str]) -> None:
    """The config's [keymap]: binding id -> keys; an unknown id is skipped (a clash is
    kept: the user asked for it). Its problems were said once, by the config loader
    (`config.load_config` with `app_bindings`), not here again."""
    known = app_bindings(type(app)).ids()
    app.set_keymap({k: v for k, v in keymap.items() if k in known})

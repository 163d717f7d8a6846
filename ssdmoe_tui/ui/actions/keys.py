"""Key bindings by group (F1 lists them with their ids) and the config's [keymap]."""

from __future__ import annotations

from typing import Any

from textual.binding import Binding

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


def _scopes(app_class: type) -> list[list[Binding]]:
    """Bindings that answer in the same place (one screen or widget): two of them on one
    key shadow each other; the same key in two scopes is ordinary (focus decides)."""
    classes = [app_class, PromptInput, Transcript, ChatMessage, KSlider, ConfirmScreen,
               AskScreen, GenSettingsScreen, ConversationsScreen, ModelsScreen,
               ToolApprovalScreen, ToolsScreen]  # fmt: skip
    return [[b for b in cls.BINDINGS if isinstance(b, Binding)] for cls in classes]


def keymap_problems(app_class: type, keymap: dict[str, str], source: str) -> list[str]:
    """One line per problem of the config's [keymap] (`source`: the file): ids no binding
    has, and a remapped key that another binding of the same scope already answers."""
    known = {b.id for _, bindings in binding_groups(app_class) for b in bindings if b.id}
    out = []
    unknown = sorted(set(keymap) - known)
    if unknown:
        shown = ", ".join(repr(u[:40]) for u in unknown[:5]) + (" ..." if len(unknown) > 5 else "")
        out.append(f"{source} [keymap]: unknown binding id(s) {shown} ignored (F1 lists them)")
    for scope in _scopes(app_class):
        owner: dict[str, str] = {}
        for b in scope:
            name = b.id or b.action
            keys = keymap.get(b.id, b.key) if b.id else b.key
            for key in (k.strip() for k in keys.split(",") if k.strip()):
                first = owner.setdefault(key, name)
                if first != name and (first in keymap or name in keymap):
                    out.append(
                        f"{source} [keymap]: {first} and {name} are both on {key!r} "
                        f"(one shadows the other; F1 shows the keys)"
                    )
    return out


def apply_keymap(app: Any, keymap: dict[str, str], source: str = "config.toml") -> None:
    """The config's [keymap]: binding id -> keys; each problem is one warning naming the
    file, an unknown id is skipped (a clash is kept: the user asked for it)."""
    for line in keymap_problems(type(app), keymap, source):
        app.notify(line, severity="warning", timeout=10, markup=False)
    known = {b.id for _, bindings in binding_groups(type(app)) for b in bindings if b.id}
    app.set_keymap({k: v for k, v in keymap.items() if k in known})

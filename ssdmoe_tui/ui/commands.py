"""Command palette (ctrl+p): chat, conversations, K, expert cache, panel, themes, model,
config."""

from __future__ import annotations

import re
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING

from textual.command import DiscoveryHit, Hit, Hits, Provider

if TYPE_CHECKING:
    from ssdmoe_tui.ui.app import SsdmoeApp

_SET_K = re.compile(r"(?:set\s+)?k\s*=?\s*(\d+)", re.IGNORECASE)
_SET_CACHE = re.compile(r"(?:set\s+)?(?:expert[-\s]?)?cache\s*=?\s*(\S+)", re.IGNORECASE)
_OPEN = re.compile(r"open(?:\s+model)?\s+(\S.*)", re.IGNORECASE)


class SsdmoeCommands(Provider):
    @property
    def _app(self) -> SsdmoeApp:
        return self.app  # type: ignore[return-value]

    def _static(self) -> list[tuple[str, str, Callable[[], object]]]:
        app = self._app
        commands: list[tuple[str, str, Callable[[], object]]] = [
            ("New chat", "Clear the conversation and start over", app.action_new_chat),
            ("Stop generation", "Stop the streaming reply and keep what arrived", app.action_stop),
            ("Set K…", "Experts per token, 1..num_experts (or type: k 4)", app.action_ask_k),
            (
                "Set expert-cache budget…",
                "Memory for cached experts: auto, 512M, 4G (or type: cache 2G)",
                app.action_ask_expert_cache,
            ),
            ("Toggle engine panel", "Show or hide the engine side column", app.action_toggle_panel),
            (
                "Switch model",
                "Pick a model found on this machine (F4)",
                app.action_models,
            ),
            ("Open model…", "Load a checkpoint folder (or type: open /path)", app.action_ask_model),
            (
                "Conversations",
                "Saved conversations: search, open, rename (ctrl+o)",
                app.action_conversations,
            ),
            (
                "Clear conversation",
                "New context in this window; the conversation stays in the list",
                app.action_new_chat,
            ),
            (
                "Rename conversation…",
                "Give this conversation a title",
                app.action_rename_conversation,
            ),
            (
                "Delete conversation…",
                "Remove this conversation and its KV checkpoints (asks first)",
                app.action_delete_conversation,
            ),
            (
                "Export conversation as Markdown",
                "Write this conversation to a .md file",
                partial(app.action_export_conversation, "md"),
            ),
            (
                "Export conversation as JSON",
                "Write this conversation, token ids included, to a .json file",
                partial(app.action_export_conversation, "json"),
            ),
            (
                "Open the model folder",
                "Show the loaded model's folder",
                app.action_open_model_folder,
            ),
            (
                "Show config path",
                "Where config.toml lives (also copied)",
                app.action_show_config_path,
            ),
            ("Keys", "Every key binding and its id", app.action_keys),
        ]
        for name in sorted(app.available_themes):
            commands.append(
                (f"Theme: {name}", "Switch theme (remembered)", partial(app.choose_theme, name))
            )
        return commands

    async def discover(self) -> Hits:
        for title, help_text, callback in self._static():
            if title.startswith("Theme: ") and not title.startswith("Theme: ssdmoe"):
                continue  # keep the opening list short; every theme is still searchable
            yield DiscoveryHit(title, callback, help=help_text)

    async def search(self, query: str) -> Hits:
        app = self._app
        text = query.strip()
        if m := _SET_K.fullmatch(text):
            k = int(m.group(1))
            yield Hit(1.0, f"Set K to {k}", partial(app.request_k, k), help="Experts per token")
        elif m := _SET_CACHE.fullmatch(text):
            size = m.group(1)
            yield Hit(
                1.0,
                f"Set expert-cache budget to {size}",
                partial(app.request_expert_cache, size),
                help="auto, 512M, 4G, ...",
            )
        elif m := _OPEN.fullmatch(text):
            path = m.group(1).strip()
            yield Hit(
                1.0, f"Open model {path}", partial(app.open_model, path), help="Load a checkpoint"
            )
        matcher = self.matcher(query)
        for title, help_text, callback in self._static():
            score = matcher.match(title)
            if score > 0:
                yield Hit(score, matcher.highlight(title), callback, help=help_text)

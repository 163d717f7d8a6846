"""Command palette (ctrl+p): chat, conversations, K, expert cache, panel, themes, model,
config. Each command runs an app action by name or a function of `ui.actions` on the
app: the palette does not know the app's class."""

from __future__ import annotations

import re
from collections.abc import Callable
from functools import partial

from textual.command import DiscoveryHit, Hit, Hits, Provider

from ssdmoe_tui.ui.actions import conversations, gen_settings, model

_SET_K = re.compile(r"(?:set\s+)?k\s*=?\s*(\d+)", re.IGNORECASE)
_SET_CACHE = re.compile(r"(?:set\s+)?(?:expert[-\s]?)?cache\s*=?\s*(\S+)", re.IGNORECASE)
SPECULATE_HINTS = {
    "off": "Decode one token per pass",
    "auto": "Draft where it pays; greedy replies unchanged on CPU (on MLX-CUDA: off)",
    # on MLX-CUDA a verify pass's logits differ from one-token decode: near-ties may flip
    "ngram": "Draft from the conversation (quotes, code); MLX-CUDA: near-ties may flip tokens",
    "mtp": "Draft with the checkpoint's MTP head (where it has one)",
}
_OPEN = re.compile(r"open(?:\s+model)?\s+(\S.*)", re.IGNORECASE)


# The fixed commands: (title, help, what runs) where what runs is an app action's name or a
# `ui.actions` function with its arguments (called with the app first).
_COMMANDS: tuple[tuple[str, str, str | tuple], ...] = (
    ("New chat", "A new conversation (ctrl+n); this one stays saved in the list", "new_chat"),
    ("Stop generation", "Stop the streaming reply and keep what arrived", "stop"),
    (
        "Regenerate last reply",
        "A new sample, or the same greedy reply at the K now set (ctrl+g)",
        "regenerate",
    ),
    (
        "Edit and resend last prompt",
        "Put the last prompt back in the box; Enter resends it (ctrl+l)",
        "edit_last",
    ),
    (
        "Generation settings…",
        "System prompt, temperature, top-p, max tokens, K, speculation for this conversation (F9)",
        "gen_settings",
    ),
    (
        "Thinking on/off",
        "Models that think (Qwen3...): reason first, or answer at once (this chat)",
        (gen_settings.toggle_thinking,),
    ),
    *(
        (
            f"Speculative decoding: {mode}",
            SPECULATE_HINTS[mode] + " (this chat; F9 has it too)",
            (gen_settings.set_speculate, mode),
        )
        for mode in SPECULATE_HINTS
    ),
    ("Set K…", "Experts per token, 1..num_experts (or type: k 4)", (model.ask_k,)),
    (
        "Set expert-cache budget…",
        "Memory for cached experts: auto, 512M, 4G (or type: cache 2G)",
        (model.ask_expert_cache,),
    ),
    (
        "Tools (MCP servers)",
        "The MCP servers from config.toml, their state and tools (F10)",
        "tools",
    ),
    ("Toggle engine panel", "Show or hide the engine side column", "toggle_panel"),
    ("Switch model", "Pick a model found on this machine (F4)", "models"),
    ("Open model…", "Load a checkpoint folder (or type: open /path)", (model.ask_model,)),
    ("Conversations", "Saved conversations: search, open, rename (ctrl+o)", "conversations"),
    (
        "Clear conversation",
        "= New chat: a new context in this window; this one stays in the list",
        "new_chat",
    ),
    ("Rename conversation…", "Give this conversation a title", (conversations.rename,)),
    (
        "Delete conversation…",
        "Remove this conversation and its KV checkpoints (asks first)",
        (conversations.delete,),
    ),
    (
        "Export conversation as Markdown",
        "Write this conversation to a .md file",
        (conversations.export, "md"),
    ),
    (
        "Export conversation as JSON",
        "Write this conversation, token ids included, to a .json file",
        (conversations.export, "json"),
    ),
    ("Open the model folder", "Show the loaded model's folder", (model.open_model_folder,)),
    ("Show config path", "Where config.toml lives (also copied)", (model.show_config_path,)),
    ("Keys", "Every key binding and its id", "keys"),
)


class SsdmoeCommands(Provider):
    def _action(self, name: str) -> Callable[[], object]:
        return partial(self.app.run_action, name)

    def _run(self, function: Callable[..., object], *args: object) -> Callable[[], object]:
        """One of `ui.actions`' functions, on this app."""
        return partial(function, self.app, *args)

    def _static(self) -> list[tuple[str, str, Callable[[], object]]]:
        commands = [
            (title, help_text, self._action(what) if isinstance(what, str) else self._run(*what))
            for title, help_text, what in _COMMANDS
        ]
        for name in sorted(self.app.available_themes):
            commands.append(
                (
                    f"Theme: {name}",
                    "Switch theme (remembered)",
                    partial(setattr, self.app, "theme", name),
                )
            )
        return commands

    async def discover(self) -> Hits:
        for title, help_text, callback in self._static():
            if title.startswith("Theme: ") and not title.startswith("Theme: ssdmoe"):
                continue  # keep the opening list short; every theme is still searchable
            yield DiscoveryHit(title, callback, help=help_text)

    async def search(self, query: str) -> Hits:
        text = query.strip()
        if m := _SET_K.fullmatch(text):
            k = int(m.group(1))
            yield Hit(1.0, f"Set K to {k}", self._run(model.request_k, k), help="Experts per token")
        elif m := _SET_CACHE.fullmatch(text):
            size = m.group(1)
            yield Hit(
                1.0,
                f"Set expert-cache budget to {size}",
                self._run(model.request_expert_cache, size),
                help="auto, 512M, 4G, ...",
            )
        elif m := _OPEN.fullmatch(text):
            path = m.group(1).strip()
            yield Hit(
                1.0,
                f"Open model {path}",
                self._run(model.open_model, path),
                help="Load a checkpoint",
            )
        matcher = self.matcher(query)
        for title, help_text, callback in self._static():
            score = matcher.match(title)
            if score > 0:
                yield Hit(score, matcher.highlight(title), callback, help=help_text)

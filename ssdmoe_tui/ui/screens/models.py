"""F4: the model picker. Lists `scan_models()` (hub cache, SSDMOE_MODEL_DIRS, the demo
model) with what matters for streaming; unsupported checkpoints are shown, disabled,
with the reason. Choosing one returns its path: the app sends LoadModel, and the
engine unloads the current model first (progress in the engine panel). A running
`ssdmoe serve` on this machine is listed first ("server on 127.0.0.1:8080 (MODEL)", from
its lock claim, models/lock.served_models): choosing it attaches the app to it.

Only safetensors *headers* are read (ssdmoe_tui.models.scan, no safetensors import),
in a worker thread so a large hub cache never freezes the screen.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Sequence
from pathlib import Path

from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Label, OptionList
from textual.widgets.option_list import Option

from ssdmoe_tui.errors import user_message
from ssdmoe_tui.models.lock import LockHolder, Served, served_models
from ssdmoe_tui.models.scan import ModelEntry, scan_models
from ssdmoe_tui.paths import demo_model_dir
from ssdmoe_tui.terminal_text import visible
from ssdmoe_tui.ui.child import child
from ssdmoe_tui.ui.fmt import fmt_bytes
from ssdmoe_tui.ui.messages import AskModelPath

OTHER = "__other__"  # option id: type a path or repo id
DEMO = "__demo__"  # option id: the built-in demo model, not written yet
SERVER, SERVER_WITH_KEY = "server:", "server+key:"  # option ids: a running `ssdmoe serve`


def served_url(option_id: str) -> Served | None:
    """The server an option id names (None: a model folder, the demo, Other)."""
    for prefix, key in ((SERVER, False), (SERVER_WITH_KEY, True)):
        if option_id.startswith(prefix):
            return Served(option_id[len(prefix) :], key)
    return None


def server_title(holder: LockHolder) -> str:
    """ "server on 127.0.0.1:8080 (Qwen3-30B-A3B-4bit)": where, and its model's folder name."""
    name = Path(holder.model).name if holder.model else "a model"
    return f"server on {holder.url.removeprefix('http://')} ({name})"


def server_id(holder: LockHolder) -> str:
    return (SERVER_WITH_KEY if holder.key_required else SERVER) + holder.url


def list_all(extra_dirs: Sequence[str]) -> tuple[list[ModelEntry], list[LockHolder]]:
    """The models on this machine and the servers running here (their lock claims)."""
    try:
        servers = served_models()
    except Exception:  # noqa: BLE001 - a lock folder we cannot read lists no server
        servers = []
    return scan_models(extra_dirs), servers


def _real(path: str) -> str:
    return os.path.realpath(os.path.expanduser(path)) if path else ""


def describe(entry: ModelEntry) -> str:
    """The facts line: architecture, size, experts, trained K, MiB per token."""
    parts = [entry.architecture, fmt_bytes(entry.size_bytes)]
    if entry.num_experts:
        parts.append(f"{entry.moe_layers} MoE layers × {entry.num_experts} experts")
        parts.append(f"trained K {entry.trained_k}")
    if entry.mib_per_token:
        parts.append(f"{entry.mib_per_token:,.2f} MiB/token")
    return " · ".join(parts)


class ModelsScreen(ModalScreen[str | None]):
    """Returns the path (or "" for the demo model) to load, or None."""

    BINDINGS = [
        Binding("escape", "close", "Close", id="models.close"),
        Binding("ctrl+r,f5", "rescan", "Rescan", id="models.rescan"),
    ]

    def __init__(self, current_path: str | None = None, extra_dirs: Sequence[str] = ()) -> None:
        super().__init__(classes="dialog-screen")
        self.attached = current_path or ""  # a server's URL, when the app is attached
        self.current = _real(current_path or "")
        self.extra_dirs = tuple(extra_dirs)
        self.entries: list[ModelEntry] | None = None  # None while scanning
        self.servers: list[LockHolder] = []

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog wide", id="models"):
            yield Label("Switch model", classes="dialog-title")
            yield OptionList(
                Option(Text("Scanning…", style="italic"), disabled=True),
                id="model-list",
                classes="picker-list",
            )
            yield Label(
                "enter load · ctrl+r rescan · esc close · more folders: SSDMOE_MODEL_DIRS",
                classes="dialog-hint",
            )

    option_list = child(OptionList, "#model-list")

    def on_mount(self) -> None:
        self.option_list.focus()
        self.action_rescan()

    @work(exclusive=True, group="models-scan")
    async def action_rescan(self) -> None:
        self.entries = None
        try:
            entries, servers = await asyncio.to_thread(list_all, self.extra_dirs)
        except Exception as e:  # noqa: BLE001 - an odd cache must not break the picker
            self.app.notify(f"model scan: {user_message(e)}", severity="error", markup=False)
            entries, servers = [], []
        self.servers = servers
        self._show(entries)

    def _show(self, entries: list[ModelEntry]) -> None:
        options = self.option_list
        options.clear_options()

        def add(option: Option) -> None:
            if options.option_count:
                options.add_option(None)  # a separator line
            options.add_option(option)

        highlight: int | None = None
        for holder in self.servers:
            text = Text(visible(server_title(holder)), style="bold")  # a claim's words
            if holder.url == self.attached:
                highlight = options.option_count
                text.append("  (attached)", style="italic")
            key = " · API key" if holder.key_required else ""
            text.append(
                f"\npid {holder.pid} · chat through its API, sharing its model{key}", style="dim"
            )
            add(Option(text, id=server_id(holder)))
        demo = _real(str(demo_model_dir()))
        has_demo = False
        for entry in entries:
            real = _real(entry.path)
            has_demo = has_demo or real == demo
            if real == self.current:
                highlight = options.option_count
            add(self._option(entry, real == self.current))
        if not has_demo:
            title = Text("demo", style="bold")
            if self.current == demo:
                title.append("  (loaded)", style="italic")
            title.append("\nthe built-in demo model (written on first use)", style="dim")
            add(Option(title, id=DEMO))
        add(Option(Text("Other folder or Hugging Face repo id…", style="italic"), id=OTHER))
        self.entries = entries
        first = next(
            (i for i in range(options.option_count) if not options.get_option_at_index(i).disabled),
            None,
        )
        options.highlighted = highlight if highlight is not None else first

    def _option(self, entry: ModelEntry, current: bool) -> Option:
        title = Text(visible(entry.name), style="bold" if entry.supported else "dim bold")
        if current:
            title.append("  (loaded)", style="italic")
        if entry.source == "hub":
            title.append("  hub", style="dim")
        # names, paths and reasons come from the disk (a folder's name can hold escapes)
        title.append("\n" + visible(describe(entry)), style="" if entry.supported else "dim")
        if entry.supported:
            title.append("\n" + visible(entry.path), style="dim")
        else:
            why = visible(entry.reason or "unknown reason")
            title.append(f"\nnot supported: {why}", style="red")
        return Option(title, id=entry.path, disabled=not entry.supported)

    @on(OptionList.OptionSelected, "#model-list")
    def _picked(self, event: OptionList.OptionSelected) -> None:
        event.stop()
        chosen = event.option.id
        if chosen == OTHER:
            # Dismissed first: the app asks for the path once this screen is gone (asking
            # from here would put the question under this screen, and its answer nowhere).
            self.dismiss(None)
            self.app.post_message(AskModelPath())
        elif chosen == DEMO:
            self.dismiss("")
        elif chosen is not None:
            self.dismiss(chosen)

    def action_close(self) -> None:
        self.dismiss(None)

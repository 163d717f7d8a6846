"""F1: every key binding in the app, with the id to remap it in config.toml."""

from __future__ import annotations

from rich.table import Table
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Label, Static


def _pretty(app: App, keys: str) -> str:
    return "  ".join(app.get_key_display(Binding(k.strip(), "")) for k in keys.split(","))


#: Keys handled by the widgets themselves (not bindings, so not remappable): F1 lists them
#: too, or a user never learns them.
FIXED_KEYS: tuple[tuple[str, str, str], ...] = (
    ("prompt", "enter", "send the prompt"),
    ("prompt", "↑  ↓", "previous / next prompt sent (from the first / last line)"),
    ("prompt", "tab", "complete the @path being typed (a file to attach)"),
    ("prompt", "pageup  pagedown", "scroll the transcript a page"),
    ("prompt", "ctrl+home  ctrl+end", "transcript top / follow the reply again"),
)

#: What a user on an NVIDIA GPU should know before a reply looks hung or changes
#: (docs/app.md, "First run on a GPU"; "Generation settings").
GPU_NOTES = (
    "On MLX-CUDA (NVIDIA): the first reply on a machine compiles the GPU kernels, once "
    "(the demo: about 2 minutes on an H100, 16 s a run once kept in ssdmoe's cache "
    "folder); the header says so meanwhile. Speculative decoding (F9) keeps greedy "
    "replies exact on the CPU; on MLX-CUDA near-ties may flip tokens."
)


def bindings_table(
    app: App, groups: list[tuple[str, list[Binding]]], keymap: dict[str, str]
) -> Table:
    table = Table(expand=False, box=None, padding=(0, 2, 0, 0), show_edge=False)
    table.add_column("where", style="dim", no_wrap=True)
    table.add_column("keys", style="bold", no_wrap=True)
    table.add_column("does")
    table.add_column("id (for \\[keymap])", style="dim", no_wrap=True)
    for where, bindings in groups:
        for binding in bindings:
            keys = keymap.get(binding.id or "", binding.key)
            does = binding.description or binding.action
            table.add_row(where, _pretty(app, keys), does, binding.id or "")
    for where, keys, does in FIXED_KEYS:
        table.add_row(where, keys, does, "(fixed)")
    return table


class KeysScreen(ModalScreen[None]):
    BINDINGS = [Binding("escape,f1,q", "dismiss", "Close", id="keys.close")]

    def __init__(self, groups: list[tuple[str, list[Binding]]], keymap: dict[str, str]) -> None:
        super().__init__(classes="dialog-screen")
        self.groups = groups
        self.keymap = keymap

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog wide"):
            yield Label(
                'Keys  (remap them in config.toml, under [keymap]: id = "keys")',
                markup=False,
                classes="dialog-title",
            )
            with VerticalScroll():
                self.table = bindings_table(self.app, self.groups, self.keymap)
                yield Static(self.table, id="keys-table")
                yield Static(GPU_NOTES, id="keys-notes", markup=False)
            yield Label("esc closes", classes="dialog-hint")

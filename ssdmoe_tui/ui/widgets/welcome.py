"""The first screen on the demo model: what is happening (a progress bar while the demo
model is written and loaded), what the demo is (tiny, trained here: it babbles but has learned)
and how to run a real model. Shown at the top of the transcript from the first frame."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import ProgressBar, Static

from ssdmoe_tui.chat.progress import LoadProgress
from ssdmoe_tui.models.registry import SUPPORTED_ARCHITECTURES

EXAMPLE_REPO = "mlx-community/Qwen3-30B-A3B-4bit"

ABOUT = (
    "The demo model is tiny (8 M parameters) and was trained here on a few MB of software "
    "manuals: it babbles, but it has learned (see docs/quality.md). "
    "It exists to show the engine at work: the panel on the right, "
    "K (ctrl+↑/↓), saved conversations (ctrl+o) and resume (ssdmoe --resume)."
)


def real_model_help() -> str:
    archs = ", ".join(SUPPORTED_ARCHITECTURES)
    return (
        "To chat with a real model:\n"
        f"  • ssdmoe --model {EXAMPLE_REPO}   (or a local folder)\n"
        f"  • ssdmoe models fetch {EXAMPLE_REPO}   (download it first)\n"
        "  • F4 here: the models found on this machine\n"
        f"Supported architectures: {archs} (MLX-quantized checkpoints)."
    )


class Welcome(Vertical):
    DEFAULT_CSS = """
    Welcome { height: auto; margin: 1 0 0 0; padding: 0 1; border: round $accent 60%; }
    Welcome #welcome-title { text-style: bold; color: $accent; }
    Welcome ProgressBar { width: 1fr; }
    Welcome ProgressBar Bar { width: 1fr; }
    Welcome #welcome-status { color: $foreground-muted; }
    Welcome .welcome-text { margin: 1 0 0 0; }
    """

    def __init__(self) -> None:
        super().__init__(id="welcome")
        self.progress = LoadProgress()

    def compose(self) -> ComposeResult:
        yield Static("Welcome to ssdmoe: starting the demo model", id="welcome-title")
        yield ProgressBar(total=100, show_eta=False, id="welcome-bar")
        yield Static("starting the engine", id="welcome-status", markup=False)
        yield Static(ABOUT, classes="welcome-text", markup=False)
        yield Static(real_model_help(), classes="welcome-text", markup=False)

    def show_progress(self, phase: str, done: int, total: int, detail: str) -> None:
        self.progress.update(phase, done, total, detail)
        self.query_one("#welcome-bar", ProgressBar).update(progress=self.progress.fraction * 100)
        self.query_one("#welcome-status", Static).update(self.progress.text())

    def loaded(self, name: str) -> None:
        self.query_one("#welcome-title", Static).update(f"Welcome to ssdmoe: {name} is ready")
        self.query_one("#welcome-bar", ProgressBar).display = False
        self.query_one("#welcome-status", Static).update("Type a message below; Enter sends.")

    def failed(self, why: str) -> None:
        self.query_one("#welcome-bar", ProgressBar).display = False
        self.query_one("#welcome-status", Static).update(f"The demo model did not load: {why}")

"""The first screen on the demo model: what is happening (a progress bar while the demo
model is written and loaded), what the demo is (tiny, trained here: short answers, no knowledge)
and how to run a real model. Shown at the top of the transcript from the first frame."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import ProgressBar, Static

from ssdmoe_tui.chat.progress import COMPILING, LoadProgress
from ssdmoe_tui.models.registry import SUPPORTED_ARCHITECTURES

EXAMPLE_REPO = "mlx-community/Qwen3-30B-A3B-4bit"

# What the first lines say, whatever the size: the essentials come first (at 80x24 the
# chat column has about 18 rows and 40 columns), the details after them.
TITLE = "ssdmoe · demo model: tiny, trained here"
ABOUT = "It knows little, answers briefly: it is here to show the engine at work."
# One argument has no space, so a narrow card wraps the command between arguments.
REAL_MODEL = "A real model: F4 here, or ssdmoe --model <folder-or-repo-id>."
TOOLS = "Tools: MCP servers from config.toml (F10); a call runs once you approve it."
#: Commands shown whole: each wraps between its arguments, with a shell continuation.
COMMANDS = (
    f"ssdmoe models fetch {EXAMPLE_REPO}",
    f"ssdmoe --model {EXAMPLE_REPO}",
)


def real_model_help() -> str:
    return (
        "The panel on the right shows the engine; K: ctrl+↑/↓; saved conversations: "
        "ctrl+o (ssdmoe --resume reopens the last one). To download a model, then "
        "open it:"
    )


def more_help() -> str:
    archs = ", ".join(SUPPORTED_ARCHITECTURES)
    return (
        "MCP servers go under [mcp_servers.NAME] in config.toml, as Codex CLI writes "
        "them (docs/app.md, Tools).\n"
        f"Supported architectures: {archs} (MLX-quantized checkpoints)."
    )


def wrap_command(command: str, width: int, indent: str = "  ") -> str:
    """`command` in lines of at most `width` columns, broken only between arguments (a
    ` \\` ends each broken line, as a shell continues it), so what is copied runs; an
    argument longer than a line keeps its own line whole."""
    lines: list[str] = []
    line = indent
    for arg in command.split(" "):
        head = line if line.strip() else ""
        if head and len(head) + 1 + len(arg) + 2 > width:  # room for " \\"
            lines.append(head + " \\")
            line = indent * 3 + arg
        else:
            line = (head + " " + arg) if head else indent + arg
    lines.append(line)
    return "\n".join(lines)


class CommandLine(Static):
    """A command the user may copy: it wraps between arguments, never inside one."""

    DEFAULT_CSS = "CommandLine { text-wrap: nowrap; text-overflow: clip; }"

    def __init__(self, command: str) -> None:
        super().__init__(wrap_command(command, 1 << 10), markup=False, classes="welcome-cmd")
        self.command = command

    def on_resize(self) -> None:
        self.update(wrap_command(self.command, max(self.size.width, 20)))


class Welcome(Vertical):
    DEFAULT_CSS = """
    Welcome { height: auto; margin: 0; padding: 0 1; border: round $accent 60%; }
    Welcome #welcome-title { text-style: bold; color: $accent; }
    Welcome #welcome-real { text-style: bold; }
    Welcome ProgressBar { width: 1fr; }
    Welcome ProgressBar Bar { width: 1fr; }
    Welcome #welcome-status { color: $foreground-muted; }
    Welcome .welcome-more { margin: 1 0 0 0; color: $foreground-muted; }
    """

    def __init__(self) -> None:
        super().__init__(id="welcome")
        self.progress = LoadProgress()

    def compose(self) -> ComposeResult:
        yield Static(TITLE, id="welcome-title", markup=False)
        yield Static(ABOUT, classes="welcome-text", markup=False)
        yield Static(REAL_MODEL, id="welcome-real", markup=False)
        yield Static(TOOLS, id="welcome-tools", markup=False)
        yield ProgressBar(total=100, show_eta=False, id="welcome-bar")
        yield Static("starting the engine", id="welcome-status", markup=False)
        yield Static(real_model_help(), classes="welcome-more", markup=False)
        for command in COMMANDS:
            yield CommandLine(command)
        yield Static(more_help(), classes="welcome-text", markup=False)

    def show_progress(self, phase: str, done: int, total: int, detail: str) -> None:
        self.progress.update(phase, done, total, detail)
        self.query_one("#welcome-bar", ProgressBar).update(progress=self.progress.fraction * 100)
        self.query_one("#welcome-status", Static).update(self.progress.text())

    def loaded(self, name: str, *, compiling: bool = False) -> None:
        """`compiling`: MLX-CUDA's first run, whose first reply compiles the GPU kernels."""
        self.query_one("#welcome-bar", ProgressBar).display = False
        first = f" Its first reply is slow: {COMPILING} (minutes)." if compiling else ""
        self.query_one("#welcome-status", Static).update(
            f"{name} is ready: type a message below, Enter sends.{first}"
        )

    def failed(self, why: str) -> None:
        self.query_one("#welcome-bar", ProgressBar).display = False
        self.query_one("#welcome-status", Static).update(f"The demo model did not load: {why}")

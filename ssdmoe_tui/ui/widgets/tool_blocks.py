"""A tool call and its result in the transcript: collapsed blocks (Enter or a click
expands them), oterm style. The call shows its tool and arguments in the title, its
state after (waiting for approval, running, denied, done); the result is collapsed when
it is long. Names, arguments and results are the model's and the tool's: shown through
`terminal_text.visible`, never raw."""

from __future__ import annotations

import json

from textual.content import Content
from textual.widgets import Collapsible, Static

from ssdmoe_tui.terminal_text import visible
from ssdmoe_tui.tools.calls import ToolCall

LONG_RESULT_LINES = 4
LONG_RESULT_CHARS = 240


def _pretty_args(arguments: str) -> str:
    try:
        return json.dumps(json.loads(arguments), indent=2, ensure_ascii=False)
    except (ValueError, RecursionError):
        return arguments


class ToolCallBlock(Collapsible):
    DEFAULT_CSS = """
    ToolCallBlock { margin: 0 0 0 2; border-left: wide $accent; height: auto; }
    ToolCallBlock.denied { border-left: wide $error; }
    """

    def __init__(self, call: ToolCall, state: str = "") -> None:
        self.call = call
        self.state = state
        super().__init__(
            Static(visible(_pretty_args(call.arguments)), markup=False, classes="tool-args"),
            title=self._label_text(),
            collapsed=True,
            classes="tool-call",
        )

    def _label_text(self) -> Content:
        """The title as plain text: the name and arguments are the model's (a title
        given as str is parsed as markup: '[/b]' raised, '[b]' vanished)."""
        state = f"  [{self.state}]" if self.state else ""
        return Content(visible(f"⚙ {self.call.name} {self.call.shown_arguments(60)}{state}"))

    def set_state(self, state: str) -> None:
        self.state = state
        self.title = self._label_text()
        self.set_class(state == "denied", "denied")


class ToolResultBlock(Collapsible):
    DEFAULT_CSS = """
    ToolResultBlock { margin: 0 0 0 2; border-left: wide $success; height: auto; }
    ToolResultBlock.error { border-left: wide $error; }
    """

    def __init__(self, name: str, text: str, is_error: bool = False) -> None:
        self.text = text
        long = text.count("\n") >= LONG_RESULT_LINES or len(text) > LONG_RESULT_CHARS
        first = " ".join((text.strip().splitlines() or [""])[0].split())
        first = first if len(first) <= 60 else first[:59] + "…"
        mark = "✗" if is_error else "↳"
        super().__init__(
            Static(visible(text), markup=False, classes="tool-result-text"),
            title=Content(visible(f"{mark} {name}: {first}")),  # plain: the tool's text
            collapsed=long,
            classes="tool-result error" if is_error else "tool-result",
        )

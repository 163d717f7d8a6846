"""Asks the user whether a tool call the model made may run: once, always (this tool,
in this conversation), or not (the model is told it was denied). Esc denies it and
stops the tool loop."""

from __future__ import annotations

import json

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Button, Label, Static

from ssdmoe_tui.terminal_text import visible
from ssdmoe_tui.tools.calls import ToolCall
from ssdmoe_tui.tools.loop import ALWAYS, DENY, ONCE

STOP = "stop"


class ToolApprovalScreen(ModalScreen[str]):
    """Returns "once", "always", "deny" or "stop" (Esc)."""

    BINDINGS = [
        Binding("y,o", "answer('once')", "Run once", id="tool.once"),
        Binding("a", "answer('always')", "Always for this tool", id="tool.always"),
        Binding("n,d", "answer('deny')", "Deny", id="tool.deny"),
        Binding("escape", "answer('stop')", "Deny and stop", id="tool.stop"),
    ]

    def __init__(self, call: ToolCall, server: str = "") -> None:
        super().__init__(classes="dialog-screen")
        self.call = call
        self.server = server

    def compose(self) -> ComposeResult:
        try:
            args = json.dumps(json.loads(self.call.arguments), indent=2, ensure_ascii=False)
        except (ValueError, RecursionError):
            args = self.call.arguments
        where = f" (MCP server {self.server})" if self.server else ""
        with Vertical(classes="dialog", id="tool-approval"):
            yield Label(
                visible(f"The model wants to call {self.call.name}{where}"), markup=False,
                classes="dialog-title",
            )  # fmt: skip
            with VerticalScroll(id="tool-approval-args"):
                yield Static(visible(args), markup=False)  # the model's: escaped
            with Horizontal(classes="dialog-buttons"):
                yield Button("Run once (y)", variant="primary", id=ONCE)
                yield Button("Always (a)", id=ALWAYS)
                yield Button("Deny (n)", variant="error", id=DENY)
            yield Label("Esc: deny and stop the tool loop", classes="dialog-hint")

    def on_mount(self) -> None:
        self.query_one(f"#{ONCE}", Button).focus()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.dismiss(event.button.id or DENY)

    def action_answer(self, answer: str) -> None:
        self.dismiss(answer)

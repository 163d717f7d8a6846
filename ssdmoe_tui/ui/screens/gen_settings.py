"""F9: this conversation's generation settings (system prompt, temperature, top-p, max
tokens, K, max tool rounds, speculative decoding, thinking). Starts from the conversation's own values (new chats: the config's); each
value is checked by the config schema's own check, a bad one is named on the screen and
nothing is applied until all are good. Returns the new `GenSettings`, or None."""

from __future__ import annotations

from dataclasses import replace

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Checkbox, Input, Label, TextArea

from ssdmoe_tui.config import GenSettings, check_value
from ssdmoe_tui.options import check_k

FIELDS = (  # (key, label, hint): a hint fits its column of a 64-wide dialog
    ("temperature", "Temperature", "0 = greedy (same reply)"),
    ("top_p", "Top-p", "off, or e.g. 0.95"),
    ("max_tokens", "Max tokens", "the longest reply"),
    ("k", "K (experts per token)", "empty = trained K"),
    ("max_tool_rounds", "Max tool rounds", "per reply (tool calls)"),
    ("speculate", "Speculate", "off, auto, ngram, mtp"),
)
TIPS = {  # what a hint's column has no room for (its tooltip)
    "speculate": "Draft tokens and verify them in one pass. Greedy replies are unchanged on "
    "CPU; on MLX-CUDA a verify pass's logits differ from one-token decode (up to 0.28 on "
    "the H200), so near-ties may flip tokens (auto drafts nothing there).",
}
OFF_WHEN_ZERO = {"top_p"}  # shown empty at 0: "Top-p 0" reads as "keep nothing"


def _shown(key: str, value: object) -> str:
    """A setting as the field shows it (empty where empty means the default)."""
    if value is None or (key in OFF_WHEN_ZERO and value == 0):
        return ""
    return f"{value:g}" if isinstance(value, float) else str(value)


def _typed(key: str, text: str) -> object:
    """What was typed, as the config value it stands for (then checked by the schema)."""
    text = text.strip()
    if key == "k" and not text:
        return None
    if key in OFF_WHEN_ZERO and not text:
        return 0.0
    if key == "speculate":
        return text.lower() or "off"
    try:
        return int(text) if key in ("max_tokens", "k", "max_tool_rounds") else float(text)
    except ValueError:
        return text  # the schema's check names what it expected


class GenSettingsScreen(ModalScreen[GenSettings | None]):
    BINDINGS = [
        Binding("escape", "cancel", "Cancel", id="settings.cancel"),
        Binding("ctrl+s", "save", "Save", id="settings.save"),
    ]

    def __init__(self, current: GenSettings, num_experts: int = 0, tools: bool = False) -> None:
        """`tools`: MCP servers are configured (only then is max tool rounds a row)."""
        super().__init__(classes="dialog-screen")
        self.current = current
        self.num_experts = num_experts
        self.fields = [f for f in FIELDS if tools or f[0] != "max_tool_rounds"]

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog", id="gen-settings"):
            yield Label("Generation settings (this conversation)", classes="dialog-title")
            yield Label("System prompt (empty: none)", classes="setting-title")
            yield TextArea(self.current.system_prompt, id="set-system_prompt", soft_wrap=True)
            for key, label, hint in self.fields:
                with Horizontal(classes="setting-row"):
                    yield Label(label, classes="setting-label")
                    yield Input(
                        _shown(key, getattr(self.current, key)),
                        placeholder="off" if key in OFF_WHEN_ZERO else "",
                        id=f"set-{key}",
                        compact=True,
                    )
                    yield Label(hint, classes="setting-hint").with_tooltip(TIPS.get(key))
            yield Checkbox(
                "Thinking (for models that think: Qwen3, …)",
                self.current.thinking,
                id="set-thinking",
                compact=True,
            )
            yield Label("", id="settings-error", classes="dialog-hint")
            yield Label(
                "ctrl+s or Enter saves · esc cancels · kept with the chat",
                classes="dialog-hint",
                id="settings-keys",  # hidden on short screens: the buttons say it
            )
            with Horizontal(classes="dialog-buttons"):
                yield Button("Save", variant="primary", id="save")
                yield Button("Cancel", id="cancel")

    def on_mount(self) -> None:
        # The system prompt first: typing right away lands in the box one expects.
        self.query_one("#set-system_prompt", TextArea).focus()
        self.query_one("#settings-error", Label).display = False  # until there is one

    def result(self) -> GenSettings:
        """The settings on screen; ValueError naming the first bad one."""
        values: dict[str, object] = {
            "system_prompt": self.query_one("#set-system_prompt", TextArea).text,
            "thinking": self.query_one("#set-thinking", Checkbox).value,
        }
        for key, label, _ in self.fields:
            raw = self.query_one(f"#set-{key}", Input).value
            try:
                values[key] = check_value(key, _typed(key, raw))
                if key == "k" and self.num_experts:
                    check_k(values[key], self.num_experts)  # type: ignore[arg-type]
            except ValueError as e:
                raise ValueError(f"{label}: {raw.strip()!r} is not valid ({e})") from None
        return replace(self.current, **values)  # type: ignore[arg-type]

    def action_save(self) -> None:
        try:
            settings = self.result()
        except ValueError as e:
            error = self.query_one("#settings-error", Label)
            error.update(str(e))
            error.display = True
            return
        self.dismiss(settings)

    @on(Input.Submitted)
    def _enter(self, event: Input.Submitted) -> None:
        event.stop()
        self.action_save()

    @on(Button.Pressed)
    def _button(self, event: Button.Pressed) -> None:
        if event.button.id == "save":
            self.action_save()
        else:
            self.dismiss(None)

    def action_cancel(self) -> None:
        self.dismiss(None)

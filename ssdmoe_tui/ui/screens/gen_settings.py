"""F9: this conversation's generation settings (system prompt, temperature, top-p, max
tokens, K). Starts from the conversation's own values (new chats: the config's); each
value is checked by the config schema's own check, a bad one is named on the screen and
nothing is applied until all are good. Returns the new `GenSettings`, or None."""

from __future__ import annotations

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label, TextArea

from ssdmoe_tui.config import GenSettings, check_value
from ssdmoe_tui.options import check_k

FIELDS = (  # (key, label, hint)
    ("temperature", "Temperature", "0 = greedy: the same reply each time"),
    ("top_p", "Top-p", "0 = off; e.g. 0.95"),
    ("max_tokens", "Max tokens", "longest reply"),
    ("k", "K (experts per token)", "empty = the model's trained K"),
)


def _typed(key: str, text: str) -> object:
    """What was typed, as the config value it stands for (then checked by the schema)."""
    text = text.strip()
    if key == "k" and not text:
        return None
    try:
        return int(text) if key in ("max_tokens", "k") else float(text)
    except ValueError:
        return text  # the schema's check names what it expected


class GenSettingsScreen(ModalScreen[GenSettings | None]):
    BINDINGS = [
        Binding("escape", "cancel", "Cancel", id="settings.cancel"),
        Binding("ctrl+s", "save", "Save", id="settings.save"),
    ]

    def __init__(self, current: GenSettings, num_experts: int = 0) -> None:
        super().__init__(classes="dialog-screen")
        self.current = current
        self.num_experts = num_experts

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog", id="gen-settings"):
            yield Label("Generation settings (this conversation)", classes="dialog-title")
            yield Label("System prompt")
            yield TextArea(
                self.current.system_prompt, id="set-system_prompt", soft_wrap=True, compact=True
            )
            for key, label, hint in FIELDS:
                value = getattr(self.current, key)
                with Horizontal(classes="setting-row"):
                    yield Label(label, classes="setting-label")
                    yield Input(
                        ""
                        if value is None
                        else f"{value:g}"
                        if isinstance(value, float)
                        else str(value),
                        placeholder=hint,
                        id=f"set-{key}",
                        compact=True,
                    )
            yield Label("", id="settings-error", classes="dialog-hint")
            yield Label(
                "Enter or ctrl+s saves · esc cancels · saved with the conversation",
                classes="dialog-hint",
            )
            with Horizontal(classes="dialog-buttons"):
                yield Button("Save", variant="primary", id="save")
                yield Button("Cancel", id="cancel")

    def on_mount(self) -> None:
        self.query_one("#set-temperature", Input).focus()

    def result(self) -> GenSettings:
        """The settings on screen; ValueError naming the first bad one."""
        values: dict[str, object] = {
            "system_prompt": self.query_one("#set-system_prompt", TextArea).text
        }
        for key, label, _ in FIELDS:
            raw = self.query_one(f"#set-{key}", Input).value
            try:
                values[key] = check_value(key, _typed(key, raw))
                if key == "k" and self.num_experts:
                    check_k(values[key], self.num_experts)  # type: ignore[arg-type]
            except ValueError as e:
                raise ValueError(f"{label}: {raw.strip()!r} is not valid ({e})") from None
        return GenSettings(**values)  # type: ignore[arg-type]

    def action_save(self) -> None:
        try:
            settings = self.result()
        except ValueError as e:
            self.query_one("#settings-error", Label).update(str(e))
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

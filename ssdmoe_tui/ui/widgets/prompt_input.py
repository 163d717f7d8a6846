"""The prompt box: multi-line, Enter sends, shift+enter / ctrl+j insert a newline,
↑/↓ on the first/last line walk through earlier prompts, Tab after `@part` completes a
file path (chat/attachments.py), PageUp/PageDown scroll the
transcript (the box is a few lines; TextArea would page its own cursor). Pastes keep
their newlines (TextArea inserts pasted text as is)."""

from __future__ import annotations

from textual import events
from textual.binding import Binding
from textual.widgets import TextArea

from ssdmoe_tui.chat.attachments import complete
from ssdmoe_tui.ui.messages import WidgetMessage


class PromptInput(TextArea):
    BINDINGS = [
        Binding("shift+enter,ctrl+j", "newline", "Newline", show=False, id="input.newline"),
    ]

    class Submitted(WidgetMessage["PromptInput"]):
        def __init__(self, prompt: PromptInput, text: str) -> None:
            super().__init__(prompt)
            self.prompt = prompt
            self.text = text

    def __init__(self, *, id: str | None = None, placeholder: str = "") -> None:
        super().__init__(
            id=id,
            soft_wrap=True,
            tab_behavior="focus",
            show_line_numbers=False,
            placeholder=placeholder,
            highlight_cursor_line=False,
            compact=True,
        )
        self.prompt_history: list[str] = []
        self._history_index: int | None = None  # None: editing the draft
        self._draft = ""

    async def _on_key(self, event: events.Key) -> None:
        # TextArea turns Enter into a newline in its own key handler, ahead of any
        # binding, so Enter (and only plain Enter) is intercepted here.
        if event.key == "enter":
            event.stop()
            event.prevent_default()
            self.action_submit()
            return
        if event.key == "tab" and self.complete_path():
            event.stop()
            event.prevent_default()
            return
        if event.key in ("ctrl+j", "shift+enter"):
            event.stop()
            event.prevent_default()
            self.action_newline()
            return
        await super()._on_key(event)

    def complete_path(self) -> bool:
        """Tab after `@part`: complete the file path (one match: all of it; several: their
        common part, and the names are shown). False: not in an `@` word (Tab moves on)."""
        row, col = self.cursor_location
        line = self.document.get_line(row)
        start = line.rfind(" ", 0, col) + 1
        word = line[start:col]
        if not word.startswith("@"):
            return False
        done, names = complete(word[1:])
        if not names:
            self.notify(f"No file matches {word}", severity="warning", markup=False)
            return True
        if done != word[1:]:
            self._replace_via_keyboard("@" + done, (row, start), (row, col))
        if len(names) > 1:
            shown = "  ".join(names[:12]) + ("  …" if len(names) > 12 else "")
            self.notify(shown, title=f"{len(names)} matches", markup=False)
        return True

    def action_newline(self) -> None:
        start, end = self.selection
        self._replace_via_keyboard("\n", start, end)

    def action_submit(self) -> None:
        text = self.text
        if not text.strip():
            return
        if not self.prompt_history or self.prompt_history[-1] != text:
            self.prompt_history.append(text)
        self._history_index = None
        self._draft = ""
        self.post_message(self.Submitted(self, text))

    # ------------------------------------------------------------- history

    def _show(self, text: str, *, at_end: bool) -> None:
        self.load_text(text)
        if at_end:
            self.move_cursor(self.document.end)
        else:
            self.move_cursor((0, len(self.document.get_line(0))))

    def action_cursor_up(self, select: bool = False) -> None:
        if select or self.cursor_location[0] > 0 or not self.prompt_history:
            super().action_cursor_up(select)
            return
        if self._history_index is None:
            self._draft = self.text
            self._history_index = len(self.prompt_history)
        if self._history_index > 0:
            self._history_index -= 1
            self._show(self.prompt_history[self._history_index], at_end=False)

    def action_cursor_down(self, select: bool = False) -> None:
        last_row = self.document.line_count - 1
        if select or self.cursor_location[0] < last_row or self._history_index is None:
            super().action_cursor_down(select)
            return
        self._history_index += 1
        if self._history_index >= len(self.prompt_history):
            self._history_index = None
            self._show(self._draft, at_end=True)
        else:
            self._show(self.prompt_history[self._history_index], at_end=True)

    def action_cursor_page_up(self) -> None:
        self.call_later(self.run_action, "app.page(-1)")

    def action_cursor_page_down(self) -> None:
        self.call_later(self.run_action, "app.page(1)")

    def action_cursor_line_end(self, select: bool = False) -> None:
        """End moves to the line end; pressed again there, it re-pins the transcript."""
        at_end = self.cursor_location[1] >= len(self.document.get_line(self.cursor_location[0]))
        if at_end and not select:
            self.call_later(self.run_action, "app.pin")
        else:
            super().action_cursor_line_end(select)

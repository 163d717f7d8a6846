"""The conversation: user prompts and assistant replies, replies rendered as Markdown
while they stream (MarkdownStream appends; one final `update()` with the full text)."""

from __future__ import annotations

import re

from rich.text import Text
from textual import events
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.widgets import Collapsible, Label, Markdown, Static
from textual.widgets.markdown import MarkdownFence, MarkdownStream

from ssdmoe_tui.chat.attachments import split_attached
from ssdmoe_tui.chat.thinking import Split, split_thinking
from ssdmoe_tui.terminal_text import visible

_FENCE = re.compile(r"^(```|~~~)[^\n]*\n(.*?)^\1[ \t]*$", re.MULTILINE | re.DOTALL)

FINISH_LABELS = {
    "stop": "",
    "length": "hit max tokens",
    "cancelled": "stopped",
    "error": "failed",
}


def code_blocks(markdown_text: str) -> list[str]:
    """The fenced code blocks of a Markdown text, in order."""
    return [m.group(2) for m in _FENCE.finditer(markdown_text)]


class CopyButton(Static):
    """A small clickable `copy` in a message header."""

    DEFAULT_CSS = """
    CopyButton { width: auto; color: $foreground-muted; padding: 0 1; }
    CopyButton:hover { color: $accent; text-style: bold; }
    """

    def on_click(self, event: events.Click) -> None:
        event.stop()
        message = next(a for a in self.ancestors if isinstance(a, ChatMessage))
        message.action_copy_message()


class ChatMessage(Vertical, can_focus=True):
    """One turn. Focus it (tab, or click) and press `c` to copy it, `b` for its code blocks."""

    DEFAULT_CSS = """
    ChatMessage { height: auto; }
    ChatMessage .message-header { height: auto; }
    ChatMessage .message-title { width: 1fr; }
    """
    BINDINGS = [
        Binding("c", "copy_message", "Copy message", id="message.copy"),
        Binding("b", "copy_code", "Copy code block", id="message.copy_code"),
    ]
    ROLE = "user"

    def __init__(self, text: str = "", *, classes: str | None = None) -> None:
        super().__init__(classes=classes)
        self.text = text
        self._next_block = 0

    def header_text(self) -> Text:
        title = Text(self.ROLE, style="bold")
        if self.has_class("replaced"):
            title.append("  [replaced]", style="italic")
        return title

    def mark_replaced(self) -> None:
        """A regenerate or an edit took this turn out of the context; it stays shown (and
        stored, under the conversation's replaced exchanges)."""
        self.add_class("replaced")
        self.query_one(".message-title", Label).update(self.header_text())

    def compose_header(self) -> ComposeResult:
        with Horizontal(classes="message-header"):
            yield Label(self.header_text(), classes="message-title")
            yield CopyButton("copy", classes="copy")

    def action_copy_message(self) -> None:
        self.app.copy_to_clipboard(self.text)
        self.app.notify(f"Copied the {self.ROLE} message ({len(self.text)} characters)")

    def action_copy_code(self) -> None:
        blocks = code_blocks(getattr(self, "answer", self.text))
        if not blocks:
            self.app.notify("No code block in this message", severity="warning")
            return
        index = self._next_block % len(blocks)
        self._next_block += 1
        self.app.copy_to_clipboard(blocks[index])
        self.app.notify(f"Copied code block {index + 1} of {len(blocks)}")


class UserMessage(ChatMessage):
    """What was typed, and a chip per attached file (`text` is the whole message the
    model saw, files included: chat/attachments.py)."""

    ROLE = "you"
    DEFAULT_CSS = """
    UserMessage .attached { color: $foreground-muted; }
    """

    def compose(self) -> ComposeResult:
        typed, files = split_attached(self.text)
        yield from self.compose_header()
        yield Static(visible(typed), markup=False, classes="message-body")
        if files:
            chips = "  ".join(a.chip() for a in files)
            yield Static(visible(chips), markup=False, classes="attached")


class AssistantMessage(ChatMessage):
    """Starts empty; `append()` streams text in, `finish()` settles it. A reply that
    thinks (`<think> ... </think>`, chat/thinking.py) shows its reasoning in a block of
    its own above the answer, collapsed; `t` (or ctrl+t for the last reply) toggles it."""

    ROLE = "assistant"
    DEFAULT_CSS = """
    AssistantMessage .thinking { display: none; }
    AssistantMessage.thinks .thinking { display: block; }
    AssistantMessage .thinking-body { color: $foreground-muted; }
    """
    BINDINGS = [
        *ChatMessage.BINDINGS,
        Binding("t", "toggle_thinking", "Show/hide thinking", id="message.thinking"),
    ]

    def __init__(self, request_id: str, model_name: str = "", thinking_inside: bool = False):
        super().__init__("", classes="pending")
        self.request_id = request_id
        self.model_name = model_name
        self.thinking_inside = thinking_inside  # the prompt opened the <think> block
        self.finish_reason: str | None = None
        self.detail = ""
        self._stream: MarkdownStream | None = None
        self._written = 0  # characters of the answer streamed into the Markdown
        self.split = Split("", "")
        self.appends = 0  # how many increments arrived (tests check streaming happened)
        # Kept, not queried: tokens may still arrive for a reply whose widget has been
        # removed (another conversation opened), and it has no children then.
        self._thinking_body = Static("", markup=False, classes="thinking-body")
        self._block = Collapsible(
            self._thinking_body, title="thinking", collapsed=True, classes="thinking"
        )
        self._markdown = Markdown("", classes="message-body")

    @property
    def answer(self) -> str:
        """The reply without its reasoning (what copy and the code blocks take)."""
        return self.split.answer

    @property
    def thinking_block(self) -> Collapsible:
        return self._block

    def action_toggle_thinking(self) -> None:
        if not self.split.has_thinking:
            self.app.notify("This reply has no thinking.", severity="warning")
            return
        block = self.thinking_block
        block.collapsed = not block.collapsed

    def action_copy_message(self) -> None:
        self.app.copy_to_clipboard(self.answer)
        self.app.notify(f"Copied the {self.ROLE} message ({len(self.answer)} characters)")

    def _show_thinking(self, tokens: int = 0) -> None:
        split, block = self.split, self.thinking_block
        self.set_class(split.has_thinking, "thinks")  # the block shows once it thinks
        if not split.has_thinking:
            return
        self._thinking_body.update(visible(split.thinking))
        if split.open and self.finish_reason is None:
            block.title = "thinking…"
        else:
            block.title = f"thinking · {tokens} tokens" if tokens else "thinking"

    def header_text(self) -> Text:
        title = Text(visible(self.model_name) or self.ROLE, style="bold")
        if self.has_class("replaced"):
            title.append("  [replaced]", style="italic")
        if self.finish_reason is None:
            title.append("  …", style="italic")
        else:
            label = FINISH_LABELS.get(self.finish_reason, self.finish_reason)
            if self.finish_reason == "cancelled" and not self.text:
                label = "stopped before its first token"  # during its prompt's prefill
            if label:
                title.append(f"  [{label}]", style="bold italic")
        if self.detail:
            title.append(f"  {visible(self.detail)}", style="dim")
        return title

    def compose(self) -> ComposeResult:
        yield from self.compose_header()
        yield self._block
        yield self._markdown

    @property
    def markdown(self) -> Markdown:
        return self._markdown

    async def append(self, text: str) -> None:
        if not text:
            return
        self.text += text
        self.appends += 1
        self.split = split_thinking(self.text, self.thinking_inside)
        self._show_thinking()
        new = self.split.answer[self._written :]
        if new:
            if self._stream is None:
                self._stream = Markdown.get_stream(self.markdown)
            self._written = len(self.split.answer)
            await self._stream.write(visible(new))  # escaped piece by piece: one char each

    async def finish(
        self, text: str, finish_reason: str, detail: str = "", thinking_tokens: int = 0
    ) -> None:
        """End the stream and render the whole reply once, exactly as generated (its
        reasoning apart, collapsed). A message no longer on screen (the app torn down,
        or a new chat, while a conversation opened) keeps the text and mounts nothing:
        mounting into a detached widget raised MountError."""
        if self._stream is not None:
            await self._stream.stop()
            self._stream = None
        self.text = text
        self.finish_reason = finish_reason
        self.detail = detail
        live = self.appends > 0
        self.split = split_thinking(text, self.thinking_inside if live else None)
        if not self.is_attached:
            return
        self._show_thinking(thinking_tokens)
        await self.markdown.update(visible(self.split.answer))
        if not self.is_attached:  # removed while the Markdown was being mounted
            return
        self.remove_class("pending")
        self.set_class(finish_reason == "cancelled", "stopped")
        self.set_class(finish_reason == "error", "failed")
        self.query_one(".message-title", Label).update(self.header_text())

    def on_click(self, event: events.Click) -> None:
        """Clicking a code block copies it."""
        widget = event.widget
        while widget is not None and widget is not self:
            if isinstance(widget, MarkdownFence):
                self.app.copy_to_clipboard(widget.code)
                self.app.notify("Copied the code block")
                event.stop()
                return
            widget = widget.parent  # type: ignore[assignment]


class Notice(Static):
    """A one-line system note in the transcript (model loaded, new chat, ...)."""


class Transcript(VerticalScroll):
    """Follows the stream (anchored) until the user scrolls up; End re-pins it."""

    BINDINGS = [Binding("end", "pin", "Follow", show=False, id="transcript.pin")]

    def on_mount(self) -> None:
        self.anchor()

    def action_pin(self) -> None:
        self.anchor()
        self.scroll_end(animate=False)

    def show_top(self) -> None:
        """Its first lines in view, not following what is added (the welcome card):
        anchored, Textual keeps the end in view and a short content at the bottom.
        Sending a message pins it again."""
        self.anchor(False)
        self.scroll_home(animate=False)
        self.call_after_refresh(self._at_top)

    def _at_top(self) -> None:
        # Right after a mount the offset can be left below 0 (short content drawn at the
        # bottom); set it once the layout is done.
        self.scroll_target_y = 0
        self.scroll_y = 0

    async def add_user(self, text: str) -> UserMessage:
        message = UserMessage(text)
        await self.mount(message)
        return message

    async def add_assistant(
        self, request_id: str, model_name: str, thinking_inside: bool = False
    ) -> AssistantMessage:
        message = AssistantMessage(request_id, model_name, thinking_inside)
        await self.mount(message)
        return message

    async def add_notice(self, text: str, *, classes: str = "") -> Notice:
        notice = Notice(visible(text), markup=False, classes=classes)
        await self.mount(notice)
        return notice

    async def clear(self) -> None:
        await self.remove_children()
        self.anchor()

    def messages(self) -> list[ChatMessage]:
        return list(self.query(ChatMessage))

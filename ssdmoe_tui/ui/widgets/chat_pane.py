"""The chat column: the transcript above the prompt, and the conversation flow between
them (send, regenerate, edit and resend, the streaming reply).

It handles the prompt's own `PromptInput.Submitted` (which bubbles up to it) and asks
the controller (`chat.controller.ChatController`, no Textual) for every decision; the
app routes the engine's reply events here (`show_tokens`, `reply_done`, `reply_failed`)
in the order they arrived."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from textual import on
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import Static

from ssdmoe_tui.chat.attachments import (
    Attachment,
    AttachmentError,
    at_words,
    attachments_of,
    no_file_line,
    split_attached,
    unmatched_paths,
    with_attachments,
)
from ssdmoe_tui.chat.controller import ChatController, Refused
from ssdmoe_tui.chat.remote import ChatTurn
from ssdmoe_tui.chat.replies import ShownTurn
from ssdmoe_tui.engine.run.protocol import EngineError, Generate, GenerationDone, Tokens
from ssdmoe_tui.errors import user_message
from ssdmoe_tui.tools.loop import result_state
from ssdmoe_tui.ui.actions import tools
from ssdmoe_tui.ui.child import child
from ssdmoe_tui.ui.screens.conversations import resumed_notice, store_of
from ssdmoe_tui.ui.widgets.engine_panel import EnginePanel
from ssdmoe_tui.ui.widgets.prompt_input import PromptInput
from ssdmoe_tui.ui.widgets.tool_blocks import ToolCallBlock, ToolResultBlock
from ssdmoe_tui.ui.widgets.transcript import AssistantMessage, Transcript
from ssdmoe_tui.ui.widgets.welcome import Welcome


def results_after(turns: Sequence[ShownTurn], at: int) -> list[str]:
    """The tool results saved right after the reply at `at`, in order (its calls')."""
    out = []
    for turn in turns[at + 1 :]:
        if turn.role != "tool":
            break
        out.append(turn.content)
    return out


def call_states(calls: Sequence[object], results: Sequence[str]) -> list[str]:
    """Each restored call's state, from its result (the k-th result answers the k-th
    call: the loop feeds them back in order; none saved: the loop was stopped)."""
    return [result_state(results[k] if k < len(results) else None) for k in range(len(calls))]


class ChatPane(Vertical):
    def __init__(self, chat: ChatController, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.chat = chat
        self.current: AssistantMessage | None = None  # the reply streaming into the transcript
        self.editing = False  # the prompt holds the last prompt, to be edited and resent
        self._draft = ""  # what the box held before ctrl+l: Esc puts it back
        self._sent = ""  # the last prompt sent, as stored
        self.given_back: str | None = None  # a prompt the engine refused: ctrl+l edits it
        self.finishing: str | None = None  # a finished reply whose widget is settling
        # Restored replies shown before the model's tokenizer could find their tool calls
        self._unsplit: list[tuple[AssistantMessage, str, str, str, int, list[str]]] = []

    def compose(self) -> ComposeResult:
        yield Transcript(id="transcript")
        yield Static("", id="attachments", markup=False)  # a chip per @file of the prompt
        yield PromptInput(id="prompt", placeholder="Ask anything (Enter sends, @file attaches)")

    def on_mount(self) -> None:
        self.query_one("#attachments", Static).display = False
        self._chips_for: tuple[str, ...] = ()

    @on(PromptInput.Changed)
    def _prompt_changed(self, event: PromptInput.Changed) -> None:
        """The chips above the prompt follow its `@path`s: read when they change, on a
        worker thread (a file is never read on the UI thread: a slow disk or a special
        file would freeze the app), shown when the read ends if they still apply."""
        text = self.prompt.text
        names = at_words(text)
        if names == self._chips_for:
            return
        self._chips_for = names
        if not names:
            self._show_chips(names, [])
            return

        def read() -> None:
            try:
                found: list[Attachment] | str = attachments_of(text)
            except AttachmentError as e:
                found = str(e)
            missing = unmatched_paths(text)
            self.app.call_from_thread(self._show_chips, names, found, missing)

        self.run_worker(read, thread=True, group="attachment-chips", exit_on_error=False)

    def _show_chips(
        self, names: tuple[str, ...], found: list[Attachment] | str, missing: Sequence[str] = ()
    ) -> None:
        if names != self._chips_for:
            return  # the prompt changed meanwhile: a newer read shows its own
        chips = self.query_one("#attachments", Static)
        if isinstance(found, str):
            chips.update(f"✗ {found}")
            chips.add_class("error")
            chips.display = True
            return
        shown = [a.chip() for a in found] + (
            [f"⚠ {no_file_line(list(missing))}"] if missing else []
        )
        chips.update("  ".join(shown))
        chips.remove_class("error")
        chips.display = bool(shown)

    transcript = child(Transcript)
    prompt = child(PromptInput)

    @property
    def welcome(self) -> Welcome | None:
        """The first-run panel at the top of the transcript (demo model only)."""
        found = self.query(Welcome)
        return found.first() if found else None

    # ------------------------------------------------------------------ sending

    @on(PromptInput.Submitted)
    async def _submitted(self, event: PromptInput.Submitted) -> None:
        if self.editing:
            await self.redo(event.text)
        else:
            await self.send(event.text)

    async def _with_files(self, text: str) -> str | None:
        """The message with its `@path` files (read on a worker thread), or None (said in
        one line) when one of them cannot be attached."""
        try:
            files, missing = await asyncio.to_thread(
                lambda: (attachments_of(text), unmatched_paths(text))
            )
        except AttachmentError as e:
            self.notify(str(e), severity="error", markup=False)
            return None
        if missing:  # a path that names no file is said, never sent silently
            self.notify(no_file_line(missing), severity="warning", markup=False)
        return with_attachments(text, files)

    async def send(self, text: str) -> bool:
        """Send one user turn; False (with a notice) when it cannot go now."""
        if why := self.chat.why_not_send():
            self.notify(why, severity="warning")
            return False
        message = await self._with_files(text)
        if message is None:
            return False
        await tools.ensure_servers(self)
        try:
            request = self.chat.prepare(message)
        except Refused as e:
            self.notify(str(e), severity="warning", markup=False)
            return False
        self.prompt.clear()
        self._sent, self.given_back = message, None
        await self.transcript.add_user(message)
        await self._start_reply(request)
        return True

    async def redo(self, text: str | None = None) -> bool:
        """Regenerate the last reply (`text` None) or resend the edited last prompt; the
        replaced turns stay on screen, marked, and in the conversation file."""
        if text is not None and (text := await self._with_files(text)) is None:
            return False
        try:
            request = self.chat.redo(text)
        except Refused as e:
            self.notify(str(e), severity="warning")
            return False
        self.editing = False
        self.prompt.clear()
        self._sent = text if text is not None else (self.chat.last_prompt() or "")
        messages = self.transcript.messages()
        last_user = max(
            (i for i, m in enumerate(messages) if not isinstance(m, AssistantMessage)), default=0
        )
        for message in messages[last_user if text is not None else last_user + 1 :]:
            if not message.has_class("replaced"):
                message.mark_replaced()
        if text is not None:
            await self.transcript.add_user(text)
        await self._start_reply(request)
        return True

    def edit_last(self) -> None:
        """Put the last prompt back in the box; Enter resends it. A prompt the engine
        refused (longer than the context) was given back: it comes back as a new message."""
        if self.given_back is not None and not self.chat.why_not_send():
            self.editing = False  # not in the conversation: Enter sends it anew
            self.prompt.load_text(split_attached(self.given_back)[0])
            self.prompt.move_cursor(self.prompt.document.end)
            self.prompt.focus()
            self.notify("The prompt that was not answered is back: Enter sends it.")
            return
        text = self.chat.last_prompt()
        if text is None:
            self.notify("No prompt to edit yet.", severity="warning")
            return
        if why := self.chat.why_not_send():
            self.notify(why, severity="warning")
            return
        if not self.editing:
            self._draft = self.prompt.text
        self.editing = True
        self.prompt.load_text(split_attached(text)[0])  # as typed: its @paths read again
        self.prompt.move_cursor(self.prompt.document.end)
        self.prompt.focus()
        self.notify("Editing the last prompt: Enter resends it, Esc cancels.")

    async def _start_reply(self, request: Generate | ChatTurn) -> None:
        assert self.chat.model is not None
        self.current = await self.transcript.add_assistant(
            request.request_id, self.chat.model.name, self.chat.thinking_inside
        )
        self.transcript.action_pin()
        # Cleared before the request goes: its first sample must land on a clean graph.
        self.screen.query_one(EnginePanel).clear_history()
        self.chat.submit(request)

    # ------------------------------------------------------------------ the reply

    async def show_tokens(self, event: Tokens) -> None:
        if self.current is not None and event.request_id == self.current.request_id:
            await self.current.append(event.text)

    async def reply_done(self, done: GenerationDone) -> None:
        if done.request_id != self.chat.inflight:
            return
        message, self.current = self.current, None
        self.finishing = done.request_id
        split = self.chat.split_reply(done.text, done.tool_calls)
        stats = None
        try:
            stats = self.chat.reply_done(done)
            if stats is not None and message is not None and message.is_attached:
                await message.finish(
                    split.content, done.finish_reason, stats.detail(), stats.thinking_tokens
                )
        finally:
            self.finishing = None
        if stats is not None and split.calls and done.finish_reason == "stop":
            tools.begin_round(self, split.calls)  # a stopped reply's calls never run

    def cancel_edit(self) -> bool:
        """Esc while editing the last prompt: the box gets back what it held before."""
        if not self.editing:
            return False
        self.editing = False
        self.prompt.load_text(self._draft)
        self.prompt.move_cursor(self.prompt.document.end)
        self.notify("Edit cancelled.", timeout=2)
        return True

    async def reply_failed(self, error: EngineError) -> None:
        """The reply in flight ended with an engine error: what arrived stays, marked.
        Its turn was given back (`ChatController.engine_error`): ctrl+l brings it back."""
        if self._sent and self.chat.last_prompt() != self._sent:
            self.given_back = self._sent
        message, self.current = self.current, None
        if message is not None and message.is_attached:
            await message.finish(message.text, "error", error.message)

    # ------------------------------------------------------------------ the conversation

    async def show_turns(self, turns: Sequence[ShownTurn]) -> None:
        for i, turn in enumerate(turns):
            if turn.role == "user":
                await self.transcript.add_user(turn.content)
            elif turn.role == "tool":
                await self.transcript.mount(ToolResultBlock(turn.name, turn.content))
            elif turn.role == "assistant":
                stats = turn.reply
                message = await self.transcript.add_assistant("", stats.model if stats else "")
                reason = turn.finish or ("cancelled" if turn.stopped else "stop")
                split = self.chat.split_reply(turn.content, turn.tool_calls)
                shown = (
                    message, turn.content, reason, stats.detail() if stats else "",
                    stats.thinking_tokens if stats else 0, results_after(turns, i),
                )  # fmt: skip
                await message.finish(split.content, *shown[2:5])
                for call, state in zip(
                    split.calls, call_states(split.calls, shown[5]), strict=True
                ):
                    await self.transcript.mount(ToolCallBlock(call, state))
                if self.chat.tools is not None and not split.calls and not self.chat.tokenizer:
                    self._unsplit.append(shown)

    async def split_restored(self) -> None:
        """Once the model's tokenizer is here: the restored replies' tool calls, shown as
        blocks (a resumed conversation opens before its model has loaded)."""
        pending, self._unsplit = self._unsplit, []
        for message, text, reason, detail, thinking, results in pending:
            split = self.chat.split_reply(text)
            if not split.calls or not message.is_attached:
                continue
            await message.finish(split.content, reason, detail, thinking)
            states = call_states(split.calls, results)
            for call, state in reversed(list(zip(split.calls, states, strict=True))):
                await self.transcript.mount(ToolCallBlock(call, state), after=message)

    async def open_session(self, resume: str | None) -> None:
        """Start (`resume` None) or resume a conversation and show its turns; a bad
        session file is one line and the chat goes on unsaved."""
        try:
            turns = self.chat.open_session(resume)
        except Refused as e:
            self.notify(str(e), severity="warning")
            return
        except Exception as e:  # noqa: BLE001 - a bad session file must not stop the chat
            self.notify(f"could not open the session: {user_message(e)}", severity="error")
            self.chat.session_id = None
            return
        await self.show_turns(turns)
        if resume is not None and self.chat.session_id is not None:
            notice = resumed_notice(store_of(self.app), self.chat.session_id, None)
            await self.transcript.add_notice(notice)

    async def start_over(self) -> None:
        """A new chat: the reply in flight is abandoned and the transcript emptied."""
        self.chat.abandon_reply()
        self.current = None
        self.editing, self.given_back = False, None
        self._unsplit = []
        self.chat.new_chat()
        await self.transcript.clear()

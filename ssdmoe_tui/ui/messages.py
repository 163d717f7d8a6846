"""Typed Textual messages: one per engine event, and the requests screens post.

The engine thread hands each protocol event to `engine_message()`, whose result goes to
`App.post_message` (thread-safe, never blocks); the app handles each with its own `@on`.
Screens post the request messages instead of calling methods on the app, so no screen
imports the app.
"""

from __future__ import annotations

from typing import Generic, TypeVar

from textual.message import Message

from ssdmoe_tui.engine.run import protocol as P

E = TypeVar("E")
W = TypeVar("W")


class WidgetMessage(Message, Generic[W]):
    """Base of the messages a widget posts about itself: `control` is that widget (as
    Textual's own widgets have it), so `@on(Kind.Message, "#id")` matches the sender."""

    def __init__(self, sender: W) -> None:
        super().__init__()
        self._control = sender

    @property
    def control(self) -> W:
        return self._control


class EngineMessage(Message, Generic[E]):
    """Base of the engine's messages; `event` is the protocol event, typed per subclass."""

    def __init__(self, event: E) -> None:
        super().__init__()
        self.event = event


class TokensArrived(EngineMessage[P.Tokens]):
    pass


class SampleArrived(EngineMessage[P.StatsSample]):
    pass


class PhaseEntered(EngineMessage[P.PhaseChanged]):
    pass


class ReplyDone(EngineMessage[P.GenerationDone]):
    pass


class ModelReady(EngineMessage[P.ModelLoaded]):
    pass


class EngineFailed(EngineMessage[P.EngineError]):
    pass


class EngineNotice(EngineMessage[P.Notice]):
    pass


class ExpertsReady(EngineMessage[P.ExpertsWarmed]):
    pass


MESSAGE_FOR: dict[type, type[EngineMessage]] = {
    P.Tokens: TokensArrived,
    P.StatsSample: SampleArrived,
    P.PhaseChanged: PhaseEntered,
    P.GenerationDone: ReplyDone,
    P.ModelLoaded: ModelReady,
    P.EngineError: EngineFailed,
    P.Notice: EngineNotice,
    P.ExpertsWarmed: ExpertsReady,
}


def engine_message(event: object) -> EngineMessage | None:
    """The message for a protocol event (None for an event type this app does not show)."""
    cls = MESSAGE_FOR.get(type(event))
    return cls(event) if cls is not None else None


# ---------------------------------------------------------------- requests from screens


class AskModelPath(Message):
    """Ask for a folder or Hugging Face repo id to open."""


class ConversationDeleted(Message):
    def __init__(self, conv_id: str) -> None:
        super().__init__()
        self.conv_id = conv_id

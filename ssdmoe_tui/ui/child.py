"""`child(Kind)`: a typed property for the one widget of a kind (or id) below a node.

The app, the chat pane, the panel and the dialogs name their parts this way
(`app.chat_pane`, `pane.prompt`): each read is Textual's `query_one`, so it finds the
widget mounted now, never a stale reference, and fails loudly when it is gone.
"""

from __future__ import annotations

from typing import Any, Generic, TypeVar, overload

from textual.widget import Widget

W = TypeVar("W", bound=Widget)


class child(Generic[W]):  # lower case: it is used like `property`
    """`name = child(Kind)` or `child(Kind, "#id")`: `query_one` on each read."""

    def __init__(self, kind: type[W], selector: str | None = None) -> None:
        self.kind = kind
        self.selector = selector

    @overload
    def __get__(self, node: None, owner: type) -> child[W]: ...

    @overload
    def __get__(self, node: Any, owner: type) -> W: ...

    def __get__(self, node: Any, owner: type) -> child[W] | W:
        if node is None:
            return self
        if self.selector is None:
            return node.query_one(self.kind)
        return node.query_one(self.selector, self.kind)

"""The one line for a turn that no longer fits the model's context because of the tool
results it feeds back (issue 45).

A tool can return far more than a context holds. Refused as any long prompt ("the
prompt is 24,012 tokens... shorten it"), the user was told to shorten a message they
never wrote, and attached to a server (`--attach`) they got the server's raw refusal.
Both ways now name the tools and what they returned: the local app before anything is
sent (`ChatController`), an attached one when the server refuses the turn with
`context_length_exceeded` (`chat.remote`).
"""

from __future__ import annotations

from collections.abc import Sequence

from ssdmoe_tui.errors import printable
from ssdmoe_tui.prompting.message import Message


def trailing_results(messages: Sequence[Message]) -> list[Message]:
    """The tool results that end `messages` (what a tool round's turn adds); [] when the
    last message is anything else."""
    out: list[Message] = []
    for m in reversed(messages):
        if m.role != "tool":
            break
        out.insert(0, m)
    return out


def results_past_context(messages: Sequence[Message], numbers: str) -> str | None:
    """One line naming the tools whose results end `messages` and how much each
    returned, with `numbers` (the refusal's own figures); None when the turn ends with
    anything but tool results (then the usual refusal stands)."""
    results = trailing_results(messages)
    if not results:
        return None
    named = ", ".join(
        f"{printable(m.name or 'a tool', 40)} ({len(m.content):,} characters)" for m in results[:4]
    )
    more = f" and {len(results) - 4} more" if len(results) > 4 else ""
    which = "result of" if len(results) == 1 else "results of"
    fit = "does not fit" if len(results) == 1 else "do not fit"
    return (
        f"the {which} {named}{more} {fit} the model's context ({numbers}): the tool "
        "loop stops here; ask for less, or start a new conversation"
    )

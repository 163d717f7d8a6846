"""The tool loop's decisions, without Textual: which calls need the user's approval,
what a denied or failed call tells the model, and when the loop stops.

    loop.begin()                          # a new user turn: the round count restarts
    for call in calls:                    # the model's calls in one reply
        if loop.needs_approval(conv, call.name): ... ask: once / always / deny
        result = loop.run(call, ticket)   # or loop.denied(call)
    why = loop.next_round(max_rounds)     # None: run them; else one line, stop

Approvals are remembered per conversation ("always" for one tool in one conversation),
for as long as the app runs. Which tools a conversation has on is its `ToolChoice`
(tools/choice.py), passed in: a tool it has off is not offered, and a call to it is
answered "not enabled" without asking."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from ssdmoe_tui.errors import printable
from ssdmoe_tui.tools.calls import BadArguments, ToolCall
from ssdmoe_tui.tools.choice import ToolChoice
from ssdmoe_tui.tools.servers import STOPPED_TEXT, ToolResult, ToolServers, ToolSpec

ONCE, ALWAYS, DENY = "once", "always", "deny"
DENIED_TEXT = "The user denied this tool call; it was not run."
OFFERED, NOT_ENABLED, UNKNOWN = "offered", "not enabled", "unknown tool"  # a call's standing
_NOT_ENABLED = re.compile(r"^Error: the tool '.*' is not enabled in this conversation", re.S)


def result_state(text: str | None) -> str:
    """A saved call's state as its block showed it, from the result fed back to the
    model (None: no result was saved, the loop was stopped before one): a resumed
    conversation's blocks read as they did."""
    if text is None or text.startswith(STOPPED_TEXT):
        return "stopped"
    if text == DENIED_TEXT:
        return "denied"
    if text.startswith("Error: unknown tool "):
        return UNKNOWN
    if _NOT_ENABLED.match(text):
        return NOT_ENABLED
    return "failed" if text.startswith("Error:") else "done"


@dataclass
class ToolLoop:
    servers: ToolServers
    rounds: int = 0  # tool rounds answered since the user's last message
    always: dict[str, set[str]] = field(default_factory=dict)  # conversation -> tool names

    def begin(self) -> None:
        self.rounds = 0

    def offered(self, choice: ToolChoice) -> list[ToolSpec]:
        """The running servers' tools (allow-lists applied) the conversation has on."""
        return [t for t in self.servers.tools() if choice.allows(t.server, t.name)]

    def standing(self, tool: str, choice: ToolChoice) -> str:
        """OFFERED: the call may be asked about and run. NOT_ENABLED: a running server
        offers it but the conversation has it off. UNKNOWN: no running server offers it
        (unknown, left out by an allow-list, differing by case). Neither of the last two
        is asked about: the model is told why (`not_run`)."""
        spec = next((t for t in self.servers.tools() if t.name == tool), None)
        if spec is None:
            return UNKNOWN
        return OFFERED if choice.allows(spec.server, spec.name) else NOT_ENABLED

    def not_run(self, call: ToolCall, standing: str, choice: ToolChoice) -> ToolResult:
        """The result of a call that is not asked about: unknown, or not enabled here."""
        if standing != NOT_ENABLED:
            return self.servers.call(call.name, {})  # the server side's "unknown tool"
        on = ", ".join(t.name for t in self.offered(choice)) or "none"
        msg = f"the tool {call.name!r} is not enabled in this conversation (enabled: {on})"
        note = f"{call.name} is off in this conversation (F10): the model was told so"
        return ToolResult(f"Error: {msg}", True, note)

    def needs_approval(self, conversation: str | None, tool: str) -> bool:
        return tool not in self.always.get(conversation or "", set())

    def remember(self, conversation: str | None, tool: str, choice: str) -> None:
        if choice == ALWAYS:
            self.always.setdefault(conversation or "", set()).add(tool)

    def run(self, call: ToolCall, ticket: int | None = None) -> ToolResult:
        """Run one call (blocking, bounded by its server's timeout); `ticket` is
        `servers.ticket()` taken where the call was approved."""
        try:
            args = call.args()
        except BadArguments as e:
            msg = f"{printable(call.name, 60)}: {e}"
            return ToolResult(f"Error: {msg}", True, msg)
        return self.servers.call(call.name, args, ticket)

    @staticmethod
    def denied(call: ToolCall) -> ToolResult:
        return ToolResult(DENIED_TEXT, True, f"{call.name}: denied")

    def next_round(self, max_rounds: int) -> str | None:
        """Count a round of calls; None if they may run, else why not (one line)."""
        if self.rounds >= max_rounds:
            return (
                f"Tool loop stopped after {max_rounds} rounds "
                "(max tool rounds, F9); send a message to go on."
            )
        self.rounds += 1
        return None

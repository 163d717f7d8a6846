"""Recording one exchange into a stored conversation, for the session tests that drive
the engine without the app (the app records turns with `AppSessions.record`)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from ssdmoe_tui.sessions.store import Conversation, SessionStore, Turn


def record_exchange(
    store: SessionStore,
    conv: Conversation,
    user_text: str,
    delta: Sequence[int],
    reply_text: str,
    reply_tokens: Sequence[int],
    finish_reason: str,
    k_per_token: Sequence[int] = (),
) -> bool:
    """Append the user turn and the reply, and save. A failed generation ("error") records
    nothing (the history must stay what the model saw) and returns False."""
    if finish_reason == "error":
        return False
    k = Counter(k_per_token).most_common(1)[0][0] if k_per_token else None
    conv.turns.append(Turn("user", user_text, list(delta)))
    conv.turns.append(
        Turn(
            "assistant",
            reply_text,
            list(reply_tokens),
            k=k,
            stopped=finish_reason == "cancelled",
        )
    )
    store.save(conv)
    return True

"""Issue 34 (9): after a restart, every saved conversation continues from its checkpoint.

Four conversations leave checkpoints on disk; a fresh server (empty memory) is asked
each one's next turn in turn. The first was served from disk, and every later one only
from the few template tokens it shares with the first (in memory since then): memory was
asked first and the disk only when memory held nothing. Now the disk is consulted
whenever it holds a longer prefix, so each next turn reuses >= 97 % of its prompt.
"""

from __future__ import annotations

from ssdmoe_tui.options import EngineOptions
from ssdmoe_tui.server.main import ServeOptions
from tests.helpers.server import Running, conversation_turns
from tests.helpers.texts import SYSTEM

TOPICS = ["the tides of the North Sea", "baking sourdough bread at home",
          "the history of the printing press", "how bees choose a new nest"]  # fmt: skip


def test_every_conversation_continues_from_disk_after_a_restart(checkpoints, tmp_path,
                                                                monkeypatch):  # fmt: skip
    monkeypatch.setenv("SSDMOE_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("SSDMOE_LOCK_DIR", str(tmp_path / "locks"))
    opts = ServeOptions(EngineOptions(model=str(checkpoints("qwen3_moe"))),
                        cache_root=tmp_path / "sc")  # fmt: skip
    srv = Running(opts)
    chats = []
    try:
        for topic in TOPICS:
            start = [
                {"role": "system", "content": SYSTEM},  # long: a turn adds < 3 %
                {"role": "user", "content": f"Tell me a long story about {topic}."},
            ]
            messages, _ = conversation_turns(srv.client(), srv.model, 2, start=start)
            chats.append(messages)
    finally:
        srv.stop()
    for order in (chats, chats[::-1]):
        again = Running(opts)  # a fresh engine: memory empty, checkpoints on disk
        try:
            for messages in order:
                _, usages = conversation_turns(again.client(), again.model, 1,
                                               start=[dict(m) for m in messages])  # fmt: skip
                u = usages[0]
                assert u.prompt_tokens_details.cached_tokens >= 0.97 * u.prompt_tokens, u
        finally:
            again.stop()

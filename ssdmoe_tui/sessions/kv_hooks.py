"""The engine's KV persistence hooks, backed by the session store.

    EngineService(post, kv_hooks=session_hooks)   # what `commands/chat.py` does

`session_hooks(notice)` runs on the engine thread and returns the `KVHooks`.

Both run on the engine thread. `save` writes a checkpoint of the cache at the end of
a turn (after the reply is shown); `load` is called when no in-memory cache serves a
session's prompt (after a restart, or once the LRU dropped it): it returns the
checkpoint covering the longest prefix of the prompt, or None when there is none. A
bad checkpoint raises CheckpointInvalid (one line), which the engine shows as a notice
before rebuilding the context from the prompt's token ids.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ssdmoe_tui.engine.run.service import KVHooks
from ssdmoe_tui.sessions.checkpoint_hooks import CheckpointHooks
from ssdmoe_tui.sessions.checkpoints import (
    CacheShape,
    NoCheckpoint,
    checkpoint_covers,
    load_checkpoint,
)
from ssdmoe_tui.sessions.expert_set import save_working_set
from ssdmoe_tui.sessions.store import CONVERSATION_FILE, SessionStore


class SessionKV(CheckpointHooks):
    """One checkpoint folder per stored conversation (its own folder)."""

    def __init__(self, store: SessionStore, **budgets: Any) -> None:
        super().__init__(**budgets)
        self.store = store
        self.last_load_s: float = 0.0
        self.skipped: list[str] = []  # reasons of checkpoints skipped by the last load

    def folder_for(self, session_id: str, tokens: Sequence[int]) -> Path | None:
        folder = self.store.folder(session_id)
        if not (folder / CONVERSATION_FILE).is_file():
            return None  # not a stored conversation (or deleted meanwhile)
        return folder

    def load(self, session_id: str, tokens: Sequence[int], info: Any) -> tuple[list, int] | None:
        self.skipped = []
        start = time.perf_counter()
        folder = self.store.folder(session_id)

        def skip(reason: str) -> None:
            self.skipped.append(reason)

        got: tuple[list, int] | None = None
        try:
            shape = CacheShape.of_info(info)
            got = load_checkpoint(folder, tokens, info.fingerprint, on_skip=skip, shape=shape)
        except NoCheckpoint:
            pass  # none applies; a FIFO or link named like one is still said below
        finally:
            self.last_load_s = time.perf_counter() - start
        for reason in self.skipped:  # what was passed over (an older one may have served)
            self._tell(f"checkpoint ignored: {reason}")
        return got

    def covers(self, session_id: str, tokens: Sequence[int], info: Any) -> int:
        """How many tokens `load` would serve (headers only: no tensors read)."""
        return checkpoint_covers(self.store.folder(session_id), tokens, info.fingerprint)

    def save_experts(self, session_id: str, working_set: Any, info: Any) -> None:
        """The expert cache's working set beside the checkpoints (`expert_set.py`)."""
        folder = self.folder_for(session_id, ())
        if folder is not None:
            save_working_set(folder, working_set, info)


def session_hooks(notice: Callable[[str], None]) -> KVHooks:
    """KV hooks over the default session store (`EngineService(kv_hooks=session_hooks)`)."""
    kv = SessionKV(SessionStore(), notice=notice)
    return KVHooks(save=kv.save, load=kv.load, save_experts=kv.save_experts, covers=kv.covers)

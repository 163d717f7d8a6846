"""The one base of the engine's KV-checkpoint hooks: the app's (`kv_hooks.SessionKV`,
one folder per conversation) and the server's (`server/prompt_cache.ServerKV`, one
folder per chain of requests).

Both save with the same call and the same budgets (`sessions.checkpoints`: 2
checkpoints per folder, 4 GiB per folder, 16 GiB over all folders) and say why a
checkpoint was skipped the same way; they differ only in where a prompt's checkpoint
goes (`folder_for`) and in how a load searches (`load`). `tests/sessions/
test_checkpoint_hooks.py` runs one contract against both.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ssdmoe_tui.sessions.checkpoints import (
    DEFAULT_GLOBAL_BUDGET,
    DEFAULT_KEEP,
    DEFAULT_SESSION_BUDGET,
    save_checkpoint,
)


class CheckpointHooks:
    """`save` and `load` for `engine.run.service.KVHooks`, called on the engine thread."""

    def __init__(
        self,
        *,
        notice: Callable[[str], None] | None = None,
        keep: int = DEFAULT_KEEP,
        session_budget: int = DEFAULT_SESSION_BUDGET,
        global_budget: int = DEFAULT_GLOBAL_BUDGET,
    ) -> None:
        self.notice = notice
        self.keep = keep
        self.session_budget = session_budget
        self.global_budget = global_budget

    def _tell(self, message: str) -> None:
        if self.notice is not None:
            self.notice(message)

    def folder_for(self, session_id: str, tokens: Sequence[int]) -> Path | None:
        """Where the checkpoint of `tokens` goes; None: nowhere (nothing to attach it to)."""
        raise NotImplementedError

    def saved(self, folder: Path) -> None:
        """After a checkpoint was written into `folder` (housekeeping)."""

    def save(self, session_id: str, tokens: Sequence[int], cache: list, info: Any) -> None:
        folder = self.folder_for(session_id, tokens)
        if folder is None:
            return
        res = save_checkpoint(
            folder,
            cache,
            tokens,
            info.fingerprint,
            keep=self.keep,
            session_budget=self.session_budget,
            global_budget=self.global_budget,
        )
        if res.skipped:
            self._tell(res.skipped)
        self.saved(folder)

    def load(self, session_id: str, tokens: Sequence[int], info: Any) -> tuple[list, int] | None:
        """(cache, tokens it covers) for the longest prefix of `tokens`, or None."""
        raise NotImplementedError

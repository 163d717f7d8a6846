"""KV checkpoints in `serve --distributed`: every rank restores the same prompt prefix.

Every rank runs the same attention, so every rank's KV cache holds the same values, and
after a restart every rank must start a turn from the same checkpoint or prefill the
same tokens (the ranks compute each token together). Rank 0 alone knows the
conversations (the prompt's chain, the history records), so rank 0 decides and the
other ranks follow, at the points where every rank's engine thread calls the hooks
(`EngineService._keep_cache` and `_take_cache`, in step):

- save: rank 0 saves as one process does and sends the chain it saved into; a rank that
  is the first on its machine saves its own copy there (ranks on rank 0's machine read
  rank 0's files: the values are the same, so one copy per machine is enough).
- load: rank 0 chooses the checkpoint (chain, the tokens it covers, the tokens to
  reuse) and sends the choice; every rank reads its machine's copy; then the ranks
  compare what they got, and unless every rank got the same number of tokens none
  uses its checkpoint (all prefill: never out of step).

A file error never skips a collective: the exchange happens first, the disk after.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ssdmoe_tui.server.prompt_cache import ServerKV, model_folder


class ReplicatedKV:
    """The `KVHooks` of one rank (`hooks()`); `kv_of(info)` gives this rank's ServerKV."""

    def __init__(self, dist, kv_of: Callable[[Any], ServerKV | None], writes: bool) -> None:
        self.dist = dist
        self.kv_of = kv_of
        self.writes = writes  # this rank keeps its machine's copy

    @classmethod
    def root(cls, dist, kv_of: Callable[[Any], ServerKV | None]) -> ReplicatedKV:
        return cls(dist, kv_of, writes=True)

    @classmethod
    def follower(cls, dist, cache_root: Path, notice=lambda msg: None) -> ReplicatedKV:
        """A rank other than 0: its checkpoints under `cache_root` (this machine's)."""
        made: dict[str, ServerKV] = {}

        def kv_of(info) -> ServerKV:
            key = info.fingerprint
            if key not in made:
                made[key] = ServerKV(model_folder(cache_root, key), notice=notice)
            return made[key]

        return cls(dist, kv_of, writes=dist.first_on_host())

    def hooks(self):
        from ssdmoe_tui.engine.run.service import KVHooks

        return KVHooks(save=self.save, load=self.load, covers=self.covers)

    # ------------------------------------------------------------------ hooks
    def save(self, session_id: str, tokens: Sequence[int], cache: list, info: Any) -> None:
        error: Exception | None = None
        chain = None
        if self.dist.is_root:
            try:
                kv = self.kv_of(info)
                chain = kv.chain_of(tokens) if kv is not None else None
                if chain is not None:
                    kv.save(session_id, tokens, cache, info)
            except Exception as e:  # noqa: BLE001 - reported below, after the exchange
                error = e
        chain = self.dist.broadcast_json(chain)
        if error is not None:
            raise error
        if chain and self.writes and not self.dist.is_root:
            self.kv_of(info).save_to_chain(chain, tokens, cache, info)

    def covers(self, session_id: str, tokens: Sequence[int], info: Any) -> int:
        """Rank 0's answer (its checkpoints decide), the same on every rank."""
        n = 0
        if self.dist.is_root:
            try:
                kv = self.kv_of(info)
                n = kv.covers(session_id, tokens, info) if kv is not None else 0
            except Exception:  # noqa: BLE001 - nothing on disk: every rank uses memory
                n = 0
        return int(self.dist.broadcast_json(n) or 0)

    def load(self, session_id: str, tokens: Sequence[int], info: Any) -> tuple[list, int] | None:
        choice = None
        kv = None
        if self.dist.is_root:
            try:
                kv = self.kv_of(info)
                got = kv.choose(tokens, info) if kv is not None else None
                if got is not None:
                    choice = {"chain": got[0], "covered": list(got[1]), "reuse": got[2]}
            except Exception:  # noqa: BLE001 - no checkpoint: every rank prefills
                choice = None
        choice = self.dist.broadcast_json(choice)
        if choice is None:
            return None  # every rank got the same answer
        result, before = None, None
        try:
            kv = kv or self.kv_of(info)
            before = kv.last_load
            result = kv.load_chosen(choice["chain"], choice["covered"], choice["reuse"], info)
        except Exception:  # noqa: BLE001 - this rank has no usable copy
            result = None
        counts = self.dist.gather_json(result[1] if result is not None else 0)
        if counts[0] > 0 and all(n == counts[0] for n in counts):
            return result
        if result is not None and kv is not None:
            kv.last_load = before  # not used: another rank could not restore the same
        return None

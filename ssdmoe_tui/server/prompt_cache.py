"""The server's KV checkpoints: the app's safetensors format and budgets, filed by chain.

The engine keeps recent caches in memory (`KVPool`, longest prefix across requests:
attention-only caches are trimmed to the common prefix, hybrid ones need an exact
prefix). These hooks add the disk, so a restarted server answers a long prompt it has
seen from a checkpoint instead of a prefill:

- `save` (engine thread, after each reply): `sessions.checkpoints.save_checkpoint` of the
  cache into `<root>/chains/<chain>/`, the chain being the conversation the prompt
  continues (`prompts.Prompt.chain`); the app's budgets apply (2 checkpoints per chain,
  4 GiB per chain, 16 GiB over all chains of the model), and at most `max_chains`
  chains are kept (least recently used go).
- `covers` / `load` (engine thread, before each prompt: the engine loads when the disk
  serves more of it than its memory does): the checkpoint, over all chains, that covers
  the longest prefix of the prompt (header and token
  hash checked first, tensors' checksum on load). A file that cannot serve (truncated,
  corrupt, another model's, a FIFO, a link, a folder: replaced under a running server or
  found after a restart) is skipped, the prompt computed instead, and one notice names
  the file and why (once per file version, not per request).

The engine only sees `KVHooks`; it imports nothing from here.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from mlx_lm.models.cache import can_trim_prompt_cache, trim_prompt_cache

from ssdmoe_tui.atomic import private_dirs, remove_orphan_temps
from ssdmoe_tui.engine.run.kv_pool import common_prefix
from ssdmoe_tui.server.prompts import is_chain
from ssdmoe_tui.sessions.checkpoint_hooks import CheckpointHooks
from ssdmoe_tui.sessions.checkpoints import (
    CacheShape,
    CheckpointInvalid,
    NoCheckpoint,
    NotApplicable,
    check_checkpoint,
    checkpoint_path,
    list_checkpoints,
    load_checkpoint,
)

SESSION_KEY = "ssdmoe-server"  # one in-memory pool namespace for every request


def model_folder(root: Path, fingerprint: str) -> Path:
    """Per-model folder under the server cache (the fingerprint hashed into a safe name)."""
    return Path(root) / hashlib.sha256(fingerprint.encode()).hexdigest()[:16]


class ServerKV(CheckpointHooks):
    """One checkpoint folder per chain of requests (the conversation a prompt continues)."""

    def __init__(
        self,
        folder: Path,
        *,
        max_chains: int = 32,
        tokens_of: Callable[[str], list[tuple[int, ...]]] = lambda chain: [],
        **budgets: Any,
    ) -> None:
        super().__init__(**budgets)
        self.chains = Path(folder) / "chains"
        # What saves killed mid-write left (KV temps of GBs, history temps): the start-up
        # sweep of the data folder stops two levels down, above the chains.
        remove_orphan_temps(Path(folder), depth=2)
        self.max_chains = max_chains
        self.tokens_of = tokens_of  # a chain's known token sequences (its history records)
        self._pending: list[tuple[tuple[int, ...], str]] = []  # (prompt, chain), newest last
        self._lock = threading.Lock()
        self.last_load: tuple[str, int] | None = None  # (chain, tokens) of the last disk hit
        # Files skipped and said, by (path, mtime): not read, nor said, again until replaced.
        self._bad: set[tuple[str, int]] = set()

    def register(self, prompt: Sequence[int], chain: str) -> None:
        """Before submitting a prompt: which chain its checkpoint goes to."""
        if not is_chain(chain):
            raise ValueError(f"bad chain id {chain!r}")
        with self._lock:
            self._pending.append((tuple(prompt), chain))
            del self._pending[:-8]

    def _chain_of(self, tokens: Sequence[int]) -> str | None:
        with self._lock:
            for prompt, chain in reversed(self._pending):
                if len(tokens) >= len(prompt) and tuple(tokens[: len(prompt)]) == prompt:
                    return chain
        return None

    def has_checkpoint(self, chain: str, n_tokens: int) -> bool:
        """Whether `chain` holds a checkpoint of exactly `n_tokens` (contents unchecked)."""
        return is_chain(chain) and checkpoint_path(self.chains / chain, n_tokens).is_file()

    # ------------------------------------------------------------------ engine hooks
    def folder_for(self, session_id: str, tokens: Sequence[int]) -> Path | None:
        chain = self._chain_of(tokens)
        if chain is None:
            return None  # not a prompt this server registered
        return private_dirs(self.chains / chain, tighten=True)  # 0700: prompts' KV state

    def saved(self, folder: Path) -> None:
        os.utime(folder)
        self._prune(keep=folder)

    def chain_of(self, tokens: Sequence[int]) -> str | None:
        """The chain a save of `tokens` goes to (None: not a prompt registered here)."""
        return self._chain_of(tokens)

    def save_to_chain(self, chain: str, tokens: Sequence[int], cache: list, info: Any) -> None:
        """Save into `chain` (rank 0 of `serve --distributed` decided which)."""
        self.register(tokens, chain)  # raises on a bad chain id
        self.save(SESSION_KEY, tokens, cache, info)

    def load(self, session_id: str, tokens: Sequence[int], info: Any) -> tuple[list, int] | None:
        """The checkpoint that serves the longest prefix of `tokens`: one covering an exact
        prefix, or (attention-only models) one whose tokens share a longer prefix with
        them, trimmed to it. A checkpoint's tokens are known from its conversation's
        history record (`tokens_of`); the header's token hash confirms them."""
        choice = self.choose(tokens, info)
        if choice is None:
            return None
        return self.load_chosen(*choice, info)

    def covers(self, session_id: str, tokens: Sequence[int], info: Any) -> int:
        """How many tokens `load` would serve (headers only: no tensors read)."""
        choice = self.choose(tokens, info)
        return choice[2] if choice is not None else 0

    def choose(self, tokens: Sequence[int], info: Any) -> tuple[str, tuple[int, ...], int] | None:
        """Which checkpoint `load` reads: (chain, the tokens it covers, tokens to reuse)."""
        limit = len(tokens) - 1  # at least one token is always fed
        exact: tuple[Path, int] | None = None
        trim: tuple[Path, tuple[int, ...], int] | None = None  # folder, its tokens, reuse
        for folder in self._folders():
            seqs = self.tokens_of(folder.name) if not info.hybrid else []
            skip = self._skipper(folder)
            for ck in list_checkpoints(folder, skip):
                if (str(ck.path), ck.mtime_ns) in self._bad:
                    continue
                best = max(exact[1] if exact else 0, trim[2] if trim else 0)
                if ck.n_tokens <= limit and ck.n_tokens > best:
                    try:
                        exact = (folder, check_checkpoint(ck.path, tokens, info.fingerprint))
                        continue
                    except NotApplicable:
                        pass
                    except CheckpointInvalid as e:
                        skip(e.reason)
                        continue
                for seq in seqs:
                    if len(seq) < ck.n_tokens:
                        continue
                    reuse = min(common_prefix(seq[: ck.n_tokens], tokens), limit)
                    if reuse <= best or reuse >= ck.n_tokens:
                        continue
                    try:
                        if check_checkpoint(ck.path, seq, info.fingerprint) != ck.n_tokens:
                            continue
                    except NotApplicable:
                        continue
                    except CheckpointInvalid as e:
                        skip(e.reason)
                        continue
                    trim = (folder, tuple(seq[: ck.n_tokens]), reuse)
                    break
        if trim is not None and trim[2] > (exact[1] if exact else 0):
            folder, covered, reuse = trim
        elif exact is not None:
            folder, covered, reuse = exact[0], tuple(tokens[: exact[1]]), exact[1]
        else:
            return None
        return folder.name, covered, reuse

    def load_chosen(
        self, chain: str, covered: Sequence[int], reuse: int, info: Any
    ) -> tuple[list, int] | None:
        """Read `chain`'s checkpoint of `covered` and trim it to `reuse` tokens."""
        if not is_chain(chain):
            raise ValueError(f"bad chain id {chain!r}")
        folder = self.chains / chain
        covered = tuple(covered)
        try:
            cache, got = load_checkpoint(
                folder,
                covered,
                info.fingerprint,
                on_skip=self._skipper(folder),
                shape=CacheShape.of_info(info),
            )
        except NoCheckpoint:
            return None
        except CheckpointInvalid:
            return None  # each file's reason was said (on_skip): the prompt is computed
        if got > reuse:
            if not can_trim_prompt_cache(cache) or trim_prompt_cache(cache, got - reuse) != (
                got - reuse
            ):
                return None
            got = reuse
        # (got < reuse: an older checkpoint served instead; it covers a prefix of the prompt)
        os.utime(folder)
        self.last_load = (folder.name, got)
        return cache, got

    def _skipper(self, folder: Path) -> Callable[[str], None]:
        """`on_skip` for `folder`'s checkpoints: a reason ("kv-N.safetensors: truncated
        ...") becomes one notice with the file's path, once per version of the file,
        which `choose` passes over from then on."""

        def skip(reason: str) -> None:
            name = reason.split(":", 1)[0]
            path = folder / name
            try:
                mtime = os.lstat(path).st_mtime_ns
            except OSError:
                mtime = 0
            key = (str(path), mtime)
            with self._lock:
                if key in self._bad:
                    return
                if len(self._bad) >= 4096:
                    self._bad.clear()
                self._bad.add(key)
            self._tell(f"checkpoint ignored: {folder}/{reason}; what it held is computed again")

        return skip

    # ------------------------------------------------------------------ housekeeping
    def _folders(self) -> list[Path]:
        try:
            found = [
                Path(e.path)
                for e in os.scandir(self.chains)
                if is_chain(e.name) and e.is_dir(follow_symlinks=False)
            ]
        except OSError:
            return []
        return sorted(found, key=lambda p: _mtime(p), reverse=True)

    def _prune(self, keep: Path) -> None:
        """At most `max_chains` chains; empty ones (budgets evicted their files) go too."""
        folders = self._folders()
        for i, folder in enumerate(folders):
            if folder == keep:
                continue
            if i >= self.max_chains or not list_checkpoints(folder):
                shutil.rmtree(folder, ignore_errors=True)


def _mtime(p: Path) -> float:
    try:
        return p.stat().st_mtime
    except OSError:
        return 0.0

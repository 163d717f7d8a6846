"""In-memory LRU of prompt caches (mlx-lm per-layer cache lists) under a byte budget.

The engine `take`s the best cache for the next prompt, feeds only the tokens the
cache does not cover, and `put`s the grown cache back after the turn. A cache is
handed out, not copied: while the engine extends it, it is not in the pool.

Reuse rules:
- at least one prompt token is always fed (the model needs logits for the last one),
  so at most `len(tokens) - 1` tokens are reused;
- a cache whose tokens run past the reuse point must be trimmed; only caches whose
  every layer is trimmable (attention-only KV) can be, to the longest common prefix;
- hybrid caches (Mamba / linear-attention state, not trimmable) are reused only when
  their tokens are an exact prefix of the prompt, shorter than it.

Keys are namespaces: the engine passes one that includes the model fingerprint (and,
if it wants per-conversation isolation, the session id), so a cache is never offered
to another model. Call `clear()` on model switch to free the memory.
"""

from __future__ import annotations

import copy
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
from mlx.utils import tree_flatten
from mlx_lm.models.cache import can_trim_prompt_cache, trim_prompt_cache

PromptCache = list[Any]


def cache_nbytes(cache: PromptCache) -> int:
    """Bytes held by a prompt cache's arrays (allocated buffers, not just the used part)."""
    total = 0
    for layer in cache:
        try:
            total += int(layer.nbytes)
        except (NotImplementedError, AttributeError):
            total += sum(v.nbytes for _, v in tree_flatten(layer.state) if isinstance(v, mx.array))
    return total


def covered_tokens(cache: PromptCache) -> int | None:
    """Tokens an attention layer of the cache holds (its offset); None if no layer tells."""
    for layer in cache:
        offset = getattr(layer, "offset", None)
        if isinstance(offset, int) and not getattr(layer, "empty", lambda: False)():
            return offset
    return None


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


@dataclass
class _Entry:
    key: str
    tokens: tuple[int, ...]
    cache: PromptCache
    nbytes: int
    trimmable: bool


class KVPool:
    """LRU of prompt caches; `budget_bytes` bounds the sum of their array bytes."""

    def __init__(self, budget_bytes: int) -> None:
        self._budget = max(0, int(budget_bytes))
        self._entries: OrderedDict[int, _Entry] = OrderedDict()  # oldest first
        self._next = 0
        self._used = 0
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ queries
    @property
    def bytes_used(self) -> int:
        return self._used

    @property
    def budget_bytes(self) -> int:
        return self._budget

    def __len__(self) -> int:
        return len(self._entries)

    def best_reuse(self, key: str, tokens: Sequence[int]) -> int:
        """How many tokens `take` would reuse, without taking anything."""
        with self._lock:
            found = self._best(key, tokens)
        return found[1] if found else 0

    # ------------------------------------------------------------------ updates
    def take(self, key: str, tokens: Sequence[int]) -> tuple[PromptCache | None, int]:
        """The cache that covers the longest prefix of `tokens`, trimmed to it, and how
        many tokens it covers (feed `tokens[n:]`); `(None, 0)` if none fits.

        A cache that covers exactly that prefix is removed and handed out (the caller
        extends it and puts the longer one back). One that must be trimmed stays in the
        pool for the requests that continue it, and a trimmed copy is handed out (as
        mlx-lm's server does): a request that shares only a system prompt with a long
        conversation does not cost that conversation its cache."""
        with self._lock:
            found = self._best(key, tokens)
            if found is None:
                return None, 0
            entry_id, n = found
            entry = self._entries[entry_id]
            excess = len(entry.tokens) - n
            if excess <= 0:
                del self._entries[entry_id]
                self._used -= entry.nbytes
                return entry.cache, n
            self._entries.move_to_end(entry_id)
        cache = copy.deepcopy(entry.cache)
        trimmed = trim_prompt_cache(cache, excess)
        if trimmed != excess:  # cannot happen for trimmable caches; never hand out a wrong one
            return None, 0
        return cache, n

    def covers(self, key: str, tokens: Sequence[int]) -> int:
        """How many tokens of `tokens` `take` would serve (0: none), without taking."""
        with self._lock:
            found = self._best(key, tokens)
        return found[1] if found is not None else 0

    def put(self, key: str, tokens: Sequence[int], cache: PromptCache) -> bool:
        """Keep `cache`, which covers exactly `tokens`. Returns False if it alone is over
        the budget (then it is dropped). Evicts least recently used caches to fit."""
        tokens = tuple(int(t) for t in tokens)
        offset = covered_tokens(cache)
        if offset is not None and offset != len(tokens):
            raise ValueError(f"KV cache covers {offset} tokens but {len(tokens)} were given")
        entry = _Entry(key, tokens, cache, cache_nbytes(cache), can_trim_prompt_cache(cache))
        with self._lock:
            # The same tokens, or (for trimmable caches) any prefix of them, is now redundant.
            for eid, old in list(self._entries.items()):
                if old.key != key:
                    continue
                same = old.tokens == tokens
                dominated = (
                    entry.trimmable
                    and len(old.tokens) < len(tokens)
                    and tokens[: len(old.tokens)] == old.tokens
                )
                if same or dominated:
                    del self._entries[eid]
                    self._used -= old.nbytes
            if entry.nbytes > self._budget:
                return False
            while self._entries and self._used + entry.nbytes > self._budget:
                _, old = self._entries.popitem(last=False)
                self._used -= old.nbytes
            self._entries[self._next] = entry
            self._next += 1
            self._used += entry.nbytes
        return True

    def set_budget(self, budget_bytes: int) -> None:
        with self._lock:
            self._budget = max(0, int(budget_bytes))
            while self._entries and self._used > self._budget:
                _, old = self._entries.popitem(last=False)
                self._used -= old.nbytes

    def clear(self, key: str | None = None) -> None:
        """Drop every cache (or those under `key`)."""
        with self._lock:
            for eid, entry in list(self._entries.items()):
                if key is None or entry.key == key:
                    del self._entries[eid]
                    self._used -= entry.nbytes

    # ------------------------------------------------------------------ internals
    def _best(self, key: str, tokens: Sequence[int]) -> tuple[int, int] | None:
        """(entry id, tokens reused) of the best candidate; most recent wins ties."""
        limit = len(tokens) - 1
        best: tuple[int, int] | None = None
        for eid, entry in reversed(self._entries.items()):
            if entry.key != key:
                continue
            n = min(common_prefix(entry.tokens, tokens), limit)
            if n <= 0:
                continue
            if n < len(entry.tokens) and not entry.trimmable:
                continue  # would need trimming recurrent state: not possible
            if best is None or n > best[1]:
                best = (eid, n)
        return best


def kv_bytes_per_token(cache: PromptCache) -> int:
    """Bytes one more token adds to a prompt cache: its attention layers' K and V rows
    (recurrent state does not grow). From the arrays when they exist."""
    total = 0
    for layer in cache:
        keys = getattr(layer, "keys", None)
        values = getattr(layer, "values", None)
        if isinstance(keys, mx.array) and isinstance(values, mx.array) and keys.ndim == 4:
            rows = keys.shape[0] * keys.shape[2]
            total += (keys.nbytes + values.nbytes) // max(rows, 1)
    return total


def estimate_bytes_per_token(model, config: dict, dtype_size: int) -> int:
    """Before any forward pass: attention layers (the model's own cache list) x K and V
    x KV heads x head size, from the config (what `kv_bytes_per_token` will measure)."""
    from mlx_lm.models.cache import KVCache, make_prompt_cache

    cfg = config.get("text_config", config)
    heads = int(cfg.get("num_attention_heads", 1) or 1)
    kv_heads = int(cfg.get("num_key_value_heads", heads) or heads)
    head_dim = int(cfg.get("head_dim") or cfg.get("hidden_size", heads) // heads)
    layers = sum(isinstance(c, KVCache) for c in make_prompt_cache(model))
    return layers * 2 * kv_heads * head_dim * dtype_size


def auto_max_batch(runner, budget_bytes: int, context: int | None = None) -> int:
    """Sequences the KV budget holds at the model's context (capped at 8192 tokens a
    sequence), at least 4 and at most 16: `serve`'s default `--max-batch`."""
    from ssdmoe_tui.engine.model.context import max_context

    sm = runner.sm
    ctx = min(context or max_context(sm.config) or 8192, 8192)
    per_token = estimate_bytes_per_token(sm.model, sm.config, sm.dtype.size)
    if per_token <= 0:
        return 4
    return max(4, min(16, budget_bytes // (per_token * ctx)))

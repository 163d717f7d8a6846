"""One speculative round: the last fixed token and d drafts go through the engine as one
chunk (each MoE layer looks up the union of the chunk's experts and reads its misses
once), the longest prefix the target model agrees with is kept, and the KV cache gives
back the rest.

Giving back: attention caches (`KVCache`, `QuantizedKVCache`, a `RotatingKVCache` with
room left) move their offset back (`trim`, as mlx-lm's `speculative_generate_step`).
Recurrent state (the Mamba and gated-delta layers of nemotron_h and qwen3_5_moe:
`ArraysCache`) holds no per-token entries to drop: the state before the chunk is kept
(`prefill_stop.ChunkUndo`, which rebinds what the layers replaced, never copies), put
back, and the kept prefix is run again as one chunk (its experts were just read: a
compute-only pass). A cache that can do neither (a window that would evict, a nested
`CacheList`) gets no drafts: every round is d = 0.

Chaining: where d = 0 steps are pipelined, the caller may pass `chain`, which builds the
next one-token step on the chunk's last sample (lazily, before the chunk is waited for),
as a pipelined step is built on the one before. When every draft is kept that step is
the next round's, already computing; else it is given back (one more position trimmed)
and wasted. Without it a verify round leaves the next d = 0 round cold, and on the CPU
demo that cold step cost about what the drafts saved (docs/benchmarks.md).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass, field

import mlx.core as mx

from ssdmoe_tui.engine.run.prefill_stop import ChunkUndo
from ssdmoe_tui.engine.spec.exact import ExactVerify
from ssdmoe_tui.engine.spec.governor import CostModel

TRIM, UNDO = "trim", "undo"


def rewind_mode(cache: list, tokens: int) -> str | None:
    """How a chunk of `tokens` can be partly given back: TRIM, UNDO, or None (it cannot)."""
    from mlx_lm.models.cache import KVCache, QuantizedKVCache, RotatingKVCache

    def trims(c) -> bool:  # noqa: ANN001
        if isinstance(c, RotatingKVCache):
            return c.offset + tokens < c.max_size
        return type(c) in (KVCache, QuantizedKVCache)

    if all(trims(c) for c in cache):
        return TRIM
    if ChunkUndo.possible(cache, tokens):
        return UNDO
    return None


def always_trims(cache: list) -> bool:
    """Every layer's cache trims a chunk of any size (no window that could evict): the
    rewind mode is then TRIM for the whole turn, not asked again each round."""
    from mlx_lm.models.cache import KVCache, QuantizedKVCache

    return all(type(c) in (KVCache, QuantizedKVCache) for c in cache)


@dataclass
class SpecStats:
    """A turn's speculation figures (decode only)."""

    mode: str
    passes: int = 0  # decode forward passes: single steps, verify chunks and re-runs
    verify_passes: int = 0
    rerun_passes: int = 0
    given_back: int = 0  # pipelined d = 0 steps given back for a verify round
    chained: int = 0  # verify rounds whose chained next step stood (every draft kept)
    drafted: int = 0  # draft tokens verified
    accepted: int = 0  # of them, kept
    tokens: int = 0  # tokens the decode passes produced
    depths: dict[int, int] = field(default_factory=dict)  # rounds per chosen depth
    probes: int = 0  # rounds the governor drafted to re-measure a pass size (governor.py)
    oracle: dict | None = None  # the oracle drafter's alignment (drafts.OracleDrafter)
    # What speculation bought (the app's panel shows it): this turn's pipelined d = 0
    # rounds, plain one-token steps, by their whole cycles, against the turn's ms per
    # token; before the turn has one, the governor's price of one, T(1) at today's pace
    plain_s: float = 0.0
    plain_rounds: int = 0
    costs: CostModel | None = field(default=None, repr=False, compare=False)

    @property
    def acceptance(self) -> float | None:
        return self.accepted / self.drafted if self.drafted else None

    @property
    def tokens_per_pass(self) -> float | None:
        return self.tokens / self.passes if self.passes else None

    def as_dict(self, decode_bytes: int, decode_s: float) -> dict:
        """The figures; `speedup` is a plain step's time (the mean cycle of this turn's
        d = 0 rounds; before one, the governor's T(1)) over this reply's ms per token: an
        estimate of the speed speculation bought, below 1 where it cost (None before
        either is known)."""
        n = max(self.tokens, 1)
        acc = self.acceptance
        tpp = self.tokens_per_pass
        if self.plain_rounds:
            plain: float | None = self.plain_s / self.plain_rounds
        else:
            plain = self.costs.pass_s(1) if self.costs is not None else None
        ms = decode_s * 1e3 / n
        gain = plain * 1e3 / ms if plain and self.tokens and ms > 0 else None
        return {
            "mode": self.mode,
            "passes": self.passes,
            "verify_passes": self.verify_passes,
            "rerun_passes": self.rerun_passes,
            "given_back": self.given_back,
            "chained": self.chained,
            "drafted": self.drafted,
            "accepted": self.accepted,
            "acceptance": None if acc is None else round(acc, 4),
            "tokens_per_pass": None if tpp is None else round(tpp, 4),
            "bytes_per_token": round(decode_bytes / n),
            "ms_per_token": round(ms, 3),
            "plain_ms_per_token": round(plain * 1e3, 3) if plain else None,
            "speedup": None if gain is None else round(gain, 3),
            "depths": {str(d): c for d, c in sorted(self.depths.items())},
            "probes": self.probes,
            **({"oracle": self.oracle} if self.oracle is not None else {}),
        }


@dataclass
class Verified:
    """A round's outcome: `tokens` are the target's samples at each chunk position
    (accepted drafts, then its own); the cache holds the chunk's first `kept` positions."""

    tokens: list[int]
    accepted: int
    kept: int
    reran: bool
    rerun_s: float = 0.0  # the re-run's seconds (a non-trimmable cache)
    chained: bool = False  # the chained next step stands (every chunk position kept)


def verify_chunk(
    model,  # noqa: ANN001 - the streamed mlx-lm model
    cache: list,
    tok: int,
    drafts: list[int],
    sampler: Callable[[mx.array], mx.array],
    window=None,  # noqa: ANN001 - runner.LogitsWindow: its processors see the fed tokens
    keep_most: int | None = None,
    stop_ids: set[int] | frozenset = frozenset(),
    on_chunk: Callable[[int, int], None] | None = None,
    clock: Callable[[], float] = time.perf_counter,
    chain: Callable[[mx.array], None] | None = None,
    exact: ExactVerify | None = None,
) -> Verified:
    """Run `[tok] + drafts` as one chunk into `cache`, sample every position, keep the
    longest agreeing prefix. `keep_most`: positions the caller can still use (the turn's
    token budget); an end-of-sequence sample ends what is kept too. `on_chunk(start, n)`
    is told each pass's chunk (trace-driven routing follows it); `clock` times a re-run.
    `chain(last)`: build the next step on the lazy last sample (a trimmable cache only:
    it is given back by trimming one more position when not every position is kept).
    `exact` (`--exact-verify`): the chunk, and a re-run of its kept prefix, computed in
    one-token decode's shapes (exact.py); the chained step is a plain step either way."""
    d = len(drafts)
    mode = rewind_mode(cache, d + 1)
    undo = ChunkUndo(cache) if mode == UNDO else None
    x = mx.array([tok, *drafts], dtype=mx.uint32)
    if on_chunk is not None:
        on_chunk(0, d + 1)
    with exact.rows() if exact is not None else nullcontext():
        logits = model(x[None], cache=cache)[0]  # (d + 1, vocab)
    if window is not None:
        seen = window.seen
        rows = [window(x[i : i + 1], logits[i : i + 1]) for i in range(d + 1)]
        logprobs = [r - mx.logsumexp(r, axis=-1, keepdims=True) for r in rows]
        samples = mx.concatenate([sampler(lp).reshape(-1) for lp in logprobs])
    elif exact is not None:  # the log-softmax and the sampler in decode's (1, vocab) too
        rows = [logits[i : i + 1] for i in range(d + 1)]
        logprobs = [r - mx.logsumexp(r, keepdims=True) for r in rows]  # decode's call
        samples = mx.concatenate([sampler(lp).reshape(-1) for lp in logprobs])
    else:
        logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
        samples = sampler(logprobs).reshape(-1)
    if chain is not None:  # the window has seen the whole chunk: the step sees it too
        assert mode == TRIM, "a chained step is given back by trimming"
        chain(samples[d:])
    ys = samples.tolist()
    n = 0
    while n < d and ys[n] == drafts[n]:
        n += 1
    out = ys[: n + 1]
    for i, t in enumerate(out):  # stop at the end of sequence or of the budget
        if t in stop_ids:
            out = out[: i + 1]
            break
    if keep_most is not None:
        out = out[: max(keep_most, 1)]
    kept = len(out)  # chunk positions the cache keeps: tok and the drafts before the last
    reran, rerun_s = False, 0.0
    chained = chain is not None and kept == d + 1
    if kept < d + 1:
        if mode == TRIM:
            extra = int(chain is not None)  # the chained step's position goes too
            for c in cache:
                c.trim(d + 1 - kept + extra)
        else:
            assert undo is not None
            t0 = clock()
            undo.restore()
            if on_chunk is not None:
                on_chunk(0, kept)
            with exact.rows() if exact is not None else nullcontext():
                model(x[None, :kept], cache=cache)
            mx.eval([c.state for c in cache])
            reran, rerun_s = True, clock() - t0
    if window is not None and not chained:  # (a chained step has seen its own input)
        window.seen = mx.concatenate([seen, x[:kept]])[-window.size :]
    return Verified(out, n, kept, reran, rerun_s, chained)

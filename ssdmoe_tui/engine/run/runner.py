"""Prefill + decode loop over a StreamedModel, with the arithmetic of `mlx_lm.generate_step`.

The loop is mlx-lm's (same prefill chunking, same logits slicing, same log-softmax
and sampler) so greedy output matches plain mlx-lm token for token. It is
synchronous per token, because every MoE layer syncs its router anyway; that lets
a K change made between two tokens apply from the very next token, and lets the
per-token K record come from the computation itself.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Generator, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

import mlx.core as mx

from ssdmoe_tui.engine.experts import iostats
from ssdmoe_tui.engine.model.context import check_context, max_context
from ssdmoe_tui.engine.model.loader import StreamedModel
from ssdmoe_tui.engine.model.routing_mass import MassLog
from ssdmoe_tui.engine.model.streamed import PrefillStopped
from ssdmoe_tui.engine.run.prefill_stop import ChunkSizer, ChunkUndo
from ssdmoe_tui.engine.spec.verify import SpecStats
from ssdmoe_tui.options import Speculation, check_k


@dataclass
class TurnStats:
    prompt_tokens: int = 0
    reused_tokens: int = 0  # prompt tokens served from a KV cache
    generated_tokens: int = 0
    prefill_s: float = 0.0
    decode_s: float = 0.0
    hits: int = 0
    misses: int = 0
    requested_bytes: int = 0  # bytes the engine asked the reader for
    device_bytes: int | None = None  # bytes that came from the device (None: not measurable)
    read_s: float = 0.0
    router_sync_s: float = 0.0
    decode_requested_bytes: int = 0
    decode_device_bytes: int | None = None
    decode_hits: int = 0
    decode_misses: int = 0
    peak_memory_bytes: int = 0
    # MLX's peak when the prompt was in (before the first decode step): whether a layout's
    # extra memory (a device mirror's copies) comes with the long chunks or with decode.
    # A row joining a batch that decodes keeps the batch's peak (peaks are reset only
    # when nothing decodes): there it includes the other rows' steps.
    prefill_peak_memory_bytes: int = 0
    peak_rss_bytes: int = 0
    k_per_token: list[int] = field(default_factory=list)
    # router mass kept at the running K vs the trained K, per generated token
    # (routing_mass.py): None when no consumer asked for it; resolved only when read
    mass_log: MassLog | None = field(default=None, repr=False, compare=False)
    # speculative decoding's figures (engine/spec); None: the turn did not speculate
    spec: SpecStats | None = None

    @property
    def mass_per_token(self) -> list[float]:
        """Each generated token's mass (computed now for the tokens not read yet)."""
        return self.mass_log.values() if self.mass_log is not None else []

    @property
    def prefill_tok_s(self) -> float:
        n = self.prompt_tokens - self.reused_tokens
        return n / self.prefill_s if self.prefill_s > 0 else 0.0

    @property
    def decode_tok_s(self) -> float:
        """Tokens after the first (which prefill produced) over the time since it."""
        n = self.generated_tokens - 1
        return n / self.decode_s if n > 0 and self.decode_s > 0 else 0.0

    @property
    def hit_rate(self) -> float:
        n = self.hits + self.misses
        return self.hits / n if n else 0.0

    @property
    def kv_hit_rate(self) -> float:
        return self.reused_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    @property
    def routing_mass(self) -> float | None:
        """Mean over the generated tokens (1.0 at the trained K); None before the first."""
        m = self.mass_per_token
        return sum(m) / len(m) if m else None

    def ssd_mib_per_token(self) -> float:
        """Device bytes per decoded token (page-cache hits excluded); requested bytes if unmeasurable."""
        n = max(self.generated_tokens, 1)
        b = (
            self.decode_device_bytes
            if self.decode_device_bytes is not None
            else self.decode_requested_bytes
        )
        return b / n / 2**20

    def requested_mib_per_token(self) -> float:
        return self.decode_requested_bytes / max(self.generated_tokens, 1) / 2**20

    def as_dict(self) -> dict:
        return {
            "prompt_tokens": self.prompt_tokens,
            "reused_prompt_tokens": self.reused_tokens,
            "kv_hit_rate": round(self.kv_hit_rate, 4),
            "generated_tokens": self.generated_tokens,
            "prefill_tok_s": round(self.prefill_tok_s, 2),
            "decode_tok_s": round(self.decode_tok_s, 2),
            # Device bytes (page-cache hits excluded) when the OS reports them, else requested bytes.
            "ssd_bytes_read": self.device_bytes
            if self.device_bytes is not None
            else self.requested_bytes,
            "decode_ssd_bytes_read": self.decode_device_bytes
            if self.decode_device_bytes is not None
            else self.decode_requested_bytes,
            "ssd_bytes_measured_from_device": self.device_bytes is not None,
            "decode_requested_bytes": self.decode_requested_bytes,
            "requested_bytes": self.requested_bytes,
            "ssd_mib_per_token": round(self.ssd_mib_per_token(), 4),
            "requested_mib_per_token": round(self.requested_mib_per_token(), 4),
            "expert_cache_hits": self.hits,
            "expert_cache_misses": self.misses,
            "expert_cache_hit_rate": round(self.hit_rate, 4),
            "decode_expert_cache_hits": self.decode_hits,
            "decode_expert_cache_misses": self.decode_misses,
            "read_s": round(self.read_s, 4),
            "router_sync_s": round(self.router_sync_s, 4),
            "peak_memory_bytes": self.peak_memory_bytes,
            "peak_rss_bytes": self.peak_rss_bytes,
            "routing_mass": None if self.routing_mass is None else round(self.routing_mass, 4),
            "routing_mass_min": round(min(self.mass_per_token), 4) if self.mass_per_token else None,
            "speculation": None
            if self.spec is None
            else self.spec.as_dict(self.decode_requested_bytes, self.decode_s),
        }


@dataclass
class GenerationResult:
    prompt_tokens: list[int]
    tokens: list[int]
    text: str
    finish_reason: str  # "stop" | "length" | "cancelled"
    stats: TurnStats
    cache: list  # the KV cache: prompt[:covered_prompt] + tokens[:covered_generated]
    covered_prompt: int = 0  # prompt tokens the cache holds (all, unless cancelled in prefill)
    covered_generated: int = 0  # generated tokens it holds (all but the last, or all)
    decode_share: object = None  # in a batch: its share of the steps (batch.DecodeShare)

    @property
    def covered_tokens(self) -> list[int]:
        """Exactly the tokens the KV cache holds."""
        return self.prompt_tokens[: self.covered_prompt] + self.tokens[: self.covered_generated]


@dataclass
class Begun:
    """A sequence after `Runner.begin`: its prompt is in `cache` and `token` is the first
    generated token (None: stopped during prefill, or no tokens were asked for)."""

    prompt: list[int]
    cache: list
    stats: TurnStats
    start: Snapshot  # the engine's counters when the turn began
    reused: int  # prompt tokens the cache held before
    done: int  # prompt tokens prefilled before the last one
    token: int | None = None
    decode_share: object = None  # set by a batch: this sequence's share of the steps it ran in
    window: LogitsWindow | None = None  # its logits processors and the tokens they see


LIVE_IO_AGE_S = 0.25  # the oldest device-bytes figure a live (per-token) snapshot shows
_io_read: list = [float("-inf"), None]  # [when, device bytes] of the last read


def fresh_device_bytes(t: float) -> int | None:
    """Device bytes read by this process (/proc/self/io) now; `t` is now, kept as the
    read's time for `live_device_bytes`."""
    _io_read[:] = [t, iostats.device_read_bytes()]
    return _io_read[1]


def live_device_bytes(t: float) -> int | None:
    """The same, re-read only when the last read is older than LIVE_IO_AGE_S at `t` (a
    per-token or per-step figure: the read costs ~0.17 ms, a few % of a CPU token)."""
    return _io_read[1] if t - _io_read[0] < LIVE_IO_AGE_S else fresh_device_bytes(t)


@dataclass
class Snapshot:
    """The engine's counters at one instant; `b - a` is the work between two snapshots.

    The one counter type of the engine: the Runner attributes work to prefill and
    decode with it, the bench to its windows, the stats to a turn. Not frozen: a frozen
    dataclass sets each of its 12 fields through `object.__setattr__` (1.5 us a
    Snapshot against 0.25 us), and a batch step makes three; nothing changes one."""

    t: float = 0.0
    hits: int = 0
    misses: int = 0
    bytes_read: int = 0  # bytes asked of the reader
    read_s: float = 0.0
    read_calls: int = 0
    ensure_s: float = 0.0  # in `ExpertCache.ensure` (lookups, eviction, reads)
    router_sync_s: float = 0.0
    device_bytes: int | None = None  # from the device (/proc/self/io); None: unmeasurable
    prefetch_issued: int = 0
    prefetch_used: int = 0
    prefetch_wait_s: float = 0.0
    prefetch_dropped: int = 0  # guesses never read: their layer's lookup came first

    @classmethod
    def take(cls, sm: StreamedModel, live: bool = False) -> Snapshot:
        """`live`: a per-token figure for the UI, whose device bytes may be up to
        LIVE_IO_AGE_S old (reading /proc/self/io costs ~0.17 ms, a few % of a CPU token)."""
        c = sm.cache.counters
        t = time.perf_counter()
        return cls(
            t=t,
            hits=c.hits,
            misses=c.misses,
            bytes_read=c.bytes_read,
            read_s=c.read_s,
            read_calls=c.read_calls,
            ensure_s=c.ensure_s,
            router_sync_s=sm.times.router_sync_s,
            device_bytes=live_device_bytes(t) if live else fresh_device_bytes(t),
            prefetch_issued=c.prefetch_issued,
            prefetch_used=c.prefetch_used,
            prefetch_wait_s=c.prefetch_wait_s,
            prefetch_dropped=c.prefetch_dropped,
        )

    def __sub__(self, other: Snapshot) -> Snapshot:
        # spelt out, not a loop over dataclasses.fields: a batch step and every token of
        # a turn take differences (the loop cost ~13 us a call on two CPU cores)
        dev = (
            None
            if self.device_bytes is None or other.device_bytes is None
            else self.device_bytes - other.device_bytes
        )
        return Snapshot(
            self.t - other.t,
            self.hits - other.hits,
            self.misses - other.misses,
            self.bytes_read - other.bytes_read,
            self.read_s - other.read_s,
            self.read_calls - other.read_calls,
            self.ensure_s - other.ensure_s,
            self.router_sync_s - other.router_sync_s,
            dev,
            self.prefetch_issued - other.prefetch_issued,
            self.prefetch_used - other.prefetch_used,
            self.prefetch_wait_s - other.prefetch_wait_s,
            self.prefetch_dropped - other.prefetch_dropped,
        )

    @property
    def hit_rate(self) -> float:
        n = self.hits + self.misses
        return self.hits / n if n else 0.0


def prefetch_figures(d: Snapshot) -> dict:
    """Prediction quality over a window: precision = used / issued, recall = used /
    experts that had to come from disk (misses, prefetched ones included); None where
    nothing was issued or missed. Issued counts the guesses read; `dropped` those never
    read, their layer's lookup having come first (read-ahead's overlap)."""
    return {
        "issued": d.prefetch_issued,
        "used": d.prefetch_used,
        "precision": round(d.prefetch_used / d.prefetch_issued, 4) if d.prefetch_issued else None,
        "recall": round(d.prefetch_used / d.misses, 4) if d.misses else None,
        "wait_s": round(d.prefetch_wait_s, 4),
        "dropped": d.prefetch_dropped,
    }


# --------------------------------------------------------------------------- events


@dataclass(frozen=True)
class PrefillProgress:
    """`done` of `total` prompt tokens are in the KV cache."""

    done: int
    total: int


@dataclass(frozen=True)
class TokenEvent:
    """One generated token. `stats` is the turn's live TurnStats (updated in place as
    the turn goes on: copy what you keep)."""

    token: int
    text: str  # detokenized piece ('' for end-of-sequence)
    stats: TurnStats
    stop: bool = False  # the end-of-sequence token


@dataclass(frozen=True)
class Done:
    """The turn is over (finished, stopped at max tokens, or cancelled)."""

    result: GenerationResult


RunnerEvent = PrefillProgress | TokenEvent | Done


def auto_prefill_step(sm: StreamedModel, available_bytes: int | None = None) -> int:
    """Prefill chunk from memory: mlx-lm's 2048 (so long prompts chunk as in mlx-lm) when
    a tenth of free memory holds that chunk's activations, else the largest power of two
    that fits (min 32). Bigger chunks read each expert once for more tokens."""
    from ssdmoe_tui.checkpoint.arch import moe_geometry
    from ssdmoe_tui.memory import available_memory_bytes

    geometry = moe_geometry(sm.config)  # the one reading of the expert shape
    assert geometry is not None  # a loaded streamed model has MoE layers
    hidden, inter = geometry.hidden_size, geometry.expert_intermediate
    k = max(sm.trained_k, 1)
    act = sm.dtype.size
    # the sorted expert inputs, gate/up/down intermediates and the layer's residuals
    per_token = (hidden * (k + 6) + inter * k * 3) * act * 2
    avail = available_memory_bytes() if available_bytes is None else available_bytes
    step = 2048
    while step > 32 and step * per_token > avail // 10:
        step //= 2
    return step


def token_event(tok: int, tokens: list[int], eos: set[int], detok, stats: TurnStats,
                since: float) -> TokenEvent:  # noqa: ANN001  # fmt: skip
    """Append `tok` to the turn and make its event (its detokenized piece; '' for the end
    of sequence, which `TokenEvent.stop` tells apart)."""
    tokens.append(tok)
    if tok in eos:
        piece, stop = "", True
    else:
        detok.add_token(tok)
        piece, stop = detok.last_segment, False
    stats.generated_tokens = len(tokens)
    stats.decode_s = time.perf_counter() - since
    return TokenEvent(tok, piece, stats, stop)


@dataclass(frozen=True)
class Pause:
    """What a prefill pass calls at its MoE layer boundaries (`Runner.begin`'s `pauser`):
    `run`, and the time it is meant to bound (a pass the prefill sizer expects within it
    needs no sync at its frozen layers to ask)."""

    run: Callable[[], None]
    budget_s: float


class Runner:
    """Prefill + decode over one streamed model, and the one owner of K.

    K is set with `set_k` (thread-safe: one attribute store, read once per token) and
    reaches the MoE blocks only when it differs from what they hold."""

    token_event = staticmethod(token_event)  # for engine/spec/loop.py (no import cycle)

    def __init__(
        self,
        sm: StreamedModel,
        prefill_step_size: int | None = None,
        *,
        k: int | None = None,
        prefill_k: int | None = None,
    ) -> None:
        self.sm = sm
        self.prefill_step_size = prefill_step_size or auto_prefill_step(sm)
        self._k = sm.trained_k
        self._prefill_k: int | None = None  # None: same as k
        self._applied: int | None = None  # K the blocks hold
        self._paused_s = 0.0  # time prefill chunks spent paused (another pass ran inside)
        self._paused_ensure_s = 0.0  # ... of it, that pass's expert reads (counters.ensure_s)
        self._masses: deque = deque()  # routing mass of each built step, read with its token
        # chunk sizes of prefills that may be stopped (prefill_stop.py): the speed is kept
        self._sizer = ChunkSizer(len(sm.blocks))
        # speculation's measured costs and running acceptance, kept across turns
        # (engine/spec/loop.py: `SpecMemory`)
        self.spec_memory = None
        if k is not None:
            self.set_k(k)
        self.prefill_k = prefill_k

    # ------------------------------------------------------------------ K
    @property
    def k(self) -> int:
        """The live K: what the next decoded token uses."""
        return self._k

    @k.setter
    def k(self, k: int) -> None:
        self.set_k(k)

    @property
    def prefill_k(self) -> int | None:
        return self._prefill_k

    @prefill_k.setter
    def prefill_k(self, k: int | None) -> None:
        if k is not None:
            check_k(k, self.sm.index.num_experts, "prefill K")
        self._prefill_k = k

    def set_k(self, k: int) -> None:
        """Thread-safe; takes effect from the next token."""
        check_k(k, self.sm.index.num_experts, "K")
        self._k = int(k)

    def _use_k(self, k: int) -> None:
        if k != self._applied:
            self.sm.set_k(k)
            self._applied = k

    @property
    def paused_s(self) -> float:
        """Time prefill passes spent in their pauses so far (another pass ran inside)."""
        return self._paused_s

    @contextmanager
    def outside_prefill(self) -> Iterator[None]:
        """Run another forward pass at a MoE layer boundary of the prefill chunk being
        computed (a batch's rows' decode step inside a joining chunk: batch.py): the
        model-wide state of the chunk's pass (the stop gate, the trace's pass, the K, the
        routing mass noted so far) is set aside for it and put back after, so each pass
        sees its own. The chunk's hidden state up to this layer is already evaluated (the
        gate asks after the layer's router is), so nothing of it waits on the other pass."""
        sm = self.sm
        gate = sm.prefill_gate
        held = (gate.check, gate.frozen_too, gate.chunk, gate.chunk_tokens)
        gate.check, gate.chunk, gate.chunk_tokens = None, None, 0
        routing = sm.cache.routing
        trace = routing.suspend() if routing is not None else None
        mass = sm.routing_mass.stash() if sm.routing_mass is not None else None
        k = self._applied
        try:
            yield
        finally:
            gate.check, gate.frozen_too, gate.chunk, gate.chunk_tokens = held
            if routing is not None:
                routing.resume(trace)
            if sm.routing_mass is not None:
                sm.routing_mass.unstash(mass)
            if k is not None:
                self._use_k(k)

    # ------------------------------------------------------------------ generation
    def make_cache(self) -> list:
        from mlx_lm.models.cache import make_prompt_cache

        return make_prompt_cache(self.sm.model)

    def close(self) -> None:
        self.sm.close()

    def generate(self, prompt: Sequence[int], **kwargs) -> GenerationResult:
        """`stream` run to the end; its `Done` result."""
        for event in self.stream(prompt, **kwargs):
            if isinstance(event, Done):
                return event.result
        raise AssertionError("Runner.stream ended without Done")  # pragma: no cover

    def stream(
        self,
        prompt: Sequence[int],
        *,
        max_tokens: int = 256,
        sampler: Callable[[mx.array], mx.array] | None = None,
        cache: list | None = None,
        reused_tokens: int = 0,
        should_stop: Callable[[], bool] | None = None,
        logits_processors: Sequence[Callable[[mx.array, mx.array], mx.array]] = (),
        speculate: Speculation | None = None,
        draft_reference: Sequence[int] = (),
        draft_also: Sequence[Sequence[int]] = (),
    ) -> Iterator[RunnerEvent]:
        """Generate from `prompt`; `cache` (if given) already holds `prompt[:reused_tokens]`.
        `logits_processors`: mlx-lm's (tokens so far, logits) -> logits (penalties).
        `speculate`: draft and verify several tokens per pass (engine/spec; greedy output
        unchanged); `draft_reference`: the oracle's tokens (a previous greedy run),
        `draft_also`: other runs' tokens it may draft from once the reply leaves it.
        `should_stop` (None: nothing stops this turn) is asked between tokens and, during
        prefill, at every MoE layer (`begin`).

        Yields PrefillProgress while prefilling, a TokenEvent per token, and Done last
        (also when `should_stop` cut the turn short)."""
        from ssdmoe_tui.engine.run.sampling import greedy

        sampler = sampler or greedy()
        begun = yield from self.begin(
            prompt,
            max_tokens=max_tokens,
            sampler=sampler,
            cache=cache,
            reused_tokens=reused_tokens,
            should_stop=should_stop,
            logits_processors=logits_processors,
        )
        detok = self.sm.tokenizer.detokenizer
        tokens: list[int] = []
        if begun.token is None:
            finish, fed_generated = "cancelled", 0
        elif speculate is not None and speculate.on and not auto_stands_down(speculate):
            from ssdmoe_tui.engine.spec.loop import spec_loop

            finish, fed_generated = yield from spec_loop(
                self, begun, sampler, tokens, detok, max_tokens, should_stop or _never,
                speculate, draft_reference, draft_also,
            )  # fmt: skip
        else:
            finish, fed_generated = yield from self._decode_loop(
                begun,
                self._decode_step(begun, sampler),
                tokens,
                detok,
                max_tokens,
                should_stop or _never,
            )
        yield Done(self.finish(begun, tokens, detok, finish, fed_generated))

    def _decode_step(
        self, begun: Begun, sampler: Callable[[mx.array], mx.array]
    ) -> Callable[[mx.array], mx.array]:
        """One decode step of `begun`'s sequence: its next token's sample, lazily."""
        model, cache = self.sm.model, begun.cache
        if begun.window is not None:
            return _processed_step(model, cache, sampler, begun.window)

        def step(inp: mx.array) -> mx.array:
            logits = model(inp[None], cache=cache)[:, -1, :]
            logprobs = logits - mx.logsumexp(logits, keepdims=True)
            return sampler(logprobs)

        return step

    def _decode_loop(
        self,
        begun: Begun,
        step: Callable[[mx.array], mx.array],
        tokens: list[int],
        detok,  # noqa: ANN001 - mlx-lm's streaming detokenizer
        max_tokens: int,
        should_stop: Callable[[], bool],
    ) -> Generator[TokenEvent, None, tuple[str, int]]:
        """The hot path: a TokenEvent per token from `begun.token` on, appending each to
        `tokens`; returns (finish reason, generated tokens the KV cache holds). The whole
        per-token loop stays in this one frame (no helper call per token beyond these)."""
        sm, stats, start = self.sm, begun.stats, begun.start
        eos = self.eos_ids()
        finish = "length"
        fed_generated = 0  # generated tokens the KV cache holds
        tok = begun.token
        dstart = Snapshot.take(sm)
        pending: tuple[mx.array, int] | None = None  # a step already scheduled
        while True:
            event = token_event(tok, tokens, eos, detok, stats, dstart.t)
            yield event
            if event.stop:
                finish = "stop"
            if finish == "stop" or len(tokens) >= max_tokens:
                break
            if should_stop():
                finish = "cancelled"
                break
            if pending is None:
                y, k_tok = self._schedule(step, mx.array([tok], dtype=mx.uint32))
            else:
                y, k_tok = pending
                pending = None
            fed_generated += 1
            if len(tokens) + 1 < max_tokens and self._can_pipeline():
                # Every layer's experts are resident for good, so no layer syncs:
                # build the next step on this one's lazy output while it computes,
                # as mlx-lm does. A K change then lands one token later.
                pending = self._schedule(step, y)
                mx.async_eval(pending[0])
            tok = int(y.item())
            stats.k_per_token.append(k_tok)
            self._record_mass(stats)
            now = Snapshot.take(sm, live=True)
            _decode(stats, now - dstart)
            _totals(stats, now - start)  # live turn totals for the UI
        if pending is not None:
            fed_generated += 1  # scheduled on the last token: the cache holds it too
        stats.decode_s = time.perf_counter() - dstart.t
        _decode(stats, Snapshot.take(sm) - dstart)
        self._masses.clear()
        return finish, fed_generated

    def window_figures(
        self, stats: TurnStats, decode_start: Snapshot, turn_start: Snapshot, live: bool = True
    ) -> None:
        """The decode window's and the turn's figures, as of now (`live`: Snapshot.take's)."""
        now = Snapshot.take(self.sm, live=live)
        _decode(stats, now - decode_start)
        _totals(stats, now - turn_start)

    def eos_ids(self) -> set[int]:
        return set(getattr(self.sm.tokenizer, "eos_token_ids", []) or [])

    def begin(
        self,
        prompt: Sequence[int],
        *,
        max_tokens: int,
        sampler: Callable[[mx.array], mx.array],
        cache: list | None = None,
        reused_tokens: int = 0,
        should_stop: Callable[[], bool] | None = None,
        k: int | None = None,
        reset_peaks: bool = True,
        logits_processors: Sequence[Callable[[mx.array, mx.array], mx.array]] = (),
        chunk_cap: Callable[[], int | None] | None = None,
        pauser: Callable[[], Pause | None] | None = None,
    ) -> Generator[PrefillProgress, None, Begun]:
        """Prefill (prefill K, mlx-lm's chunking) and sample the first token, which
        processes the last prompt token: what every sequence does before decoding, alone
        (`stream`) or in a batch (`engine/run/batch.py`). Yields PrefillProgress after each
        chunk, so a batch can run its decode steps between them; returns `Begun`.
        `k`: this sequence's K (None: the live `self.k`), used when no prefill K is set.
        A `should_stop` makes the prefill stoppable within about a second: its chunks are
        sized by measured speed and asked at every MoE layer (prefill_stop.py); without
        one the chunks are the configured prefill step, as mlx-lm's. `chunk_cap` (asked
        before each chunk; None: no cap) bounds a chunk further: a batch caps a joining
        sequence's chunks while other rows decode, so each stalls them a bounded time.
        `pauser` (asked before each chunk and the first token's pass) may give a `Pause`,
        whose `run` the pass calls at each MoE layer boundary (a batch runs its rows'
        decode step there, within `outside_prefill`, once they have waited long enough: a
        chunk then stalls them about a layer's work, not its own); its time is not counted
        as the chunk's."""
        sm = self.sm
        check_context(len(prompt), max_context(sm.config))  # before any prefill
        if cache is None:
            cache = self.make_cache()
            reused_tokens = 0
        stats = TurnStats(prompt_tokens=len(prompt), reused_tokens=reused_tokens)
        if sm.routing_mass is not None:
            stats.mass_log = MassLog(sm.trained_k)
        todo = mx.array(list(prompt[reused_tokens:]), dtype=mx.uint32)
        if todo.size == 0:
            raise ValueError("nothing to prefill: at least one prompt token must be new")
        if reset_peaks:
            mx.reset_peak_memory()
            iostats.reset_peak_rss()
        self._masses.clear()
        start = Snapshot.take(sm)
        prefill_k = self.prefill_k or (self.k if k is None else k)

        done = yield from self._prefill_chunks(
            todo, cache, prefill_k, reused_tokens, len(prompt), should_stop, chunk_cap, pauser
        )
        last = todo[done:]
        begun = Begun(list(prompt), cache, stats, start, reused_tokens, done)
        if logits_processors:
            begun.window = LogitsWindow(logits_processors, prompt[: len(prompt) - int(last.size)])
        if (should_stop is not None and should_stop()) or max_tokens <= 0:
            stats.prefill_s = time.perf_counter() - start.t
            stats.prefill_peak_memory_bytes = int(mx.get_peak_memory())
            return begun
        pause = self._pause_for(pauser)
        self._first_token(begun, last, sampler, prefill_k, pause.run if pause else None)
        yield PrefillProgress(len(prompt), len(prompt))
        return begun

    def _prefill_chunks(
        self,
        todo: mx.array,
        cache: list,
        prefill_k: int,
        reused: int,
        prompt_len: int,
        should_stop: Callable[[], bool] | None,
        chunk_cap: Callable[[], int | None] | None = None,
        pauser: Callable[[], Pause | None] | None = None,
    ) -> Generator[PrefillProgress, None, int]:
        """Prefill `todo` at prefill K with mlx-lm's chunking (sized by speed and stopped
        between layers when `should_stop` is given), leaving the last token for the first
        step; a PrefillProgress before and after each chunk. Returns the tokens prefilled
        (fewer when `should_stop` cut it short: whole chunks, a part-done one undone)."""
        sm = self.sm
        self._use_k(prefill_k)
        total = int(todo.size)
        done = 0
        yield PrefillProgress(reused, prompt_len)
        # a distributed launch keeps fixed chunks: its ranks must run the same ones
        stoppable = should_stop is not None and sm.distributed is None
        sizer = self._sizer if stoppable else None
        gate_stop = should_stop if stoppable else None
        index = 0  # the chunk's place in this prefill (PrefillGate.chunk)
        while total - done > 1:
            step = self.prefill_step_size if sizer is None else sizer.size(self.prefill_step_size)
            cap = chunk_cap() if chunk_cap is not None else None
            n = min(step, total - done - 1, cap or step)
            self._use_k(prefill_k)  # a batch may have run another K since the last chunk
            t0, ensure0 = time.perf_counter(), sm.cache.counters.ensure_s
            frozen_too = sizer is None or sizer.frozen_must_ask(n)
            span = (reused + done, prompt_len - 1)
            chunk = todo[done : done + n]
            pause = self._pause_for(pauser)
            if pause is not None:
                # frozen layers sync to pause only where the chunk may outlast the budget
                expected = sizer.expected_s(n) if sizer is not None else None
                frozen_too = frozen_too or expected is None or expected > pause.budget_s
            paused0, paused_ensure0 = self._paused_s, self._paused_ensure_s
            run = pause.run if pause is not None else None
            if not self._prefill_chunk(chunk, cache, gate_stop, frozen_too, index, span, run):
                break
            index += 1
            if sizer is not None:  # the chunk's own compute: its reads and pauses left out
                ensure_s = sm.cache.counters.ensure_s - ensure0
                ensure_s -= self._paused_ensure_s - paused_ensure0
                paused = self._paused_s - paused0
                sizer.measure(n, time.perf_counter() - t0 - ensure_s - paused)
            done += n
            yield PrefillProgress(reused + done, prompt_len)
            mx.clear_cache()
            if should_stop is not None and should_stop():
                break
        return done

    def _prefill_chunk(
        self,
        chunk: mx.array,
        cache: list,
        should_stop: Callable[[], bool] | None,
        frozen_too: bool = True,
        index: int = 0,
        span: tuple[int, int] | None = None,
        pause: Callable[[], None] | None = None,
    ) -> bool:
        """One chunk's forward pass into `cache`; with `should_stop`, asked at every MoE
        layer (`PrefillGate`), which is also told the chunk's `index` in its prefill.
        `span`: the chunk's first prompt position and the prompt's prefill tokens (a
        trace-routed run routes a chunk shorter than both prompts token by token).
        `pause`: called at every MoE layer that syncs (`begin`'s `pauser`; a frozen layer
        where `frozen_too`). False: it stopped part-way and the cache is as before."""
        sm = self.sm
        routing = sm.cache.routing  # trace-driven: a one-token chunk is still prefill
        undo = None
        check = None
        if should_stop is not None and ChunkUndo.possible(cache, int(chunk.size)):
            undo = ChunkUndo(cache)
            check = should_stop
        if pause is not None:
            check = self._pausing(pause, check)
        if check is not None:
            sm.prefill_gate.check = check
            sm.prefill_gate.frozen_too = frozen_too
        sm.prefill_gate.chunk, sm.prefill_gate.chunk_tokens = index, int(chunk.size)
        if routing is not None:
            routing.prefill_chunk = True
            routing.prefill_span = span
        try:
            sm.model(chunk[None], cache=cache)
            mx.eval([c.state for c in cache])
        except PrefillStopped:
            undo.restore()
            mx.clear_cache()
            return False
        finally:
            sm.prefill_gate.check = None
            sm.prefill_gate.chunk, sm.prefill_gate.chunk_tokens = None, 0
            if routing is not None:
                routing.prefill_chunk = False
                routing.prefill_span = None
        return True

    def _pausing(
        self, pause: Callable[[], None], stop: Callable[[], bool] | None
    ) -> Callable[[], bool]:
        """The gate's check for a chunk that may pause: a stop first (a cancelled chunk
        does not wait on another pass), then `pause` (its time and reads kept apart in
        `_paused_s` / `_paused_ensure_s`), then the stop again (False without one)."""
        counters = self.sm.cache.counters

        def check() -> bool:
            if stop is not None and stop():
                return True
            t0, ensure0 = time.perf_counter(), counters.ensure_s
            try:
                pause()
            finally:
                self._paused_s += time.perf_counter() - t0
                self._paused_ensure_s += counters.ensure_s - ensure0
            return stop() if stop is not None else False

        return check

    def _pause_for(self, pauser: Callable[[], Pause | None] | None) -> Pause | None:
        """`pauser`'s answer for the next pass (a distributed launch never pauses: its
        ranks must run the same passes)."""
        return pauser() if pauser is not None and self.sm.distributed is None else None

    def _first_token(
        self,
        begun: Begun,
        last: mx.array,
        sampler: Callable[[mx.array], mx.array],
        prefill_k: int,
        pause: Callable[[], None] | None = None,
    ) -> None:
        """Sample `begun.token`: the step that processes the last prompt token, which
        ends prefill (at prefill K); closes the prefill's figures. `pause`: as a chunk's
        (`_prefill_chunk`), at its layers that sync (a streamed layer's one token may
        read K experts from disk; a frozen layer's is quick)."""
        sm, stats = self.sm, begun.stats
        self._use_k(prefill_k)
        if sm.routing_mass is not None:
            sm.routing_mass.clear()  # a one-token prefill chunk is not a generated token
        if pause is not None:
            sm.prefill_gate.check = self._pausing(pause, None)
            sm.prefill_gate.frozen_too = False
        try:
            logits = sm.model(last[None], cache=begun.cache)[:, -1, :]
            if begun.window is not None:
                logits = begun.window(last, logits)
            y = sampler(logits - mx.logsumexp(logits, keepdims=True))
            self._queue_mass()
            begun.token = int(y.item())
        finally:
            sm.prefill_gate.check = None
        stats.k_per_token.append(sm.times.last_k)
        self._record_mass(stats)
        stats.prefill_s = time.perf_counter() - begun.start.t
        stats.prefill_peak_memory_bytes = int(mx.get_peak_memory())
        _totals(stats, Snapshot.take(sm) - begun.start)

    def finish(
        self, begun: Begun, tokens: list[int], detok, finish: str, fed_generated: int
    ) -> GenerationResult:
        """The turn's result once its last token is out (alone or in a batch)."""
        sm, stats = self.sm, begun.stats
        stats.k_per_token = stats.k_per_token[: len(tokens)]
        if stats.mass_log is not None:
            stats.mass_log.truncate(len(tokens))
        detok.finalize()
        if begun.decode_share is None:  # alone: totals over the whole turn
            _totals(stats, Snapshot.take(sm) - begun.start)
        stats.peak_memory_bytes = int(mx.get_peak_memory())
        stats.peak_rss_bytes = iostats.peak_rss_bytes() or 0
        covered = len(begun.prompt) if tokens else begun.reused + begun.done
        return GenerationResult(
            begun.prompt,
            tokens,
            detok.text,
            finish,
            stats,
            begun.cache,
            covered,
            fed_generated,
            begun.decode_share,
        )

    def _schedule(self, step, inp: mx.array) -> tuple[mx.array, int]:
        """Apply a K change, build (and, where a layer must sync, run) one decode step."""
        self._use_k(self.k)
        self.sm.cache.step()
        y = step(inp)
        self._queue_mass()
        return y, self.sm.times.last_k

    def _queue_mass(self) -> None:
        """Keep the routing mass of the step just built, to read with its token."""
        meter = self.sm.routing_mass
        self._masses.append(meter.take_pending() if meter is not None else None)

    def _record_mass(self, stats: TurnStats) -> None:
        """Its token's mass, unresolved: no `.item()` here, so the next step queued
        behind this one is never waited for (readers resolve many tokens at once)."""
        m = self._masses.popleft() if self._masses else None
        if stats.mass_log is not None:
            stats.mass_log.append(m)

    def _can_pipeline(self) -> bool:
        cache = self.sm.cache
        return cache.all_frozen and cache.on_route is None and not self.sm.prefetch

    # ------------------------------------------------------------------ reporting
    def conditions(self) -> dict:
        """What a measurement runs under: K, prefill K, reader, slot placement, expert
        source, cache budget, slots and policy, routing, dtype (stats, bench, server)."""
        sm = self.sm
        cache = sm.cache
        out = {
            "k": self.k,
            "prefill_k": self.prefill_k or self.k,
            "reader": cache.reader.name,
            "slot_placement": cache.placement.placement,
            "expert_source": sm.expert_source,
            "expert_cache_budget_bytes": cache.budget_bytes,
            "expert_cache_slots": cache.capacity,
            "policy": cache.policy_name,
            "dtype": str(sm.dtype).removeprefix("mlx.core."),
        }
        out.update(cache.routing.summary() if cache.routing is not None else {"routing": "model"})
        return out

    def stats_dict(self, stats: TurnStats) -> dict:
        """A turn's figures plus the engine's conditions, as `generate --json`, the
        service's GenerationDone and the server report them (one place)."""
        sm = self.sm
        c = sm.cache.counters
        out = {**stats.as_dict(), **self.conditions()}
        if sm.prefetch:  # engine-lifetime figures (the cache counts them since the load)
            out["prefetch"] = prefetch_figures(
                Snapshot(
                    misses=c.misses,
                    prefetch_issued=c.prefetch_issued,
                    prefetch_used=c.prefetch_used,
                    prefetch_wait_s=c.prefetch_wait_s,
                    prefetch_dropped=c.prefetch_dropped,
                )
            )
        return out


def auto_stands_down(spec: Speculation) -> bool:
    """`--speculate auto` drafts nothing on MLX-CUDA: there a verify chunk of d + 1
    tokens runs other kernels than a one-token step, and the H200 run of 2026-12-02 saw
    its first position disagree with greedy decode in every round (random weights;
    docs/engine.md, "Speculative decoding"), so drafting would change greedy output.
    An explicit mode (ngram, oracle) still drafts there, as asked: it is documented as
    inexact on MLX-CUDA. With `--exact-verify` the chunk computes decode's shapes
    (engine/spec/exact.py), so auto drafts there too."""
    if spec.mode != "auto" or spec.exact:
        return False
    from ssdmoe_tui.engine.experts.device_memory import is_cuda

    return is_cuda()


def _never() -> bool:
    return False


PROCESSOR_WINDOW = 256  # tokens the logits processors see (mlx-lm's penalties look at 20)


class LogitsWindow:
    """mlx-lm's logits processors (penalties) and the tokens they see: the prompt, then
    each fed token, lazily as mlx-lm does. One per sequence (alone or a batch row)."""

    size = PROCESSOR_WINDOW

    def __init__(self, processors, before: Sequence[int]) -> None:  # noqa: ANN001
        self.processors = list(processors)
        self.seen = mx.array(list(before[-PROCESSOR_WINDOW:]), dtype=mx.uint32)

    def __call__(self, inp: mx.array, logits: mx.array) -> mx.array:
        self.seen = mx.concatenate([self.seen, inp.astype(mx.uint32)])[-PROCESSOR_WINDOW:]
        for p in self.processors:
            logits = p(self.seen, logits)
        return logits


def _processed_step(model, cache, sampler, window: LogitsWindow):  # noqa: ANN001, ANN202
    """The decode step with logits processors between the model and the sampler."""

    def step(inp: mx.array) -> mx.array:
        logits = model(inp[None], cache=cache)[:, -1, :]
        logits = window(inp, logits)
        logprobs = logits - mx.logsumexp(logits, keepdims=True)
        return sampler(logprobs)

    return step


def _totals(stats: TurnStats, d: Snapshot) -> None:
    stats.hits, stats.misses, stats.requested_bytes = d.hits, d.misses, d.bytes_read
    stats.read_s, stats.router_sync_s, stats.device_bytes = (
        d.read_s,
        d.router_sync_s,
        d.device_bytes,
    )


def _decode(stats: TurnStats, d: Snapshot) -> None:
    stats.decode_hits, stats.decode_misses = d.hits, d.misses
    stats.decode_requested_bytes = d.bytes_read
    stats.decode_device_bytes = d.device_bytes

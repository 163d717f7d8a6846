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
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import mlx.core as mx

from ssdmoe_tui.engine import iostats
from ssdmoe_tui.engine.loader import StreamedModel


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
    peak_rss_bytes: int = 0
    k_per_token: list[int] = field(default_factory=list)
    # router mass kept at the running K vs the trained K, per generated token (routing_mass.py)
    mass_per_token: list[float] = field(default_factory=list)

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

    @property
    def covered_tokens(self) -> list[int]:
        """Exactly the tokens the KV cache holds."""
        return self.prompt_tokens[: self.covered_prompt] + self.tokens[: self.covered_generated]


class _Meter:
    """Snapshot of engine counters, to attribute work to phases."""

    def __init__(self, sm: StreamedModel) -> None:
        c = sm.cache.counters
        self.hits, self.misses, self.bytes, self.read_s = c.hits, c.misses, c.bytes_read, c.read_s
        self.sync_s = sm.times.router_sync_s
        self.dev = iostats.device_read_bytes()


def _delta(sm: StreamedModel, m: _Meter) -> tuple[int, int, int, float, float, int | None]:
    c = sm.cache.counters
    dev_now = iostats.device_read_bytes()
    dev = dev_now - m.dev if (dev_now is not None and m.dev is not None) else None
    return (
        c.hits - m.hits,
        c.misses - m.misses,
        c.bytes_read - m.bytes,
        c.read_s - m.read_s,
        sm.times.router_sync_s - m.sync_s,
        dev,
    )


def auto_prefill_step(sm: StreamedModel, available_bytes: int | None = None) -> int:
    """Prefill chunk from memory: mlx-lm's 2048 (so long prompts chunk as in mlx-lm) when
    a tenth of free memory holds that chunk's activations, else the largest power of two
    that fits (min 32). Bigger chunks read each expert once for more tokens."""
    from ssdmoe_tui.engine.cache import available_memory_bytes

    cfg = sm.config.get("text_config", sm.config)
    hidden = int(cfg.get("hidden_size", 4096))
    inter = int(cfg.get("moe_intermediate_size", cfg.get("intermediate_size", 4 * hidden)))
    k = max(sm.trained_k, 1)
    act = sm.dtype.size
    # the sorted expert inputs, gate/up/down intermediates and the layer's residuals
    per_token = (hidden * (k + 6) + inter * k * 3) * act * 2
    avail = available_memory_bytes() if available_bytes is None else available_bytes
    step = 2048
    while step > 32 and step * per_token > avail // 10:
        step //= 2
    return step


class Runner:
    def __init__(self, sm: StreamedModel, prefill_step_size: int | None = None) -> None:
        self.sm = sm
        self.prefill_step_size = prefill_step_size or auto_prefill_step(sm)
        self.k = sm.trained_k
        self.prefill_k: int | None = None  # None: same as k
        self._pending_k: int | None = None
        self._masses: deque = deque()  # routing mass of each built step, read with its token

    def request_k(self, k: int) -> None:
        """Thread-safe: takes effect before the next token."""
        if not 1 <= k <= self.sm.index.num_experts:
            from ssdmoe_tui.errors import BadValueError

            raise BadValueError(f"K={k} is outside 1..{self.sm.index.num_experts}")
        self._pending_k = k

    def _apply_pending_k(self) -> None:
        k = self._pending_k
        if k is not None:
            self._pending_k = None
            self.k = k
            self.sm.set_k(k)

    def make_cache(self) -> list:
        from mlx_lm.models.cache import make_prompt_cache

        return make_prompt_cache(self.sm.model)

    def generate(
        self,
        prompt: Sequence[int],
        *,
        max_tokens: int = 256,
        sampler: Callable[[mx.array], mx.array] | None = None,
        cache: list | None = None,
        reused_tokens: int = 0,
        on_token: Callable[[int, str, TurnStats], None] | None = None,
        on_prefill: Callable[[int, int], None] | None = None,
        should_stop: Callable[[], bool] = lambda: False,
    ) -> GenerationResult:
        """Generate from `prompt`; `cache` (if given) already holds `prompt[:reused_tokens]`."""
        from mlx_lm.sample_utils import make_sampler

        sm = self.sm
        model = sm.model
        sampler = sampler or make_sampler(0.0)
        tokenizer = sm.tokenizer
        eos = set(getattr(tokenizer, "eos_token_ids", []) or [])
        if cache is None:
            cache = self.make_cache()
            reused_tokens = 0
        stats = TurnStats(prompt_tokens=len(prompt), reused_tokens=reused_tokens)
        todo = mx.array(list(prompt[reused_tokens:]), dtype=mx.uint32)
        if todo.size == 0:
            raise ValueError("nothing to prefill: at least one prompt token must be new")
        mx.reset_peak_memory()
        iostats.reset_peak_rss()
        self._masses.clear()
        meter = _Meter(sm)
        t0 = time.perf_counter()

        # ---- prefill (prefill K), mlx-lm's chunking: leave the last token for the first step
        self._apply_pending_k()
        sm.set_k(self.prefill_k or self.k)
        total = int(todo.size)
        done = 0
        if on_prefill:
            on_prefill(reused_tokens, len(prompt))
        while total - done > 1:
            n = min(self.prefill_step_size, total - done - 1)
            model(todo[done : done + n][None], cache=cache)
            mx.eval([c.state for c in cache])
            done += n
            if on_prefill:
                on_prefill(reused_tokens + done, len(prompt))
            mx.clear_cache()
            if should_stop():
                break
        last = todo[done:]

        def step(inp: mx.array) -> mx.array:
            logits = model(inp[None], cache=cache)[:, -1, :]
            logprobs = logits - mx.logsumexp(logits, keepdims=True)
            return sampler(logprobs)

        # The first sampled token ends prefill (it processes the last prompt token).
        tokens: list[int] = []
        finish = "length"
        detok = tokenizer.detokenizer
        detok.reset()
        cancelled = should_stop()
        fed_generated = 0  # generated tokens the KV cache holds
        if not cancelled and max_tokens > 0:
            sm.set_k(self.k if (self.prefill_k is None) else self.prefill_k)
            if sm.routing_mass is not None:
                sm.routing_mass.clear()  # a one-token prefill chunk is not a generated token
            y = step(last)
            self._queue_mass()
            tok = int(y.item())
            stats.k_per_token.append(sm.times.last_k)
            self._record_mass(stats)
            t1 = time.perf_counter()
            stats.prefill_s = t1 - t0
            self._update_totals(stats, meter)
            if on_prefill:
                on_prefill(len(prompt), len(prompt))
            dmeter = _Meter(sm)
            tdec = time.perf_counter()
            pending: tuple[mx.array, int] | None = None  # a step already scheduled
            while True:
                tokens.append(tok)
                if tok in eos:
                    finish = "stop"
                    piece = ""
                else:
                    detok.add_token(tok)
                    piece = detok.last_segment
                stats.generated_tokens = len(tokens)
                stats.decode_s = time.perf_counter() - tdec
                if on_token:
                    on_token(tok, piece, stats)
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
                self._update_decode(stats, dmeter)
                self._update_totals(stats, meter)  # live turn totals for the UI
            if pending is not None:
                fed_generated += 1  # scheduled on the last token: the cache holds it too
            stats.decode_s = time.perf_counter() - tdec
            self._update_decode(stats, dmeter)
            stats.k_per_token = stats.k_per_token[: len(tokens)]
            stats.mass_per_token = stats.mass_per_token[: len(tokens)]
            self._masses.clear()
        else:
            finish = "cancelled"
            stats.prefill_s = time.perf_counter() - t0
        detok.finalize()
        text = detok.text
        # totals over the whole turn
        self._update_totals(stats, meter)
        stats.peak_memory_bytes = int(mx.get_peak_memory())
        stats.peak_rss_bytes = iostats.peak_rss_bytes() or 0
        covered = len(prompt) if tokens else reused_tokens + done
        return GenerationResult(
            list(prompt), tokens, text, finish, stats, cache, covered, fed_generated
        )

    def _schedule(self, step, inp: mx.array) -> tuple[mx.array, int]:
        """Apply a pending K, build (and, where a layer must sync, run) one decode step."""
        self._apply_pending_k()
        self.sm.set_k(self.k)
        self.sm.cache.step()
        y = step(inp)
        self._queue_mass()
        return y, self.sm.times.last_k

    def _queue_mass(self) -> None:
        """Keep the routing mass of the step just built, to read with its token."""
        meter = self.sm.routing_mass
        self._masses.append(meter.take() if meter is not None else None)

    def _record_mass(self, stats: TurnStats) -> None:
        m = self._masses.popleft() if self._masses else None
        if m is not None:
            stats.mass_per_token.append(float(m.mean().item()))

    def _can_pipeline(self) -> bool:
        cache = self.sm.cache
        return cache.all_frozen and cache.on_route is None and not self.sm.prefetch

    def _update_totals(self, stats: TurnStats, m: _Meter) -> None:
        h, mi, b, rs, ss, dev = _delta(self.sm, m)
        stats.hits, stats.misses, stats.requested_bytes = h, mi, b
        stats.read_s, stats.router_sync_s, stats.device_bytes = rs, ss, dev

    def _update_decode(self, stats: TurnStats, m: _Meter) -> None:
        h, mi, b, _, _, dev = _delta(self.sm, m)
        stats.decode_hits, stats.decode_misses = h, mi
        stats.decode_requested_bytes = b
        stats.decode_device_bytes = dev

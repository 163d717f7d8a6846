"""`ssdmoe bench`: tokens/s, bytes/token and where the time goes, per (K, expert budget).

One run measures, under recorded conditions:
- every (K, budget) configuration on a fresh engine (so no configuration inherits
  another's expert cache), greedy, a fixed raw prompt, exactly N decoded tokens
  (end-of-sequence ignored so every configuration does the same work);
- the disk: random-read bandwidth of the model's own shards at the model's expert
  piece sizes and the engine's queue depth, which gives each configuration its I/O
  ceiling = bandwidth / (bytes per token x (1 - hit rate));
- plain mlx-lm with the whole model resident (same dtype, prompt, K and greedy
  sampling) when the checkpoint fits in half the memory available, for the ratio.

Decode quantities cover decode steps 2..N: the first token comes out of prefill, so
the decode window is the N-1 steps after it, and tok/s, ms/token and bytes/token are
all per decode step (the same definition for the resident baseline).
"""

from __future__ import annotations

import contextlib
import gc
import json
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from ssdmoe_tui.bench import storage, system, thermal
from ssdmoe_tui.errors import BadValueError, ModelError
from ssdmoe_tui.memory import MemoryLimit, memory_limit
from ssdmoe_tui.options import CacheBudget, EngineOptions, check_k, parse_choice
from ssdmoe_tui.units import human_bytes
from ssdmoe_tui.user_files import MODEL_JSON_MAX, read_regular

if TYPE_CHECKING:
    from ssdmoe_tui.engine.run.runner import Snapshot

SCHEMA_VERSION = 1
PROMPT_TEXT = (
    "Mixture-of-Experts language models route every token to a few experts out of many. "
    "Streaming only the routed experts from a solid state drive lets a laptop run a model "
    "that is larger than its memory, at a speed set by the drive, the cache and the router. "
)
BASELINE_FRACTION = 0.5  # resident baseline only when the checkpoint is below this share

Log = Callable[[str], None]


PREFILL_STEP = 512  # the bench's prefill chunk unless given: the resident baseline uses it too
PREFETCH_MODES = ("off", "on", "both")  # each configuration without / with / both
# the pipelined layer (engine/model/streamed.py): as the engine has it / on / off / off then on
PIPELINE_MODES = ("auto", "on", "off", "both")
BASELINES = ("auto", "skip", "force")


@dataclass
class BenchOptions:
    """What one bench run measures. The engine settings every configuration shares
    (model folder, dtype, reader, experts source, queue depth, policy, routing trace,
    prefill step) are one `EngineOptions`, built at the edge like every other command's;
    K, the expert cache and prefetch vary per configuration, so they live here as the
    lists the run walks (already parsed) and `engine_for` sets them on a copy."""

    engine: EngineOptions  # .model: a resolved local folder
    ks: list[int] = field(default_factory=list)  # empty: trained K, K/2, K/4
    budgets: list[CacheBudget] = field(default_factory=lambda: [CacheBudget()])
    prompt_tokens: int = 512
    decode_tokens: int = 128
    cold: bool = False
    baseline: str = "auto"  # auto | skip | force
    baseline_only: bool = False  # measure the resident baseline alone
    baseline_json: Path | None = None  # reuse a resident baseline measured earlier
    disk_bytes: int = 512 << 20  # per K, for the random-read test
    warmup: bool = True
    seed: int = 0
    prefetch: str = "off"  # off | on | both (each configuration without, then with)
    pipeline: str = "auto"  # auto | on | off | both (serial and on, alternating first)
    distributed: object = None  # engine.distributed.Distributed: expert-parallel ranks
    quality_text: Path | None = None  # also score this text at each K (bench/quality.py)
    quality_tokens: int = 512
    batch: list[int] = field(default_factory=list)  # also B sequences together (bench/batch.py)
    batch_check: bool = False  # with batch: run each row alone again and compare tokens
    batch_join: int = 0  # with batch: then an N-token prompt joins the rows (its stall)
    fit: Path | None = None  # also B, a lower-bit copy, resident in mlx-lm (bench/fit.py)

    def __post_init__(self) -> None:
        # Programmatic callers get the checks the CLI's argument types make.
        self.budgets = [CacheBudget.parse(b) for b in self.budgets]
        if self.engine.prefill_step is None:
            self.engine = self.engine.with_(prefill_step=PREFILL_STEP)
        if self.decode_tokens < 2:
            raise BadValueError(f"--decode-tokens must be >= 2, got {self.decode_tokens}")
        parse_choice(self.baseline, BASELINES, "--baseline")
        parse_choice(self.prefetch, PREFETCH_MODES, "--prefetch")
        parse_choice(self.pipeline, PIPELINE_MODES, "--pipeline")

    @property
    def root(self) -> bool:
        """Rank 0 (or the only process): measures the disk and the baseline, reports."""
        return self.distributed is None or self.distributed.is_root

    def engine_for(self, k: int, budget: CacheBudget, prefetch: bool = False) -> EngineOptions:
        """The options of one (K, budget, prefetch) configuration."""
        return self.engine.with_(k=k, expert_cache=budget, prefetch=prefetch)


def fixed_prompt(tokenizer, n: int) -> list[int]:
    """N deterministic token ids: a fixed text repeated, tokenized raw (no template)."""
    if n < 1:
        raise BadValueError(f"--prompt-tokens must be >= 1, got {n}")
    text = PROMPT_TEXT
    ids = list(tokenizer.encode(text))
    if not ids:
        raise ModelError("the tokenizer encodes the benchmark prompt to no tokens")
    while len(ids) < n:
        text += PROMPT_TEXT
        ids = list(tokenizer.encode(text))
    return ids[:n]


def default_ks(trained_k: int, num_experts: int) -> list[int]:
    out: list[int] = []
    for k in (trained_k, trained_k // 2, trained_k // 4):
        k = min(max(k, 1), num_experts)
        if k not in out:
            out.append(k)
    return out


def _shard_paths(path: Path, index) -> list[Path]:
    return [path / s for s in index.shards]


def _checkpoint_bytes(path: Path, index) -> int:
    return sum((path / s).stat().st_size for s in index.shards)


def _quantization(config: dict) -> dict | None:
    q = config.get("quantization")
    if not isinstance(q, dict):
        return None
    return {k: q[k] for k in ("bits", "group_size", "mode") if k in q} or None


def _split(w: Snapshot, steps: int) -> dict:
    """ms per step: router sync + read wait + cache bookkeeping + rest = total.

    Cache bookkeeping is the time the cache spent in `ensure` (its own counter) less
    the reads it made there."""
    total = _per_step(w.t * 1e3, steps)
    sync = _per_step(w.router_sync_s * 1e3, steps)
    read = _per_step(w.read_s * 1e3, steps)
    book = _per_step(max(w.ensure_s - w.read_s, 0.0) * 1e3, steps)
    rest = None if total is None else total - (sync or 0.0) - (read or 0.0) - (book or 0.0)
    return {
        "total": _round(total, 3),
        "router_sync": _round(sync, 3),
        "read_wait": _round(read, 3),
        "cache_bookkeeping": _round(book, 3),
        "rest": _round(rest, 3),
    }


def _fmt_split(m: dict) -> str:
    if m["total"] is None:
        return "-"
    return (
        f"{m['total']:.1f} = sync {m['router_sync']:.1f} + read {m['read_wait']:.1f} "
        f"+ cache {m['cache_bookkeeping']:.1f} + rest {m['rest']:.1f}"
    )


def _per_step(x: float | int | None, steps: int) -> float | None:
    return None if x is None or steps <= 0 else x / steps


def _rate(b: int, s: float) -> float | None:
    return b / s if s > 0 and b > 0 else None


def _round(x: float | None, nd: int = 4) -> float | None:
    return None if x is None else round(x, nd)


def _open(
    opts: BenchOptions,
    budget: CacheBudget,
    k: int,
    prefetch: bool = False,
    log: Log = lambda _: None,
):
    """A fresh engine (its Runner) for one (K, budget) configuration; a budget under the
    model's minimum is raised to it and logged (`expert_cache_budget_bytes` has it)."""
    import mlx.core as mx

    from ssdmoe_tui.engine.run.open import open_engine

    # The previous configuration's engine is garbage only once its caller returned (its
    # modules form reference cycles): collect it now, or its arrays count in this
    # configuration's peak memory.
    gc.collect()
    mx.clear_cache()
    return open_engine(
        opts.engine_for(k, budget, prefetch),
        notice=lambda msg: log(f"  note: {msg}"),
        distributed=opts.distributed,
    )


def _close(runner) -> None:
    import mlx.core as mx

    runner.close()
    gc.collect()
    mx.clear_cache()


def run_config(
    opts: BenchOptions,
    k: int,
    budget: CacheBudget,
    prompt: list[int],
    log: Log,
    prefetch: bool = False,
) -> dict:
    """One configuration on a fresh engine; returns its result dict."""
    from ssdmoe_tui.engine.run.sampling import greedy

    t0 = time.perf_counter()
    runner = _open(opts, budget, k, prefetch, log)
    load_s = time.perf_counter() - t0
    sm = runner.sm
    try:
        sm.tokenizer.eos_token_ids = set()  # decode exactly N tokens
        sm.measure_routing_mass()  # read once, after the run: costs the decode nothing
        dist = opts.distributed
        meter = dist.meter(sm) if dist is not None else None
        sampler = greedy()
        if dist is not None:
            sampler = dist.wrap_sampler(sampler)
        run = _measure_run(runner, opts, prompt, sampler, meter)
        out = _config_figures(runner, budget, prefetch, load_s, run)
        if dist is not None:
            from ssdmoe_tui.engine.distributed.stats import summary_line

            out["distributed"] = dist.run_stats(sm, meter, out["decode_steps"])
            log("  " + summary_line(out["distributed"]))
        _log_config(out, k, budget, log)
        return out
    finally:
        _close(runner)


@dataclass
class _MeasuredRun:
    """One greedy run and the engine's counters at its start, first and last token."""

    result: object  # engine.run.runner.GenerationResult
    start: Snapshot
    first: Snapshot
    end: Snapshot
    rss_reset: bool
    decode_cpu_s: float | None = None  # process CPU time (all threads) over the decode window
    # each prefill chunk's tokens and seconds, the first token's step last (its one token)
    chunks: list[tuple[int, float]] = field(default_factory=list)
    # per chunk: its reading seconds, router sync seconds and the process's page faults
    chunk_detail: list[dict] = field(default_factory=list)


def _measure_run(runner, opts: BenchOptions, prompt: list[int], sampler, meter) -> _MeasuredRun:  # noqa: ANN001
    """Stream `opts.decode_tokens` tokens, marking the first and the last one."""
    from ssdmoe_tui.engine.run.runner import Done, PrefillProgress, Snapshot, TokenEvent

    sm = runner.sm
    marks: dict[str, Snapshot] = {}
    cpu: dict[str, float] = {}  # process CPU time at the same marks: on a shared machine
    start = Snapshot.take(sm)
    rss_reset = system.reset_peak_rss()
    result = None
    chunks: list[tuple[int, float]] = []
    detail: list[dict] = []
    # (tokens done, when, counters, page faults) at the prefill's last progress event
    last: tuple[int, float, Snapshot, tuple[int, int] | None] | None = None
    for ev in runner.stream(prompt, max_tokens=opts.decode_tokens, sampler=sampler):
        if isinstance(ev, PrefillProgress):  # one before the first chunk, one after each
            now = time.perf_counter()
            snap, faults = Snapshot.take(sm), system.page_faults()
            if last is not None:
                chunks.append((ev.done - last[0], now - last[1]))
                detail.append(_chunk_detail(snap - last[2], last[3], faults))
            last = (ev.done, now, snap, faults)
        elif isinstance(ev, TokenEvent):
            n = ev.stats.generated_tokens
            if meter is not None:
                meter.on_token(n)
            if n == 1:
                marks["first"] = Snapshot.take(sm)
                cpu["first"] = time.process_time()
            if n == opts.decode_tokens:
                marks["last"] = Snapshot.take(sm)
                cpu["last"] = time.process_time()
        elif isinstance(ev, Done):
            result = ev.result
    end = marks.get("last") or Snapshot.take(sm)
    first = marks.get("first") or end
    cpu_s = cpu["last"] - cpu["first"] if len(cpu) == 2 else None
    return _MeasuredRun(result, start, first, end, rss_reset, cpu_s, chunks, detail)


def _chunk_detail(d, before: tuple[int, int] | None, after: tuple[int, int] | None) -> dict:  # noqa: ANN001 - a Snapshot difference
    """One prefill chunk's reading and router-sync seconds and the process's minor and
    major page faults in it (None where the platform does not count them): whether reads
    into pages moved to the GPU and back pay CPU page faults (page_ahead.py; the
    eleventh session's one-token step after a moved 4k chunk: 0.63 against 0.16 s)."""
    flt = (
        None
        if before is None or after is None
        else [a - b for a, b in zip(after, before, strict=True)]
    )
    return {"read_s": round(d.read_s, 4), "router_sync_s": round(d.router_sync_s, 4), "faults": flt}


def _config_figures(
    runner,  # noqa: ANN001
    budget: CacheBudget,
    prefetch: bool,
    load_s: float,
    run: _MeasuredRun,
) -> dict:
    """A configuration's result dict: its conditions, speeds, reads and memory."""
    from ssdmoe_tui.engine.run.kv_pool import cache_nbytes

    sm, result, rss_reset = runner.sm, run.result, run.rss_reset
    st = result.stats
    pre = run.first - run.start
    dec = run.end - run.first
    steps = max(len(result.tokens) - 1, 0)
    cache = sm.cache
    index = sm.index
    hit_rate = dec.hit_rate
    req_bpt = _per_step(dec.bytes_read, steps)
    dev_bpt = _per_step(dec.device_bytes, steps)
    kv_bytes = cache_nbytes(result.cache)
    bound = int(sm.resident_bytes) + cache.budget_bytes + kv_bytes
    return {
        # k, prefill_k, reader, slot placement, expert source, budget, slots, policy,
        # routing, dtype: the same figures `generate --json` and the app report
        **runner.conditions(),
        "expert_cache": str(budget),
        # the share of all experts the slots hold (slots, not bytes: a slot can be larger
        # than the expert on disk, when its scales widen)
        "budget_over_expert_set": round(cache.capacity / (index.num_experts * index.num_layers), 4),
        "prefetch": prefetch,
        **(_prefetch_stats(dec, steps) if prefetch else {}),
        # the pipelined layer (on a GPU by default, $SSDMOE_PIPELINE); the layer calls it ran
        "pipeline": bool(sm.blocks and getattr(sm.switches[0], "_pipe", False)),
        "pipelined_calls": sm.times.pipelined_calls,
        "staged_calls": sm.times.staged_calls,
        # SSDMOE_PREFILL_STAGE=ahead (prestage.py): calls that used a copy queued a layer
        # early, and the union's experts taken from it / gathered then
        "prestaged_calls": sm.times.prestaged_calls,
        "prestaged_experts": sm.times.prestaged_experts,
        "prestage_missed_experts": sm.times.prestage_missed_experts,
        # pages moved ahead (page_ahead.py: `migrate`, and `auto` on MLX-CUDA host slots):
        # layers whose rows' pages moved to the GPU, and their bytes (None: no page mover)
        **_pages_moved(sm),
        "slot_placement_note": cache.placement.note,
        # `device` placement's mirror (engine/experts/mirror.py), since the load
        "slot_mirror": None
        if cache.mirror is None
        else {
            "rows": cache.mirror.rows,
            "copied_mib": round(cache.mirror.rows * cache.mirror.row_bytes / 2**20, 2),
            "sync_s": round(cache.mirror.seconds, 4),
        },
        "direct_io": cache.reader.direct_active,
        "load_s": round(load_s, 3),
        "prompt_tokens": st.prompt_tokens,
        "generated_tokens": len(result.tokens),
        "decode_steps": steps,
        "prefill_s": round(st.prefill_s, 4),
        # [tokens, seconds] per prefill chunk, the first token's step last: where a long
        # prompt's time goes chunk by chunk (page_ahead.py's first-chunk rule)
        "prefill_chunks_s": [[n, round(t, 4)] for n, t in run.chunks],
        # the same chunks: reading and router-sync seconds, [minor, major] page faults
        "prefill_chunks_detail": run.chunk_detail,
        "prefill_tok_s": round(st.prefill_tok_s, 3),
        "decode_s": round(dec.t, 4),
        # the response apart: prefill (to the first token), decode (the rest), total
        "first_token_s": round((run.first - run.start).t, 4),
        "response_s": round((run.end - run.start).t, 4),
        "decode_tok_s": _round(_per_step(steps, dec.t), 3),
        # CPU time of the whole process (every thread) per decode step: steadier than the
        # wall clock where other work shares the cores; not a speed, a cost
        "decode_cpu_ms_per_token": _round(
            None if run.decode_cpu_s is None else _per_step(run.decode_cpu_s * 1e3, steps), 3
        ),
        "ms_per_token": _split(dec, steps),
        "prefill_ms_per_token": _split(pre, st.prompt_tokens),
        "decode_hits": dec.hits,
        "decode_misses": dec.misses,
        "hit_rate": round(hit_rate, 6),
        "prefill_hit_rate": round(pre.hit_rate, 4),
        "decode_requested_bytes": dec.bytes_read,
        "decode_device_bytes": dec.device_bytes,
        "requested_mib_per_token": _round(None if req_bpt is None else req_bpt / 2**20),
        "device_mib_per_token": _round(None if dev_bpt is None else dev_bpt / 2**20),
        "decode_read_s": round(dec.read_s, 4),
        "decode_read_gb_s": _gb_s(dec),
        "prefill_requested_bytes": pre.bytes_read,
        "prefill_read_s": round(pre.read_s, 4),
        "prefill_read_gb_s": _gb_s(pre),
        "peak_mlx_memory_bytes": int(st.peak_memory_bytes),
        "prefill_peak_mlx_memory_bytes": int(st.prefill_peak_memory_bytes),
        # The memory target: peak within 10% of resident + cache budget + KV.
        "resident_memory_bytes": int(sm.resident_bytes),
        "kv_cache_bytes": kv_bytes,
        "memory_bound_bytes": bound,
        "peak_over_memory_bound": round(st.peak_memory_bytes / bound, 4),
        "peak_rss_bytes": int(st.peak_rss_bytes),
        "peak_rss_scope": "this generation" if rss_reset else "whole process",
        "token_ids": result.tokens,
        # router mass kept at this K vs the trained K, over the decoded tokens
        "routing_mass": None if st.routing_mass is None else round(st.routing_mass, 4),
    }


def _log_config(out: dict, k: int, budget: CacheBudget, log: Log) -> None:
    """A configuration's one summary line."""
    log(
        f"  K={k} budget={budget}: prefill {out['prefill_tok_s']:.1f} tok/s "
        f"[ms/tok {_fmt_split(out['prefill_ms_per_token'])}], "
        f"decode {out['decode_tok_s'] or 0:.2f} tok/s [ms/tok {_fmt_split(out['ms_per_token'])}], "
        f"hit {out['hit_rate']:.1%}, {out['requested_mib_per_token'] or 0:.1f} MiB/token requested"
    )


def _gb_s(w: Snapshot) -> float | None:
    rate = _rate(w.bytes_read, w.read_s)
    return None if rate is None else _round(rate / 1e9)


def _prefetch_stats(dec: Snapshot, steps: int) -> dict:
    """Prediction quality over the decode window (`runner.prefetch_figures`)."""
    from ssdmoe_tui.engine.run.runner import prefetch_figures

    f = prefetch_figures(dec)
    return {
        "prefetch_issued": f["issued"],
        "prefetch_used": f["used"],
        "prefetch_precision": f["precision"],
        "prefetch_recall": f["recall"],
        "prefetch_wait_ms_per_token": _round(_per_step(dec.prefetch_wait_s * 1e3, steps), 3),
        "prefetch_dropped": f["dropped"],
    }


def warmup(opts: BenchOptions, k: int, budget: CacheBudget, log: Log) -> None:
    """Compile kernels on a throwaway engine so no configuration times compilation."""
    from ssdmoe_tui.engine.run.sampling import greedy

    log("warm-up (not timed): 16-token prefill + 4 decoded tokens on a separate engine")
    runner = _open(opts, budget, k)
    try:
        runner.sm.tokenizer.eos_token_ids = set()
        runner.generate(fixed_prompt(runner.sm.tokenizer, 16), max_tokens=4, sampler=greedy())
    finally:
        _close(runner)


def resident_baseline(
    path: Path,
    ks: list[int],
    prompt: list[int],
    decode_tokens: int,
    dtype,
    prefill_step: int,
    log: Log,
) -> dict[int, dict]:
    """Plain mlx-lm, whole model resident: `mlx_lm.load` + cast + `stream_generate`, per K.

    K is set on mlx-lm's own MoE blocks (the attribute the engine sets), so the resident
    model does the same routed work as the streamed one.
    """
    import mlx.core as mx
    import mlx_lm

    from ssdmoe_tui.engine.model.loader import cast_model, set_model_k
    from ssdmoe_tui.engine.run.sampling import greedy

    t0 = time.perf_counter()
    model, tokenizer = mlx_lm.load(str(path))
    cast_model(model, dtype)
    mx.eval(model.parameters())
    load_s = time.perf_counter() - t0
    tokenizer.eos_token_ids = set()
    out: dict[int, dict] = {}
    try:
        # Warm-up, not timed: the first call compiles kernels (minutes under MLX-CUDA's JIT).
        set_model_k(model, ks[0])
        for _ in mlx_lm.stream_generate(
            model, tokenizer, mx.array(prompt[:16]), max_tokens=4, sampler=greedy()
        ):
            pass
        for k in ks:
            set_model_k(model, k)
            mx.reset_peak_memory()
            rss_reset = system.reset_peak_rss()
            times: list[float] = []
            tokens: list[int] = []
            prompt_tps = 0.0
            for resp in mlx_lm.stream_generate(
                model,
                tokenizer,
                mx.array(prompt),
                max_tokens=decode_tokens,
                sampler=greedy(),
                prefill_step_size=prefill_step,
            ):
                times.append(time.perf_counter())
                tokens.append(int(resp.token))
                prompt_tps = resp.prompt_tps
            steps = len(tokens) - 1
            dec_s = times[-1] - times[0] if len(times) > 1 else 0.0
            from ssdmoe_tui.engine.experts import iostats

            out[k] = {
                "k": k,
                "prefill_tok_s": round(prompt_tps, 3),
                "decode_tok_s": _round(_per_step(steps, dec_s), 3),
                "generated_tokens": len(tokens),
                "decode_steps": steps,
                "peak_mlx_memory_bytes": int(mx.get_peak_memory()),
                "peak_rss_bytes": int(iostats.peak_rss_bytes() or 0),
                "peak_rss_scope": "this generation" if rss_reset else "whole process",
                "load_s": round(load_s, 3),
                "token_ids": tokens,
            }
            log(
                f"  resident K={k}: prefill {prompt_tps:.1f} tok/s, "
                f"decode {out[k]['decode_tok_s'] or 0:.2f} tok/s"
            )
    finally:
        del model
        gc.collect()
        mx.clear_cache()
    return out


def _baseline_decision(opts: BenchOptions, ckpt_bytes: int, mem: MemoryLimit) -> str | None:
    """None to run the baseline; else the line saying why it cannot/does not run."""
    if opts.baseline == "skip":
        return "skipped (--baseline skip)"
    if opts.baseline == "force":
        return None
    limit = mem.available * BASELINE_FRACTION
    if ckpt_bytes < limit:
        return None
    return (
        f"cannot run: model {human_bytes(ckpt_bytes)} > memory "
        f"(needs < {BASELINE_FRACTION:.0%} of {human_bytes(mem.available)} available: {mem.describe()})"
    )


def _load_baseline_json(p: Path, conditions: dict) -> dict:
    try:
        data = json.loads(read_regular(Path(p), MODEL_JSON_MAX))
    except FileNotFoundError:
        raise BadValueError(f"--baseline-json: file not found: {p}") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        why = e.strerror if isinstance(e, OSError) else getattr(e, "msg", None) or "not UTF-8 JSON"
        raise BadValueError(f"--baseline-json {p}: cannot read ({why})") from None
    base = data.get("resident_baseline") if isinstance(data, dict) else None
    by_k = base.get("by_k", {}) if isinstance(base, dict) else None
    if not isinstance(by_k, dict) or not all(str(k).isdigit() for k in by_k):
        raise BadValueError(
            f"--baseline-json {p}: not an ssdmoe bench result (no resident_baseline)"
        )
    if base.get("status") != "ran":
        raise BadValueError(f"--baseline-json {p}: its resident baseline did not run")
    theirs = data.get("conditions")
    theirs = theirs if isinstance(theirs, dict) else {}
    for key in ("model_type", "dtype", "prompt_tokens", "decode_tokens", "checkpoint_bytes"):
        if theirs.get(key) != conditions.get(key):
            raise BadValueError(
                f"--baseline-json {p}: {key} differs ({theirs.get(key)!r} vs {conditions.get(key)!r})"
            )
    base = dict(base)
    base["source"] = str(p)
    base["by_k"] = {int(k): v for k, v in by_k.items()}
    return base


def run_bench(
    opts: BenchOptions,
    log: Log = lambda _: None,
    on_partial: Callable[[dict], None] = lambda _: None,
    after: Callable[[_BenchSetup, dict], None] | None = None,
) -> dict:
    """Run every measurement; returns the JSON-ready result.

    `on_partial` gets the result so far after each measurement, so a run cut short
    (a time limit, an out-of-memory kill) still leaves what it measured. `after` adds
    a measurement of its own once the rest is done (`bench --fit`: bench/fit.py).
    """
    from ssdmoe_tui.engine.run import runner as _runner  # noqa: F401 - imported before the digest

    s = _bench_setup(opts)
    conditions = _bench_conditions(opts, s)
    result: dict = {"schema": SCHEMA_VERSION, "conditions": conditions}
    log(
        f"model {s.path} ({s.config.get('model_type')}, {human_bytes(s.ckpt_bytes, 2)}, "
        f"{s.index.num_layers} MoE layers x {s.index.num_experts} experts x "
        f"{human_bytes(s.index.expert_bytes, 2)})"
    )

    # ---------------- page cache: cold drops it before each measurement; warm fills it once
    # measured before anything here reads the shards: what the OS held from before
    conditions["page_cache_before"] = storage.residency(s.shards).as_dict()
    page_cache = _PageCache(opts, s.shards, log)
    prepare = page_cache.prepare
    if not opts.baseline_only:
        if not opts.cold:
            _fill_page_cache(s, conditions, log)
        # ---------------- disk
        state = prepare()
    if not opts.baseline_only and opts.root:
        result["disk"] = _run_disk(opts, s, state, log)
    if not opts.baseline_only:
        if opts.warmup:
            warmup(opts, max(s.ks), opts.budgets[0], log)
        _run_configs(opts, s, result, prepare, on_partial, log)
        if opts.cold and page_cache.drops and any(m != "drop_caches" for m in page_cache.drops):
            conditions["mode"] = "cold (fallback: see page_cache per result)"

    if opts.quality_text is not None:
        run_quality(opts, s.ks, result, log)
        on_partial(result)

    base = _baseline(opts, s, conditions, log)
    result["resident_baseline"] = {
        **{k: v for k, v in base.items() if k != "by_k"},
        "by_k": {str(k): v for k, v in base["by_k"].items()},
    }
    if "configs" in result:
        _derive(result, base["by_k"], s.index)
    if after is not None:
        on_partial(result)
        after(s, result)
    conditions["thermal_after"] = thermal.thermal_state()
    result["complete"] = True
    return result


@dataclass
class _BenchSetup:
    """What every measurement of a run shares: the checkpoint read once."""

    path: Path
    config: dict
    index: object  # engine.experts.index.ExpertIndex
    act_dtype: object  # mx.Dtype
    prompt: list[int]
    trained_k: int
    ks: list[int]
    routing_label: str
    ckpt_bytes: int
    mem: MemoryLimit
    shards: list[Path]
    read_index: object  # the index the cache reads through (shards or repacked copy)
    source: str
    source_note: str
    # (K, B) -> resident BatchGenerator figures (`--batch`), measured once per run
    resident_batch: dict = field(default_factory=dict)


def _bench_setup(opts: BenchOptions) -> _BenchSetup:
    """Read the checkpoint's config, index and tokenizer, build the prompt and the Ks."""
    from ssdmoe_tui.engine.experts.index import load_index
    from ssdmoe_tui.engine.model.loader import _load_config, parse_dtype, resolve_expert_source

    eng = opts.engine
    path = Path(eng.model)
    if not path.is_dir():
        raise ModelError(f"model folder not found: {path}")
    config = _load_config(path)
    index, _ = load_index(path)
    act_dtype = parse_dtype(eng.dtype)

    from ssdmoe_tui.checkpoint.config import load_tokenizer

    tokenizer = load_tokenizer(path)
    prompt = fixed_prompt(tokenizer, opts.prompt_tokens)
    if len(prompt) < opts.prompt_tokens:
        raise BadValueError(f"could only build {len(prompt)} prompt tokens")

    from ssdmoe_tui.checkpoint.arch import trained_k as config_trained_k

    trained_k = min(max(config_trained_k(config), 1), index.num_experts)
    # --fit compares at the trained K unless told otherwise (bench/fit.py).
    ks = opts.ks or ([trained_k] if opts.fit else default_ks(trained_k, index.num_experts))
    routing_label = "model"
    if eng.routing_trace:
        from ssdmoe_tui.engine.policy.trace_routing import check_trace_k
        from ssdmoe_tui.engine.policy.traces import read_trace

        trace_meta = read_trace(eng.routing_trace).meta  # K comes from the trace
        check_trace_k("--k", opts.ks, trace_meta.k)
        ks = [trace_meta.k]
        routing_label = f"trace:{Path(eng.routing_trace).name}"
    for k in ks:
        check_k(k, index.num_experts)
    ckpt_bytes = _checkpoint_bytes(path, index)
    mem = memory_limit()
    shards = _shard_paths(path, index)
    read_index, source, source_note = resolve_expert_source(path, index, eng.experts)
    if source == "repacked":  # cold/warm handling and the disk test cover the copy read
        shards.append(Path(read_index.layers[0].components[0].shard))
    return _BenchSetup(
        path=path,
        config=config,
        index=index,
        act_dtype=act_dtype,
        prompt=prompt,
        trained_k=trained_k,
        ks=ks,
        routing_label=routing_label,
        ckpt_bytes=ckpt_bytes,
        mem=mem,
        shards=shards,
        read_index=read_index,
        source=source,
        source_note=source_note,
    )


def _bench_conditions(opts: BenchOptions, s: _BenchSetup) -> dict:
    """The run's conditions: checkpoint, machine, prompt, what is measured and how."""
    eng, index, config = opts.engine, s.index, s.config
    expert_set = index.expert_bytes * index.num_experts * index.num_layers
    conditions = {
        "model": str(s.path.resolve()),
        "model_type": config.get("model_type"),
        "quantization": _quantization(config),
        "num_layers_moe": index.num_layers,
        "num_experts": index.num_experts,
        "trained_k": s.trained_k,
        "expert_bytes": index.expert_bytes,
        "expert_piece_bytes": [c.stride for c in index.layers[0].components],
        "expert_set_bytes": expert_set,
        "resident_bytes_on_disk": index.resident_bytes,
        "checkpoint_bytes": s.ckpt_bytes,
        "versions": system.versions(),
        "source": system.source_state(),
        "device": system.device_description(),
        "dtype": str(s.act_dtype).removeprefix("mlx.core."),
        "prompt": "fixed English text repeated, tokenized raw (no chat template), truncated",
        "prompt_tokens": len(s.prompt),
        "decode_tokens": opts.decode_tokens,
        "sampling": "greedy (temperature 0); end-of-sequence ignored",
        "ks": s.ks,
        "expert_cache": [str(b) for b in opts.budgets],
        "mode": "cold" if opts.cold else "warm",
        "reader_requested": eng.reader,
        "queue_depth": eng.queue_depth,
        "direct_io": eng.direct_io,
        "expert_source": s.source,
        "expert_source_note": s.source_note,
        "prefetch": opts.prefetch,
        "routing": s.routing_label,
        "policy": eng.policy,
        "prefill_step": eng.prefill_step,
        "fit": str(opts.fit) if opts.fit is not None else None,
        "memory": s.mem.as_dict(),
        "storage": storage.storage_conditions(s.path),
        "thermal_before": thermal.thermal_state(),
        "date": system.utc_now(),
    }
    if opts.distributed is not None:
        conditions["distributed"] = {
            "ranks": opts.distributed.size,
            "expert_cache": "per rank (each rank caches only the experts it owns)",
            "measured_by": "every rank; rank 0 reports, measures the disk and the baseline",
        }
    return conditions


class _PageCache:
    """Cold mode drops the shards from the page cache before each measurement (and
    remembers how: `drops`); warm mode leaves it. `prepare()` names the state."""

    def __init__(self, opts: BenchOptions, shards: list[Path], log: Log) -> None:
        self.opts, self.shards, self.log = opts, shards, log
        self.drops: list[str] = []

    def prepare(self) -> str:
        if self.opts.cold:
            d = system.drop_page_cache(self.shards)
            self.drops.append(d.method)
            if d.method != "drop_caches":
                self.log(f"  note: {d.note}")
            return "cold (" + d.method + ")" if d.cold else "warm (" + d.note + ")"
        return "warm"


def _fill_page_cache(s: _BenchSetup, conditions: dict, log: Log) -> None:
    """Warm mode: read the shards once into the page cache when they fit."""
    if s.ckpt_bytes < s.mem.available * BASELINE_FRACTION:
        log("warm mode: reading the shards once into the page cache")
        system.read_through(s.shards)
        conditions["warm_prefill"] = "shards read once into the page cache before measuring"
    else:
        conditions["warm_prefill"] = (
            "checkpoint larger than half the available memory: not pre-read; "
            "page cache as the previous configurations left it"
        )


def _run_disk(opts: BenchOptions, s: _BenchSetup, state: str, log: Log) -> dict:
    """The disk's random-read bandwidth for whole experts, in batches of K."""
    from ssdmoe_tui.bench.disk import random_read_bandwidth

    eng = opts.engine
    log(
        f"disk: random reads of whole experts, batches of K experts, queue depth {eng.queue_depth} [{state}]"
    )
    disk = random_read_bandwidth(
        s.path,
        s.read_index,
        s.ks,
        target_bytes=opts.disk_bytes,
        queue_depth=eng.queue_depth,
        reader=eng.reader,
        direct=eng.direct_io,
        seed=opts.seed,
    )
    for k, d in disk.items():
        log(
            f"  K={k}: {d.bytes_per_s / 1e9:.2f} GB/s ({human_bytes(d.bytes)} in {d.seconds:.2f} s, {d.reader})"
        )
    return {
        "page_cache": state,
        "by_k": {str(k): d.as_dict() for k, d in disk.items()},
    }


def _run_configs(
    opts: BenchOptions,
    s: _BenchSetup,
    result: dict,
    prepare: Callable[[], str],
    on_partial: Callable[[dict], None],
    log: Log,
) -> None:
    """Every (budget, K, prefetch) configuration on a fresh engine, into `result["configs"]`."""
    configs: list[dict] = []
    result["configs"] = configs
    result["complete"] = False
    on_partial(result)
    modes = {"off": [False], "on": [True], "both": [False, True]}[opts.prefetch]
    pipes = {"auto": [None], "on": ["on"], "off": ["off"], "both": ["off", "on"]}[opts.pipeline]
    for bi, budget in enumerate(opts.budgets):
        for ki, k in enumerate(s.ks):
            # `both`: serial first, then pipelined first, on a checkerboard of budgets and
            # Ks: the second run of a pair meets what the first left (on the H100 serial,
            # always run first, won 8 of 8)
            order = pipes if (bi + ki) % 2 == 0 else pipes[::-1]
            for pf, pipe in [(pf, pipe) for pf in modes for pipe in order]:
                state = prepare()
                tag = (" +prefetch" if pf else "") + (f" pipeline {pipe}" if pipe else "")
                log(f"config K={k} expert cache {budget}{tag} [{state}]")
                resident = storage.residency(s.shards)
                with _pipeline_env(pipe):
                    r = run_config(opts, k, budget, s.prompt, log, prefetch=pf)
                r["page_cache"] = state
                r["page_cache_resident_share"] = resident.as_dict()["resident_share"]
                configs.append(r)
                _derive(result, {}, s.index)
                on_partial(result)
                if not pf and opts.batch:
                    _run_batches(opts, s, k, budget, result, prepare, log)
                    on_partial(result)


@contextlib.contextmanager
def _pipeline_env(mode: str | None):
    """$SSDMOE_PIPELINE set to `mode` while an engine loads (None: as it is)."""
    from ssdmoe_tui.engine.model.streamed import PIPELINE_ENV

    old = os.environ.get(PIPELINE_ENV)
    if mode is not None:
        os.environ[PIPELINE_ENV] = mode
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(PIPELINE_ENV, None)
        else:
            os.environ[PIPELINE_ENV] = old


def _baseline(opts: BenchOptions, s: _BenchSetup, conditions: dict, log: Log) -> dict:
    """The resident mlx-lm baseline: measured here, read from --baseline-json, or why not."""
    if not opts.root:
        return {"status": "rank 0 measures it", "by_k": {}}
    if opts.baseline_json is not None:
        base = _load_baseline_json(opts.baseline_json, conditions)
        log(f"resident baseline from {opts.baseline_json}")
        return base
    why = _baseline_decision(opts, s.ckpt_bytes, s.mem)
    if why is not None:
        log(f"resident baseline: {why}")
        return {"status": why, "by_k": {}}
    log("resident baseline: plain mlx-lm (mlx_lm.load + stream_generate)")
    by_k = resident_baseline(
        s.path, s.ks, s.prompt, opts.decode_tokens, s.act_dtype, opts.engine.prefill_step, log
    )
    return {
        "status": "ran",
        "forced": opts.baseline == "force",
        "note": "mlx_lm.load + cast_model to the same dtype + stream_generate, "
        "top-k set to K on mlx-lm's own MoE blocks",
        "by_k": by_k,
    }


def _run_batches(opts, s, k, budget, result, prepare, log) -> None:  # noqa: ANN001
    """`--batch`: each B on a fresh engine for this (K, budget); `result["batch"]`; then,
    when the model fits, mlx-lm's resident `BatchGenerator` on the same rows beside each."""
    from ssdmoe_tui.bench.batch import derive, run_batch_config

    if opts.distributed is not None:
        raise BadValueError("--batch is not supported with --distributed")
    out = result.setdefault("batch", [])
    rows = []
    for b in opts.batch:
        state = prepare()
        log(f"config K={k} expert cache {budget} batch {b} [{state}]")
        runner = _open(opts, budget, k, False, log)
        try:
            join = fixed_prompt(runner.sm.tokenizer, opts.batch_join) if opts.batch_join else None
            r = run_batch_config(
                runner,
                opts.decode_tokens,
                budget,
                s.prompt,
                b,
                log,
                check_alone=opts.batch_check,
                join_prompt=join,
            )
        finally:
            _close(runner)
        r["page_cache"] = state
        out.append(r)
        rows.append(r)
        derive(out)
    _resident_batches(opts, s, k, rows, log)


def _resident_batches(opts, s, k: int, rows: list[dict], log: Log) -> None:  # noqa: ANN001
    """mlx-lm's `BatchGenerator` on the whole model (the resident baseline's rule decides
    whether it fits), the same rows and tokens, beside each `--batch` row; measured once
    per (K, B) and reused for the other budgets. Not with trace routing (mlx-lm would
    route by its own router)."""
    from ssdmoe_tui.bench.batch import row_prompts
    from ssdmoe_tui.bench.batch_compare import ResidentBatch

    why = _baseline_decision(opts, s.ckpt_bytes, s.mem)
    if opts.engine.routing_trace is not None:
        why = "not with --routing-trace"
    memo = s.resident_batch
    if why is not None:
        for r in rows:
            r["resident_batch_generator"] = {"status": why}
        return
    todo = [r["batch"] for r in rows if (k, r["batch"]) not in memo]
    if todo:
        log(f"resident BatchGenerator (mlx_lm.load, K={k}): B {', '.join(map(str, todo))}")
        res = ResidentBatch(s.path, s.act_dtype, k)
        try:
            res.batch(row_prompts(s.prompt, max(todo)), min(opts.decode_tokens, 4))  # compile
            for b in todo:
                run = res.batch(row_prompts(s.prompt, b), opts.decode_tokens)
                memo[(k, b)] = {
                    "status": "ran",
                    "aggregate_decode_tok_s": None
                    if run.aggregate_tok_s is None
                    else round(run.aggregate_tok_s, 3),
                    "token_ids": run.tokens,
                }
        finally:
            del res
            gc.collect()
    for r in rows:
        m = dict(memo[(k, r["batch"])])
        mine, theirs = r["aggregate_decode_tok_s"], m["aggregate_decode_tok_s"]
        m["engine_vs_resident"] = round(mine / theirs, 3) if mine and theirs else None
        m["tokens_equal_engine"] = sum(  # engine rows held open for later joins are longer
            a == b[: len(a)] for a, b in zip(m.pop("token_ids"), r["token_ids"], strict=True)
        )
        r["resident_batch_generator"] = m


def run_quality(opts: BenchOptions, ks: list[int], result: dict, log: Log) -> None:
    """Score `opts.quality_text` at each K on one fresh engine; record it beside the speed."""
    from ssdmoe_tui.bench.quality import RANDOM_WEIGHTS_NOTE, measure_quality, text_tokens

    if opts.distributed is not None or opts.engine.routing_trace is not None:
        result["quality"] = {"status": "not measured with --distributed or --routing-trace"}
        log("quality: not measured with --distributed or --routing-trace")
        return
    log(f"quality: {opts.quality_text}, teacher-forced at K {', '.join(map(str, ks))}")
    runner = _open(opts, opts.budgets[0], ks[0], log=log)
    try:
        tokens = text_tokens(runner.sm.tokenizer, opts.quality_text, opts.quality_tokens)
        by_k = measure_quality(runner.sm, tokens, ks, log=log)
    finally:
        _close(runner)
    result["quality"] = {
        "text": str(opts.quality_text),
        "text_tokens": len(tokens),
        "note": RANDOM_WEIGHTS_NOTE,
        "by_k": {str(k): v for k, v in by_k.items()},
    }
    for r in result.get("configs", []):
        r["quality"] = by_k.get(r["k"])


def _derive_prefill(r: dict, bw: float | None, index, step: int) -> None:
    """Prefill against reading every expert once per chunk (the issue's reference).

    The engine reads each layer's union of routed experts once per chunk; the
    reference reads all of them. `prefill_union_share` is the share the unions read, and
    `prefill_over_read_all` compares prefill tok/s with the disk-bound rate of the
    reference (> 1: faster than reading everything once per chunk)."""
    p = r["prompt_tokens"]
    chunks = max(1, math.ceil(max(p - 1, 1) / step))
    all_bytes = index.expert_bytes * index.num_experts * index.num_layers * chunks
    r["prefill_chunks"] = chunks
    r["prefill_union_share"] = round(r["prefill_requested_bytes"] / all_bytes, 4)
    ref = p / (all_bytes / bw) if bw else None
    r["prefill_read_all_tok_s"] = _round(ref)
    r["prefill_over_read_all"] = (
        round(r["prefill_tok_s"] / ref, 6) if ref and r["prefill_tok_s"] else None
    )


def _prefill_bound(r: dict, bw: float | None, resident_tok_s: float | None) -> None:
    """The prefill's bound (issue 29): the bytes it read at the disk's rate plus resident
    mlx-lm's compute of the same prompt, as if the two did not overlap at all; the
    engine's prefill time over it (1.0: as fast as reading and computing in series;
    below 1: the reads overlapped the compute)."""
    p, need = r["prompt_tokens"], r.get("prefill_requested_bytes")
    if not (bw and resident_tok_s and need is not None and r.get("prefill_tok_s")):
        r["prefill_bound_tok_s"] = r["prefill_time_over_bound"] = None
        return
    bound_s = need / bw + p / resident_tok_s
    r["prefill_bound_tok_s"] = round(p / bound_s, 4)
    r["prefill_time_over_bound"] = round((p / r["prefill_tok_s"]) / bound_s, 4)


def _derive(result: dict, base_by_k: dict, index) -> None:
    """I/O ceilings, achieved/ceiling, resident ratios and output agreement."""
    disk = {int(k): v for k, v in result.get("disk", {}).get("by_k", {}).items()}
    for r in result["configs"]:
        k = r["k"]
        bpt = index.expert_bytes * k * index.num_layers  # bytes/token with no cache
        r["bytes_per_token_no_cache"] = bpt
        d = disk.get(k)
        bw = d["bytes"] / d["seconds"] if d and d["seconds"] > 0 else None
        miss = 1.0 - r["hit_rate"]
        if bw is None:
            ceiling = None
        elif miss <= 0:
            ceiling = float("inf")
        else:
            ceiling = bw / (bpt * miss)
        r["disk_bytes_per_s"] = _round(bw, 1)
        r["io_ceiling_tok_s"] = None if ceiling in (None, float("inf")) else round(ceiling, 4)
        r["io_ceiling_note"] = "no reads (hit rate 100%)" if ceiling == float("inf") else None
        dec = r["decode_tok_s"]
        r["achieved_over_ceiling"] = (
            round(dec / ceiling, 6) if dec and ceiling not in (None, float("inf")) else None
        )
        _derive_prefill(r, bw, index, result["conditions"].get("prefill_step") or PREFILL_STEP)
        if r.get("prefetch"):
            off = next(
                (
                    o
                    for o in result["configs"]
                    if not o.get("prefetch")
                    and o.get("pipeline") == r.get("pipeline")
                    and o["k"] == k
                    and o["expert_cache"] == r["expert_cache"]
                ),
                None,
            )
            r["prefetch_decode_vs_off"] = (
                round(r["decode_tok_s"] / off["decode_tok_s"], 4)
                if off and off.get("decode_tok_s") and r.get("decode_tok_s")
                else None
            )
        b = base_by_k.get(k)
        if b and b.get("decode_tok_s"):
            r["resident_decode_tok_s"] = b["decode_tok_s"]
            r["resident_prefill_tok_s"] = b["prefill_tok_s"]
            r["ratio_decode_vs_resident"] = round((dec or 0.0) / b["decode_tok_s"], 4)
            r["ratio_prefill_vs_resident"] = (
                round(r["prefill_tok_s"] / b["prefill_tok_s"], 4) if b["prefill_tok_s"] else None
            )
            _prefill_bound(r, bw, b["prefill_tok_s"])
            bt = b.get("token_ids") or []
            # Trace-routed tokens are not the model's own: no exactness claim (None: "-").
            routed = r.get("routing", "model") != "model"
            r["tokens_match_resident"] = None if routed else bt == r["token_ids"]
            n = 0
            for a, c in zip(bt, r["token_ids"], strict=False):
                if a != c:
                    break
                n += 1
            r["tokens_common_prefix"] = n
        else:
            r["resident_decode_tok_s"] = None
            r["ratio_decode_vs_resident"] = None
            r["tokens_match_resident"] = None


def _pages_moved(sm) -> dict:  # noqa: ANN001 - a StreamedModel
    """The page mover's figures (page_ahead.py), else None: layers and bytes moved to the
    GPU, and the moves the driver refused."""
    ahead = sm.switches[0].prestage if sm.switches else None
    mover = getattr(ahead, "mover", None)
    return {
        "pages_moved_layers": ahead.moves if mover is not None else None,
        "pages_moved_bytes": ahead.moved_bytes if mover is not None else None,
        "pages_move_failed": mover.failed if mover is not None else None,
    }

"""`ssdmoe bench --quick` (`make bench-quick`): the engine's own per-token cost, guarded.

One process holds three models of one small checkpoint: resident mlx-lm, the streamed
engine with a small expert cache, and the streamed engine with a cache holding every
expert. Rounds alternate the three (the order rotates each round), each decoding the
same greedy tokens, and the ratios are medians over the rounds, so the load other
processes put on a shared machine falls on all three alike. Then, per MoE layer:

- `build_us`: Python time to build one MoE block's expert graph (no evaluation) for
  mlx-lm's `SwitchGLU`, the streamed block with every expert held (device lookup, no
  sync) and the streamed block on the host path with all hits (lookups, slot map);
- `kernels`: graph nodes of one MoE block (router included), resident vs streamed
  with the router-mass meter on and off (`engine/model/routing_mass.py`);
- `sync_us`: one host round trip (evaluate a tiny op, read it on the host): what each
  layer of the host path pays on top of its compute;
- `overhead_us`: (streamed ms/token - resident ms/token) / MoE layers, measured.

The checkpoint (random weights, Qwen3-MoE architecture, 12 MoE layers x 32 experts of
256 x 256, K = 4, 4-bit gs64: 47 MiB of experts) is built once into the cache folder. It
is small on purpose: the development VM's CPU computes a 4-bit `gather_qmm` slowly, and
on a model where each layer's compute is small the engine's fixed cost per layer shows. Every hot-path commit puts these figures
in its message; docs/benchmarks.md keeps their history.
"""

from __future__ import annotations

import hashlib
import json
import re
import statistics
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from ssdmoe_tui.models.demo import DEMO_CONFIG
from ssdmoe_tui.units import human_bytes

Log = Callable[[str], None]

QUICK_CONFIG: dict = dict(DEMO_CONFIG, num_hidden_layers=12)  # the demo, twice as deep
SMALL_CACHE = "16M"  # ~35 % of this checkpoint's expert slots on the CPU
ALL_CACHE = "64G"  # clamped to the expert set: every expert held
# The trace row: real routing (Qwen3-30B-A3B's recorded trace, K = 6, its first 8 layers)
# on a checkpoint of that trace's expert count at the demo's width, with a quarter of its
# experts cached, pipelined and serial (issue 29: an overlap regression shows on the CPU).
TRACE_CONFIG: dict = dict(
    DEMO_CONFIG, num_hidden_layers=8, num_experts=128, num_experts_per_tok=8,
    moe_intermediate_size=128,
)  # fmt: skip
TRACE_FILE = "bigmoeonedge-route-trace/2026-07-15-route-trace/qwen.route.csv"
TRACE_SHARE = 0.25  # of the trace checkpoint's expert slots


def trace_path() -> Path | None:
    """The shipped trace in a source checkout (tests/fixtures/traces); None in a wheel."""
    p = Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "traces" / TRACE_FILE
    return p if p.is_file() else None


def quick_model(log: Log = lambda _: None, config: dict | None = None) -> Path:
    """The bench's checkpoint, written once (keyed by its config) into the cache folder."""
    from ssdmoe_tui.models.demo import write_checkpoint
    from ssdmoe_tui.paths import cache_dir

    config = QUICK_CONFIG if config is None else config
    key = hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest()[:12]
    out = cache_dir() / "bench-quick" / key
    if (out / ".complete").is_file():
        return out
    log(f"building the bench checkpoint in {out} (first run only)")
    tmp = out.with_name(key + ".partial")
    import shutil

    shutil.rmtree(tmp, ignore_errors=True)
    write_checkpoint(config, tmp, seed=11, group_size=64, max_shard_bytes=256 << 20)
    (tmp / ".complete").write_text("1\n")
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return out


def _timed_stream(events, is_token) -> tuple[list[int], list[float], list[float]]:
    """Token ids, wall-clock and process-CPU stamps of each token."""
    tokens, stamps, cpu = [], [], []
    for ev in events:
        tok = is_token(ev)
        if tok is not None:
            stamps.append(time.perf_counter())
            cpu.append(time.process_time())
            tokens.append(tok)
    return tokens, stamps, cpu


def _rates(t0: float, stamps: list[float], cpu: list[float], prompt: int) -> dict:
    """Prefill tok/s = prompt / time to the first token; decode tok/s over steps 2..N, by
    the wall clock and by this process's CPU time (all its threads: on a machine other
    jobs load, CPU time moves less with their load than the wall clock does)."""
    steps = len(stamps) - 1
    return {
        "prefill_tok_s": prompt / (stamps[0] - t0),
        "decode_tok_s": steps / (stamps[-1] - stamps[0]) if steps > 0 else 0.0,
        "decode_cpu_ms": (cpu[-1] - cpu[0]) * 1e3 / steps if steps > 0 else 0.0,
    }


class _Resident:
    def __init__(self, path: Path, dtype, name: str = "resident", k: int | None = None) -> None:
        import mlx.core as mx
        import mlx_lm

        from ssdmoe_tui.engine.model.loader import cast_model, set_model_k

        self.name = name
        self.model, self.tokenizer = mlx_lm.load(str(path))
        cast_model(self.model, dtype)
        if k is not None:  # the trace's K, for the trace row's baseline
            set_model_k(self.model, k)
        mx.eval(self.model.parameters())
        self.tokenizer.eos_token_ids = set()

    def run(self, prompt: list[int], n: int) -> dict:
        import mlx.core as mx
        import mlx_lm

        from ssdmoe_tui.engine.run.sampling import greedy

        t0 = time.perf_counter()
        tokens, stamps, cpu = _timed_stream(
            mlx_lm.stream_generate(
                self.model, self.tokenizer, mx.array(prompt), max_tokens=n,
                sampler=greedy(),
            ),
            lambda r: int(r.token),
        )  # fmt: skip
        return {"tokens": tokens, **_rates(t0, stamps, cpu, len(prompt))}


class _Streamed:
    base = "resident"  # the engine its ratios are taken against

    def __init__(
        self,
        name: str,
        path: Path,
        budget: str | int,
        dtype: str | None,
        trace=None,  # noqa: ANN001 - a traces.Trace: route by it (the trace row)
        pipeline: str | None = None,
    ) -> None:
        from ssdmoe_tui.bench.bench import _pipeline_env
        from ssdmoe_tui.engine.model.loader import load_streamed
        from ssdmoe_tui.engine.run.runner import Runner

        self.name = name
        with _pipeline_env(pipeline):
            self.sm = load_streamed(path, expert_cache=budget, dtype=dtype)
        self.sm.tokenizer.eos_token_ids = set()
        k = None
        if trace is not None:
            from ssdmoe_tui.engine.policy.trace_routing import attach

            self.base = "trace_resident"
            k = attach(self.sm, TRACE_FILE, trace=trace).k
        self.runner = Runner(self.sm, k=k)

    def run(self, prompt: list[int], n: int) -> dict:
        from ssdmoe_tui.engine.run.runner import Snapshot, TokenEvent

        marks: list = []

        def token(ev):
            if isinstance(ev, TokenEvent):
                if ev.stats.generated_tokens in (1, n):
                    marks.append(Snapshot.take(self.sm))
                return ev.token
            return None

        t0 = time.perf_counter()
        tokens, stamps, cpu = _timed_stream(self.runner.stream(prompt, max_tokens=n), token)
        d = marks[-1] - marks[0]
        steps = max(len(tokens) - 1, 1)
        return {
            "tokens": tokens,
            **_rates(t0, stamps, cpu, len(prompt)),
            "hit_rate": d.hit_rate,
            "sync_ms": d.router_sync_s * 1e3 / steps,
            "read_ms": d.read_s * 1e3 / steps,
            "cache_ms": max(d.ensure_s - d.read_s, 0.0) * 1e3 / steps,
            "mib_per_token": d.bytes_read / steps / 2**20,
        }

    def close(self) -> None:
        self.runner.close()


def graph_ops(*arrays) -> Counter[str]:
    """The primitive nodes of the unevaluated graph behind `arrays`, counted by name
    (`Gather`, `Slice`, ...: about the kernels launched, and each one's graph build)."""
    import os
    import tempfile

    import mlx.core as mx

    fd, name = tempfile.mkstemp(suffix=".dot")
    os.close(fd)
    try:
        mx.export_to_dot(name, *arrays)
        text = Path(name).read_text()
    finally:
        os.unlink(name)
    # one line per primitive node, a box: `{ 9404... [label ="Gather", shape=rectangle]; }`
    return Counter(
        m.group(1)
        for line in text.splitlines()
        if "shape=rectangle" in line and (m := _LABEL.search(line))
    )


_LABEL = re.compile(r'label\s*=\s*"([^"]+)"')


def _nodes(*arrays) -> int:
    """Primitive nodes of the unevaluated graph behind `arrays` (about the kernels launched)."""
    return sum(graph_ops(*arrays).values())


def _per_call_us(fn: Callable[[], object], n: int, batches: int = 5) -> float:
    """µs per call: the best of `batches` batches (the least disturbed by other load)."""
    fn()
    best = float("inf")
    for _ in range(batches):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        best = min(best, (time.perf_counter() - t0) / n)
    return best * 1e6


def layer_costs(resident: _Resident, small: _Streamed, every: _Streamed, calls: int = 100) -> dict:
    """Per MoE layer: graph-build µs, graph nodes, and one host round trip."""
    import mlx.core as mx
    import numpy as np

    from ssdmoe_tui.checkpoint.arch import switch_sites
    from ssdmoe_tui.engine.model.loader import moe_blocks

    rblock = moe_blocks(resident.model)[0]
    rswitch = switch_sites(resident.model, small.sm.family)[0].switch
    sswitch = small.sm.switches[0]
    eblock, eswitch = every.sm.blocks[0], every.sm.switches[0]
    cfg = small.sm.config.get("text_config", small.sm.config)
    hidden = int(cfg["hidden_size"])
    k = small.sm.trained_k
    x = mx.random.normal((1, 1, hidden)).astype(small.sm.dtype)
    inds = mx.array(np.arange(k, dtype=np.uint32).reshape(1, 1, k))
    mx.eval(x, inds)
    # the small cache's host path with every lookup a hit: make these experts resident
    small.sm.cache.ensure(0, np.arange(k))
    assert every.sm.cache.device_lut(0) is not None, "the all-held engine has not frozen layer 0"
    build = {
        "resident": _per_call_us(lambda: rswitch(x, inds), calls),
        "streamed_held": _per_call_us(lambda: eswitch(x, inds), calls),
        "streamed_host_path": _per_call_us(lambda: sswitch(x, inds), calls),
    }
    nodes = {"resident": _nodes(rblock(x)), "streamed_held": _nodes(eblock(x))}
    # The router-mass meter below the trained K: the block's graph is unchanged, and the
    # mass is one batched graph built when a figure is read (per read, not per layer).
    meter = every.sm.measure_routing_mass()
    every.sm.set_k(k // 2)
    meter.clear()
    nodes["streamed_held_mass_meter_on"] = _nodes(eblock(x))
    eblock(x)
    nodes["mass_meter_per_read"] = _nodes(meter.take())
    meter.clear()
    every.sm.set_k(k)
    every.sm.measure_routing_mass(False)
    y = mx.array([1.0])
    mx.eval(y)

    def round_trip():
        z = y + 1
        np.array(z, copy=False)

    sync = _per_call_us(round_trip, calls)
    return {
        "build_us": {a: round(b, 1) for a, b in build.items()},
        "kernels": nodes,
        "sync_us": round(sync, 1),
    }


def _trace_engines(act, dtype: str | None, log: Log) -> list:
    """The trace row's engines: resident mlx-lm at the trace's K, and the trace-routed
    engine with TRACE_SHARE of the experts cached, pipelined and serial; none (and a
    line saying why) without the shipped trace."""
    from ssdmoe_tui.engine.experts.cache import slot_memory_bytes
    from ssdmoe_tui.engine.experts.index import build_index
    from ssdmoe_tui.engine.model.loader import parse_dtype
    from ssdmoe_tui.engine.policy.traces import read_trace

    src = trace_path()
    if src is None:
        log("trace row skipped: the shipped trace is not here (a source checkout has it)")
        return []
    path = quick_model(log, TRACE_CONFIG)
    index = build_index(path)
    trace = read_trace(src).first_layers(index.num_layers)
    slots = int(index.num_experts * index.num_layers * TRACE_SHARE)
    budget = slots * slot_memory_bytes(index, parse_dtype(dtype))
    return [
        _Resident(path, act, "trace_resident", trace.meta.k),
        _Streamed("trace", path, budget, dtype, trace, pipeline="on"),
        _Streamed("trace_serial", path, budget, dtype, trace, pipeline="off"),
    ]


def _trace_conditions(engines: list) -> dict | None:
    if not engines:
        return None
    sm = engines[1].sm
    return {
        "trace": TRACE_FILE,
        "moe_layers": sm.index.num_layers,
        "experts": sm.index.num_experts,
        "k": sm.cache.routing.k,
        "slots": sm.cache.capacity,
    }


def _alternate(
    engines: list, prompt: list[int], rounds: int, decode_tokens: int, log: Log
) -> list[dict]:
    """Warm every engine up, then `rounds` rounds of each, rotated by one a round: each
    round's figures by engine name."""
    import gc

    for e in engines:  # warm-up: kernels, and the all-held engine reads every layer once
        e.run(prompt[:8], 4)
    rows: list[dict] = []
    for r in range(rounds):
        order = engines[r % len(engines) :] + engines[: r % len(engines)]
        got = {e.name: e.run(prompt, decode_tokens) for e in order}
        gc.collect()
        rows.append(got)
        log(
            f"  round {r + 1}/{rounds}: decode tok/s "
            + ", ".join(f"{e.name} {got[e.name]['decode_tok_s']:.1f}" for e in engines)
        )
    return rows


def _config_row(e: _Streamed, rows: list[dict], expert_cache: str) -> dict:
    """One streamed configuration's figures: medians over the rounds, and its ratios to
    the engine it is measured against (`e.base`) round by round."""
    b = e.base
    dec = [x[e.name]["decode_tok_s"] / x[b]["decode_tok_s"] for x in rows]
    cpu = [x[b]["decode_cpu_ms"] / x[e.name]["decode_cpu_ms"] for x in rows]
    pre = [x[e.name]["prefill_tok_s"] / x[b]["prefill_tok_s"] for x in rows]
    med = {
        key: statistics.median(x[e.name][key] for x in rows)
        for key in ("decode_tok_s", "prefill_tok_s", "hit_rate", "sync_ms", "read_ms",
                    "cache_ms", "mib_per_token")
    }  # fmt: skip
    res_ms = 1e3 / statistics.median(x[b]["decode_tok_s"] for x in rows)
    ms = 1e3 / med["decode_tok_s"]
    layers = len(e.sm.blocks)
    routed = e.base != "resident"
    return {
        "expert_cache": expert_cache,
        "routing": e.sm.cache.routing.label if routed else "model",
        "pipeline": bool(getattr(e.sm.switches[0], "_pipe", False)),
        "against": b,
        "expert_cache_slots": e.sm.cache.capacity,
        "share_of_experts": round(
            e.sm.cache.capacity / (e.sm.index.num_experts * e.sm.index.num_layers), 4
        ),
        "decode_ratio_median": round(statistics.median(dec), 4),
        "decode_ratios": [round(v, 4) for v in dec],
        # resident CPU ms per token / streamed: the same ratio by CPU time
        "decode_cpu_ratio_median": round(statistics.median(cpu), 4),
        "decode_cpu_ratios": [round(v, 4) for v in cpu],
        "prefill_ratio_median": round(statistics.median(pre), 4),
        "prefill_ratios": [round(v, 4) for v in pre],
        "decode_tok_s_median": round(med["decode_tok_s"], 2),
        "prefill_tok_s_median": round(med["prefill_tok_s"], 2),
        "hit_rate": round(med["hit_rate"], 4),
        "ms_per_token": {
            "total": round(ms, 3),
            "router_sync": round(med["sync_ms"], 3),
            "read_wait": round(med["read_ms"], 3),
            "cache_bookkeeping": round(med["cache_ms"], 3),
            "rest": round(ms - med["sync_ms"] - med["read_ms"] - med["cache_ms"], 3),
        },
        "requested_mib_per_token": round(med["mib_per_token"], 3),
        "overhead_us_per_moe_layer": round((ms - res_ms) * 1e3 / layers, 1),
        # trace-routed tokens are not the model's own: no claim (None)
        "tokens_match_resident": None
        if routed
        else all(x[e.name]["tokens"] == x[b]["tokens"] for x in rows),  # fmt: skip
    }


def _pipeline_gain(rows: list[dict]) -> dict:
    """The trace row's pipelined layer against the same row serial, round by round."""
    pl = [x["trace"]["decode_tok_s"] / x["trace_serial"]["decode_tok_s"] for x in rows]
    return {
        "pipelined_over_serial_median": round(statistics.median(pl), 4),
        "pipelined_over_serial": [round(v, 4) for v in pl],
    }


def _configs(engines: list, rows: list[dict], labels: dict[str, str]) -> dict:
    """Every streamed engine's row by name (`labels`: its expert-cache label, "trace"
    when absent); the trace row also carries its pipeline gain."""
    out = {
        e.name: _config_row(e, rows, labels.get(e.name, "trace"))
        for e in engines
        if isinstance(e, _Streamed)
    }
    if "trace" in out:
        out["trace"].update(_pipeline_gain(rows))
    return out


def _conditions(
    path: Path,
    cfg: dict,
    small: _Streamed,
    traced: list,
    rounds: int,
    prompt_tokens: int,
    decode_tokens: int,
    t_start: float,
) -> dict:
    """What the run measured on: the model, the machine, the versions and the rounds."""
    from ssdmoe_tui.bench import system

    return {
        "model": str(path),
        "config": {
            k: cfg.get(k)
            for k in (
                "num_hidden_layers",
                "hidden_size",
                "num_experts",
                "num_experts_per_tok",
                "moe_intermediate_size",
            )
        },
        "moe_layers": len(small.sm.blocks),
        "trace_row": _trace_conditions(traced),
        "dtype": str(small.sm.dtype).removeprefix("mlx.core."),
        "device": system.device_description(),
        "versions": system.versions(),
        "source": system.source_state(),
        "rounds": rounds,
        "prompt_tokens": prompt_tokens,
        "decode_tokens": decode_tokens,
        "order": "resident, small, every expert; rotated each round",
        "date": system.utc_now(),
        "seconds": round(time.perf_counter() - t_start, 1),
    }  # fmt: skip


def run_quick(
    path: Path | None = None,
    *,
    small_cache: int | None = None,
    rounds: int = 9,
    prompt_tokens: int = 16,
    decode_tokens: int = 16,
    dtype: str | None = None,
    log: Log = lambda _: None,
) -> dict:
    """Alternating rounds (>= 3) of resident, small-cache and every-expert runs; medians.
    `small_cache`: bytes of the small cache (default SMALL_CACHE)."""
    import gc

    import mlx.core as mx

    from ssdmoe_tui.engine.model.loader import parse_dtype

    if rounds < 3:
        from ssdmoe_tui.errors import BadValueError

        raise BadValueError(f"--rounds must be >= 3 (alternations for a median), got {rounds}")
    t_start = time.perf_counter()
    path = Path(path) if path is not None else quick_model(log)
    act = parse_dtype(dtype)
    small_label = SMALL_CACHE if small_cache is None else human_bytes(small_cache)
    log(f"loading {path}: resident mlx-lm, streamed {small_label}, streamed every expert")
    resident = _Resident(path, act)
    small = _Streamed("small", path, SMALL_CACHE if small_cache is None else small_cache, dtype)
    every = _Streamed("every", path, ALL_CACHE, dtype)
    traced = _trace_engines(act, dtype, log)
    engines: list = [resident, small, every, *traced]
    try:
        cfg = small.sm.config.get("text_config", small.sm.config)
        vocab = min(int(cfg["vocab_size"]), 1024)
        prompt = [(7 + 13 * i) % (vocab - 8) + 4 for i in range(prompt_tokens)]
        rows = _alternate(engines, prompt, rounds, decode_tokens, log)
        costs = layer_costs(resident, small, every)
        out_configs = _configs(engines, rows, {"small": small_label, "every": "all"})
        resident_med = {
            key: round(statistics.median(x["resident"][key] for x in rows), 2)
            for key in ("decode_tok_s", "prefill_tok_s")
        }
        return {
            "schema": 1,
            "kind": "bench-quick",
            "conditions": _conditions(
                path, cfg, small, traced, rounds, prompt_tokens, decode_tokens, t_start
            ),
            "resident": resident_med,
            "configs": out_configs,
            "per_moe_layer": costs,
        }
    finally:
        for e in engines:
            if isinstance(e, _Streamed):
                e.close()
        del resident
        gc.collect()
        mx.clear_cache()


def quick_table(r: dict) -> str:
    """A short table: ratios, the time split, and the per-layer costs."""
    res = r["resident"]
    dev = r["conditions"]["device"]
    lines = [
        f"bench-quick: {dev['backend']} ({dev['name']}, {dev['cpus']} cores), "
        f"{r['conditions']['rounds']} alternating "
        f"rounds, {r['conditions']['decode_tokens']} decoded tokens; resident mlx-lm "
        f"{res['decode_tok_s']:.1f} tok/s decode, {res['prefill_tok_s']:.1f} prefill",
        f"{'cache':<14}{'hit':>7}{'decode':>9}{'x res':>7}{'cpu x':>7}{'prefill x':>10}"
        f"{'ms/tok = sync + read + cache + rest':>38}{'us/layer':>10}{'same':>6}",
    ]
    for c in r["configs"].values():
        m = c["ms_per_token"]
        label = f"{c['expert_cache']} ({c['share_of_experts']:.0%})" + (
            "" if c.get("pipeline", True) else " serial"
        )
        split = (
            f"{m['total']:.2f} = {m['router_sync']:.2f} + {m['read_wait']:.2f} + "
            f"{m['cache_bookkeeping']:.2f} + {m['rest']:.2f}"
        )
        lines.append(
            f"{label:<14}{c['hit_rate']:>7.1%}{c['decode_tok_s_median']:>9.1f}"
            f"{c['decode_ratio_median']:>7.3f}{c['decode_cpu_ratio_median']:>7.3f}"
            f"{c['prefill_ratio_median']:>10.3f}{split:>38}"
            f"{c['overhead_us_per_moe_layer']:>10.1f}{_same(c['tokens_match_resident']):>6}"
        )
    t = r["configs"].get("trace")
    if t is not None:
        tc = r["conditions"]["trace_row"]
        lines.append(
            f"trace rows: {t['routing']}, first {tc['moe_layers']} layers x {tc['experts']} "
            f"experts, K={tc['k']}, {tc['slots']} slots; against resident mlx-lm at that K; "
            f"pipelined / serial {t['pipelined_over_serial_median']:.3f}"
        )
    p = r["per_moe_layer"]
    b, k = p["build_us"], p["kernels"]
    lines.append(
        f"per MoE layer: graph build {b['resident']:.0f} us resident / {b['streamed_held']:.0f} "
        f"held / {b['streamed_host_path']:.0f} host path; nodes {k['resident']} resident / "
        f"{k['streamed_held']} held ({k['streamed_held_mass_meter_on']} with the mass meter on, "
        f"+{k['mass_meter_per_read']} per read); host round trip {p['sync_us']:.0f} us"
    )
    return "\n".join(lines)


def _same(match: bool | None) -> str:
    return "-" if match is None else "yes" if match else "NO"

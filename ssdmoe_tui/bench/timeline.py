"""`ssdmoe bench --timeline`: the per-layer decode timeline, decode read-ahead off and on.

One engine, opened with read-ahead installed (`--prefetch` machinery: each layer's sync
also brings back the next layer's predicted routing); its governor is switched off or on
between runs, so both modes run the same process, kernels and page cache. Rounds
alternate the order (off, on / on, off); every run starts from an empty expert cache
(`ExpertCache.clear`: what a fresh engine sees) and the trace's first step. Per mode:
medians over the rounds (decode tok/s, CPU ms a token, hit rate, demand misses and bytes
a token) and the timeline's rows pooled over its runs (engine/model/timeline.py); then
a bare-sync probe, so a layer's sync splits into its queued compute and the latency.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import numpy as np

Log = Callable[[str], None]
MODES = {"off": (False,), "on": (True,), "both": (False, True)}


def _run(runner, prompt: list[int], n: int, on: bool) -> dict:  # noqa: ANN001
    """One run from an empty cache: figures over the decode (after the first token)."""
    import mlx.core as mx

    from ssdmoe_tui.bench.speculate import _restart_routing
    from ssdmoe_tui.engine.model.timeline import summarize
    from ssdmoe_tui.engine.run.runner import Done, Snapshot, TokenEvent

    sm = runner.sm
    cache, tl = sm.cache, sm.times.timeline
    cache.clear()
    cache.governor.enabled = on
    _restart_routing(sm)
    mx.reset_peak_memory()
    marks: dict[int, tuple] = {}
    result = None
    for ev in runner.stream(prompt, max_tokens=n):
        if isinstance(ev, TokenEvent):
            if ev.stats.generated_tokens == 1:
                tl.clear()  # the decode's rows only
            if ev.stats.generated_tokens in (1, n):
                marks[ev.stats.generated_tokens] = (Snapshot.take(sm), time.process_time(),
                                                    _mirror_state(cache))  # fmt: skip
        elif isinstance(ev, Done):
            result = ev.result
    assert result is not None and 1 in marks and n in marks
    d = marks[n][0] - marks[1][0]
    steps = max(n - 1, 1)
    used = d.prefetch_used
    (rows0, s0), (rows1, s1) = marks[1][2], marks[n][2]
    row_mib = cache.mirror.row_bytes / 2**20 if cache.mirror is not None else 0.0
    return {
        "tokens": result.tokens,
        "decode_tok_s": steps / d.t if d.t > 0 else 0.0,
        "cpu_ms_per_token": (marks[n][1] - marks[1][1]) * 1e3 / steps,
        "hit_rate": d.hit_rate,
        # misses a layer waited on (a used read-ahead counts as a miss, read early)
        "demand_misses_per_token": (d.misses - used) / steps,
        "mib_per_token": d.bytes_read / steps / 2**20,
        "prefetch_issued": d.prefetch_issued,
        "prefetch_used": used,
        "prefetch_dropped": d.prefetch_dropped,
        "router_sync_ms_per_token": d.router_sync_s * 1e3 / steps,
        "read_ms_per_token": d.read_s * 1e3 / steps,
        # `device` placement: rows copied host -> mirror, and the host time of those
        # copies (the stream wait before them included: engine/experts/mirror.py)
        "mirror_mib_per_token": (rows1 - rows0) * row_mib / steps,
        "mirror_ms_per_token": (s1 - s0) * 1e3 / steps,
        # MLX's peak over the run: a mirror copy that was not in place (a whole bank
        # copied) would show here as a bank's size above the other placements' peak
        "peak_memory_gib": mx.get_peak_memory() / 2**30,
        "rows": tl.array(),
        "governor": cache.governor.figures(),
        "summary": summarize(tl.array()),
    }


def _mirror_state(cache) -> tuple[int, float]:  # noqa: ANN001
    """(rows copied, seconds) of the cache's mirror so far; zeros without one."""
    m = cache.mirror
    return (m.rows, m.seconds) if m is not None else (0, 0.0)


def _probe(sm) -> dict:  # noqa: ANN001
    """`timeline.sync_probe` on the first MoE layer's call over K resident slots."""
    import mlx.core as mx

    from ssdmoe_tui.engine.model.timeline import sync_probe

    sw = sm.switches[0]
    comps = sm.cache.index.layers[0].components
    down = next(c for c in comps if c.name.split(".")[0] in ("down_proj", "fc2"))
    hidden = int(down.shape[0])
    k = max(sm.times.last_k or sm.trained_k, 1)
    x = mx.random.normal((1, 1, 1, 1, hidden)).astype(sm.dtype)
    slots = np.arange(k, dtype=np.int64).reshape(1, 1, k) % sm.cache.capacity
    mx.eval(x)
    return sync_probe(lambda: sw._run_slots(x, slots))


def run_timeline(runner, prompt: list[int], decode_tokens: int, rounds: int, mode: str,
                 log: Log) -> dict:  # noqa: ANN001  # fmt: skip
    """Rounds of the modes of `mode` (off / on / both) on `runner` (opened with prefetch)."""
    from ssdmoe_tui.engine.model.timeline import Timeline, summarize

    sm = runner.sm
    sm.tokenizer.eos_token_ids = set()  # exactly decode_tokens tokens
    if sm.times.timeline is None:
        sm.times.timeline = Timeline()
    modes = MODES[mode]
    log("warm-up: one run, read-ahead off (not counted)")
    reference = _run(runner, prompt, decode_tokens, False)["tokens"]
    runs: dict[bool, list[dict]] = {m: [] for m in modes}
    for r in range(rounds):
        for on in modes if r % 2 == 0 else modes[::-1]:
            runs[on].append(_run(runner, prompt, decode_tokens, on))
            x = runs[on][-1]
            log(f"round {r + 1}/{rounds} read-ahead {'on ' if on else 'off'}: "
                f"{x['decode_tok_s']:.2f} tok/s, {x['cpu_ms_per_token']:.1f} CPU ms/token, "
                f"hit {x['hit_rate']:.1%}, {x['mib_per_token']:.2f} MiB/token")  # fmt: skip
    out: dict = {
        "mode": "timeline",
        "rounds": rounds,
        "decode_tokens": decode_tokens,
        "prompt_tokens": len(prompt),
        "conditions": runner.conditions(),
        "governor_settings": {
            k: getattr(sm.cache.governor, k)
            for k in ("limit", "cold_tokens", "window", "min_precision", "reprobe_tokens")
        },
        "modes": {},
    }
    keys = ("decode_tok_s", "cpu_ms_per_token", "hit_rate", "demand_misses_per_token",
            "mib_per_token", "router_sync_ms_per_token", "read_ms_per_token",
            "mirror_mib_per_token", "mirror_ms_per_token", "peak_memory_gib")  # fmt: skip
    for on, mine in runs.items():
        name = "on" if on else "off"
        issued = sum(m["prefetch_issued"] for m in mine)
        used = sum(m["prefetch_used"] for m in mine)
        pooled = np.concatenate([m["rows"] for m in mine])
        out["modes"][name] = {
            **{k: round(statistics.median(m[k] for m in mine), 4) for k in keys},
            "per_round": {k: [round(m[k], 4) for m in mine] for k in ("decode_tok_s", "cpu_ms_per_token")},
            "prefetch_issued": issued,
            "prefetch_used": used,
            "prefetch_dropped": sum(m["prefetch_dropped"] for m in mine),
            "prefetch_precision": round(used / issued, 4) if issued else None,
            "same_tokens": all(m["tokens"] == reference for m in mine),
            "governor_last_run": mine[-1]["governor"],
            "timeline": summarize(pooled),
        }  # fmt: skip
    if len(runs) == 2:
        off, on = runs[False], runs[True]
        out["on_over_off"] = {
            "decode_tok_s": round(statistics.median(b["decode_tok_s"] / a["decode_tok_s"]
                                                    for a, b in zip(off, on, strict=True)), 4),
            "cpu_time": round(statistics.median(a["cpu_ms_per_token"] / b["cpu_ms_per_token"]
                                                for a, b in zip(off, on, strict=True)), 4),
        }  # fmt: skip
    out["sync_probe"] = _probe(sm)
    return out


def table(result: dict) -> str:
    """Per mode: the summary line, then the per-layer medians."""
    lines = []
    p = result.get("sync_probe") or {}
    if p:
        lines.append(f"sync probe: bare {p['bare_sync_ms']:.3f} ms, after one layer's expert "
                     f"compute {p['sync_after_one_layer_ms']:.3f} ms")  # fmt: skip
    for name, m in result["modes"].items():
        prec = "-" if m["prefetch_precision"] is None else f"{m['prefetch_precision']:.2f}"
        lines.append(
            f"read-ahead {name}: {m['decode_tok_s']:.2f} tok/s, {m['cpu_ms_per_token']:.1f} CPU "
            f"ms/token, hit {m['hit_rate']:.1%}, demand misses {m['demand_misses_per_token']:.2f}"
            f"/token, {m['mib_per_token']:.2f} MiB/token, guesses {m['prefetch_issued']} "
            f"(used {prec}), same tokens {'yes' if m['same_tokens'] else 'NO'}"
        )
        if m.get("mirror_mib_per_token"):
            lines.append(f"  mirror: {m['mirror_mib_per_token']:.2f} MiB/token copied host -> "
                         f"device, {m['mirror_ms_per_token']:.2f} ms/token in its syncs, MLX "
                         f"peak {m['peak_memory_gib']:.2f} GiB")  # fmt: skip
        head = (f"{'layer':>5} {'sync ms':>8} {'read ms':>8} {'pf wait':>8} {'layer ms':>8} "
                f"{'read KiB':>9} {'hits':>5} {'miss':>5} {'pf iss':>6} {'pf use':>6} {'pred':>5}")  # fmt: skip
        lines += [head, "-" * len(head)]
        for d in m["timeline"]["layers"]:
            pred = "-" if d["pred_precision"] is None else f"{d['pred_precision']:.2f}"
            lines.append(
                f"{d['layer']:>5} {d['sync_ms']:>8.3f} {d['read_ms']:>8.3f} "
                f"{d['pf_wait_ms']:>8.3f} {d['layer_ms']:>8.3f} {d['read_bytes_mean'] / 1024:>9.1f} "
                f"{d['hits_mean']:>5.2f} {d['misses_mean']:>5.2f} {d['pf_issued_mean']:>6.2f} "
                f"{d['pf_used_mean']:>6.2f} {pred:>5}"
            )
    r = result.get("on_over_off")
    if r:
        lines.append(
            f"on / off: decode {r['decode_tok_s']:.3f}x wall, {r['cpu_time']:.3f}x by CPU time"
        )
    return "\n".join(lines)

"""Rendering of a bench result: a terminal (or Markdown) table and an optional PNG plot.

The default table fits 100 columns: plain two-line column names and a legend under
it. `--wide` prints every column (the time split, read bandwidth, MLX peak, ceiling).
"""

from __future__ import annotations

import textwrap
from pathlib import Path

WIDTH = 100  # the default table and the lines under it fit this many columns

# (top line, bottom line, row key): the default table.
COMPACT = [
    ("", "K", "k"),
    ("expert", "cache", "cache_short"),
    ("decode", "tok/s", "decode"),
    ("prefill", "tok/s", "prefill"),
    ("cache", "hit", "hit_short"),
    ("MiB/tok", "asked", "req"),
    ("MiB/tok", "disk", "dev"),
    ("peak", "RSS", "rss_short"),
    ("% of", "limit", "ach"),
    ("vs", "mlx-lm", "ratio_short"),
    ("same", "tokens", "match"),
    ("router", "mass", "mass"),
]

LEGEND = (
    "K: experts per token. expert cache: budget (share of all experts; +pf: prefetch; serial: the pipelined layer off). "
    "decode, prefill: tokens per second. cache hit: share of expert lookups served from "
    "memory. MiB/tok asked: expert bytes read per decoded token; disk: the part the device "
    "delivered (the rest came from the OS page cache). peak RSS: process memory. % of limit: "
    "decode speed against the disk's limit for these bytes. vs mlx-lm: against plain "
    "resident mlx-lm at the same K. same tokens: output equal to mlx-lm's. router mass: the "
    "router's probability kept by the experts run, against the trained K (100% there). "
    "--wide shows every column."
)

# Every column (`--wide`, and the Markdown tables of docs/benchmarks.md).
COLUMNS = [
    ("K", "k"),
    ("cache", "cache"),
    ("page cache", "page_cache"),
    ("prefill tok/s", "prefill"),
    ("decode tok/s", "decode"),
    ("ms/tok = sync+read+cache+rest", "split"),
    ("hit", "hit"),
    ("MiB/tok req", "req"),
    ("MiB/tok dev", "dev"),
    ("read GB/s", "read"),
    ("peak MLX", "mlx"),
    ("peak RSS", "rss"),
    ("I/O ceiling tok/s", "ceiling"),
    ("achieved/ceiling", "ach"),
    ("resident tok/s", "resident"),
    ("streamed/resident", "ratio"),
    ("same tokens", "match"),
]


def _gib(b: int | None) -> str:
    return "-" if not b else f"{b / 2**30:.2f}G"


def _gib_short(b: int | None) -> str:
    """At most 5 characters: 2.40G, 12.3G, 123G."""
    if not b:
        return "-"
    g = b / 2**30
    return f"{g:.2f}G" if g < 10 else f"{g:.1f}G" if g < 100 else f"{g:.0f}G"


def _f(x: float | None, fmt: str) -> str:
    return "-" if x is None else format(x, fmt)


def _row(r: dict) -> dict[str, str]:
    ms = r["ms_per_token"]
    split = (
        "-"
        if ms["total"] is None
        else f"{ms['total']:.0f}={ms['router_sync']:.0f}+{ms['read_wait']:.0f}"
        f"+{ms['cache_bookkeeping']:.0f}+{ms['rest']:.0f}"
    )
    read = r.get("decode_read_gb_s")
    match = r.get("tokens_match_resident")
    return {
        "k": str(r["k"]),
        "cache": f"{r['expert_cache']} ({r['budget_over_expert_set']:.0%})"
        + (" +pf" if r.get("prefetch") else "")
        + (" serial" if r.get("pipeline") is False else ""),
        "page_cache": str(r.get("page_cache", "?")).split(" ")[0],
        "prefill": _f(r["prefill_tok_s"], ".1f"),
        "decode": _f(r["decode_tok_s"], ".2f"),
        "split": split,
        "hit": f"{r['hit_rate']:.1%}",
        "req": _f(r["requested_mib_per_token"], ".1f"),
        "dev": _f(r["device_mib_per_token"], ".1f"),
        "read": _f(read, ".2f"),
        "mlx": _gib(r["peak_mlx_memory_bytes"]),
        "rss": _gib(r["peak_rss_bytes"]),
        "ceiling": _f(r.get("io_ceiling_tok_s"), ".2f")
        if not r.get("io_ceiling_note")
        else "no reads",
        "ach": _f(r.get("achieved_over_ceiling"), ".0%"),
        "resident": _f(r.get("resident_decode_tok_s"), ".2f"),
        "ratio": _f(r.get("ratio_decode_vs_resident"), ".2f"),
        "match": "-"
        if match is None
        else ("yes" if match else f"first {r['tokens_common_prefix']}"),
        "cache_short": f"{r['expert_cache']} {r['budget_over_expert_set']:.0%}"
        + (" +pf" if r.get("prefetch") else "")
        + (" serial" if r.get("pipeline") is False else ""),
        "hit_short": f"{r['hit_rate']:.1%}" if r["hit_rate"] < 0.9995 else "100%",
        "ratio_short": _f(r.get("ratio_decode_vs_resident"), ".2f")
        + ("x" if r.get("ratio_decode_vs_resident") is not None else ""),
        "rss_short": _gib_short(r["peak_rss_bytes"]),
        "mass": "-" if r.get("routing_mass") is None else f"{r['routing_mass']:.1%}",
    }


def config_table(result: dict, markdown: bool = False, wide: bool = False) -> str:
    rows = [_row(r) for r in result.get("configs", [])]
    cols = [("", h, k) for h, k in COLUMNS] if wide else COMPACT
    keys = [k for _, _, k in cols]
    if markdown:
        heads = [f"{top} {bottom}".strip() for top, bottom, _ in cols]
        lines = ["| " + " | ".join(heads) + " |", "|" + "---|" * len(heads)]
        lines += ["| " + " | ".join(r[k] for k in keys) + " |" for r in rows]
        return "\n".join(lines)
    widths = [max(len(t), len(b), *(len(r[k]) for r in rows)) for t, b, k in cols]
    out = []
    if any(t for t, _, _ in cols):
        out.append("  ".join(t.rjust(w) for (t, _, _), w in zip(cols, widths, strict=True)))
    out.append("  ".join(b.rjust(w) for (_, b, _), w in zip(cols, widths, strict=True)))
    out += ["  ".join(r[k].rjust(w) for k, w in zip(keys, widths, strict=True)) for r in rows]
    return "\n".join(line.rstrip() for line in out)


def _prefetch_fragment(r: dict) -> str | None:
    if not r.get("prefetch"):
        return None
    return (
        f"precision {_f(r.get('prefetch_precision'), '.2f')}, "
        f"recall {_f(r.get('prefetch_recall'), '.2f')}, "
        f"decode {_f(r.get('prefetch_decode_vs_off'), '.2f')}x of off"
    )


def _prefill_fragment(r: dict) -> str | None:
    if r.get("prefill_over_read_all") is None:
        return None
    return f"union {r['prefill_union_share']:.0%} of the experts, {r['prefill_over_read_all']:.2f}x"


def _bound_fragment(r: dict) -> str | None:
    if r.get("prefill_bound_tok_s") is None:
        return None
    return (
        f"{r['prefill_tok_s']:.1f} tok/s, {r['prefill_requested_bytes'] / 2**20:.0f} MiB read, "
        f"bound {r['prefill_bound_tok_s']:.1f} tok/s (time {r['prefill_time_over_bound']:.2f}x it)"
    )


def _response_fragment(r: dict) -> str | None:
    if r.get("response_s") is None:  # a result from before these were recorded
        return None
    return (
        f"{r['first_token_s']:.2f} + {r['response_s'] - r['first_token_s']:.2f} = "
        f"{r['response_s']:.2f} s"
    )


def _chunks_fragment(r: dict) -> str | None:
    """Seconds per prefill chunk where the prompt took several (the first token's step
    left out): a long prompt's time chunk by chunk."""
    chunks = (r.get("prefill_chunks_s") or [])[:-1]
    if len(chunks) < 2:
        return None
    return ", ".join(f"{n}: {t:.2f}" for n, t in chunks) + " s"


def _storage_line(c: dict) -> str | None:
    """Where the bytes came from: drive, interface, file system, file cache, thermal."""
    st = c.get("storage")
    if not st:
        return None
    d, fs = st["drive"], st["file_system"]
    before = c.get("page_cache_before") or {}
    share = before.get("resident_share")
    cached = "unknown" if share is None else f"{share:.0%} resident"
    therm = c.get("thermal_before") or {}
    return (
        f"storage: {d['device']} ({d['interface']}, model {d['model']}) | {fs['type']} on "
        f"{fs['mount_point']} | model files in the OS file cache before the run: {cached} "
        f"| thermal: {therm.get('state', 'unknown')}"
    )


# Lines under the table: (label, per-configuration text or None to leave it out).
_FOOTERS = (
    (
        "peak MLX memory / (resident + cache budget + KV)",
        lambda r: (
            None
            if r.get("peak_over_memory_bound") is None
            else f"{r['peak_over_memory_bound']:.3f}"
        ),
    ),
    (
        "prefetch (+pf: next layer's router on this layer's input; trace-routed runs: "
        "co-occurrence of this layer's ids)",
        _prefetch_fragment,
    ),
    ("prefill vs reading every expert once per chunk (disk-bound)", _prefill_fragment),
    (
        "prefill against its bound (the bytes it read at the disk's rate + resident mlx-lm's "
        "compute of the prompt)",
        _bound_fragment,
    ),
    ("prefill chunks (tokens: seconds)", _chunks_fragment),
    ("response time (prefill to the first token + decode = total)", _response_fragment),
)


def summary(result: dict, markdown: bool = False, wide: bool = False) -> str:
    """Conditions, disk and baseline lines, then the table (and the quality table)."""
    lines = _header_lines(result)
    sep = "\n\n" if markdown else "\n"
    fit = (lambda t: t) if markdown or wide else _fit
    text = ("\n".join(f"- {x}" for x in lines) if markdown else "\n".join(map(fit, lines))) + sep
    if result.get("configs"):
        text += config_table(result, markdown, wide)
        text += "".join(sep + fit(n) for n in _notes(result["configs"], wide))
    quality = result.get("quality")
    if quality and "by_k" in quality:
        from ssdmoe_tui.bench.quality import quality_legend, quality_table

        trained = result["conditions"].get("trained_k") or max(int(k) for k in quality["by_k"])
        text += (
            sep * 2
            + fit(f"quality at each K: {quality['text']}, {quality['text_tokens']} tokens")
            + "\n"
            + quality_table({int(k): v for k, v in quality["by_k"].items()}, trained)
            + "\n"
            + quality_legend(trained, WIDTH if not (markdown or wide) else 10_000)
        )
    if result.get("fit"):
        from ssdmoe_tui.bench.fit import fit_table

        text += sep * 2 + fit_table(result["fit"], markdown)
    return text


def _header_lines(result: dict) -> list[str]:
    """The lines above the table: model, device, run, storage, disk, resident baseline."""
    c = result["conditions"]
    v = c["versions"]
    dev = c["device"]
    q = c.get("quantization") or {}
    lines = [
        f"model: {c['model']} ({c['model_type']}, {c['checkpoint_bytes'] / 2**30:.2f} GiB, "
        f"{c['num_layers_moe']} MoE layers x {c['num_experts']} experts x "
        f"{c['expert_bytes'] / 2**20:.2f} MiB, {q.get('bits', '?')}-bit gs{q.get('group_size', '?')})",
        f"device: {dev['backend']} {dev['name']} | dtype {c['dtype']} | mlx {v.get('mlx')} "
        f"mlx-lm {v.get('mlx_lm')} ssdmoe {v.get('ssdmoe')} | {c['date']}",
        f"prompt {c['prompt_tokens']} tokens, {c['decode_tokens']} decoded (greedy) | mode {c['mode']} "
        f"| routing {c.get('routing', 'model')}"
        + (" (tokens not the model's own)" if c.get("routing", "model") != "model" else "")
        + " "
        f"| queue depth {c['queue_depth']} | {_mem(c['memory'])}",
    ]
    placements = sorted(
        {r.get("slot_placement", "none") for r in result.get("configs", [])} - {"none"}
    )
    if placements:
        lines[1] += f" | slots {'/'.join(placements)} (MLX-CUDA placement)"
        if "host" in placements and c["memory"].get("cgroup_limit_bytes"):
            lines.append(
                "note: host-placed slots are CUDA driver memory, not charged to the cgroup cap"
            )
    where = _storage_line(c)
    if where:
        lines.append(where)
    disk = result.get("disk")
    if disk:
        parts = []
        for k, d in disk["by_k"].items():
            parts.append(f"K={k}: {d['gb_per_s']:.2f} GB/s")
        first = next(iter(disk["by_k"].values()), None)
        reader = f"{first['reader']} reader" if first else ""
        lines.append(
            f"disk random read ({disk['page_cache']}, {reader}, whole experts in batches of K): "
            + ", ".join(parts)
        )
    base = result.get("resident_baseline", {})
    if base.get("status") == "ran":
        parts = [f"K={k}: {b['decode_tok_s']} tok/s" for k, b in base["by_k"].items()]
        lines.append("resident mlx-lm decode: " + ", ".join(parts))
    else:
        lines.append(f"resident mlx-lm: {base.get('status', 'not run')}")
    return lines


def _notes(configs: list[dict], wide: bool) -> list[str]:
    """The lines below the table: the legend, then one line per footer that any row has."""
    notes = [LEGEND] if not wide else []
    if wide:
        notes.append(
            "ms/tok: decode ms per token = router sync + read wait + cache bookkeeping "
            "+ rest (compute, other)"
        )
    for label, fragment in _FOOTERS:
        parts = [
            f"K={r['k']} {r['expert_cache']}: {fragment(r)}"
            for r in configs
            if fragment(r) is not None
        ]
        if parts:
            notes.append(label + ": " + "; ".join(parts))
    return notes


def _fit(line: str) -> str:
    """One line wrapped to WIDTH columns (continuations indented)."""
    return textwrap.fill(line, WIDTH, subsequent_indent="  ", break_on_hyphens=False)


def _mem(m: dict) -> str:
    s = f"MemAvailable {m['mem_available_bytes'] / 2**30:.1f} GiB"
    if m.get("cgroup_limit_bytes"):
        s += f", cgroup cap {m['cgroup_limit_bytes'] / 2**30:.1f} GiB"
    return s


def write_plot(result: dict, out: Path) -> str:
    """PNG of decode tok/s and MiB/token vs K, one line per budget. Returns a message."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return (
            "--plot: matplotlib is not installed (pip install 'ssdmoe-tui[plot]' or "
            "pip install matplotlib); no plot written"
        )
    configs = result.get("configs", [])
    if not configs:
        return "--plot: no configurations measured; no plot written"
    by_budget: dict[str, list[dict]] = {}
    for r in configs:
        by_budget.setdefault(r["expert_cache"], []).append(r)
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    for budget, rows in by_budget.items():
        rows = sorted(rows, key=lambda r: r["k"])
        ks = [r["k"] for r in rows]
        ax1.plot(ks, [r["decode_tok_s"] or 0 for r in rows], marker="o", label=f"cache {budget}")
        ceil = [r.get("io_ceiling_tok_s") for r in rows]
        if all(x is not None for x in ceil):
            ax1.plot(ks, ceil, linestyle="--", alpha=0.6, label=f"I/O ceiling, {budget}")
        ax2.plot(
            ks,
            [r["requested_mib_per_token"] or 0 for r in rows],
            marker="o",
            label=f"requested, {budget}",
        )
        dev = [r.get("device_mib_per_token") for r in rows]
        if all(x is not None for x in dev):
            ax2.plot(ks, dev, linestyle="--", marker=".", label=f"from the device, {budget}")
    base = result.get("resident_baseline", {}).get("by_k", {})
    if base:
        ks = sorted(int(k) for k in base)
        ax1.plot(
            ks, [base[str(k)]["decode_tok_s"] for k in ks], marker="s", label="resident mlx-lm"
        )
    c = result["conditions"]
    ax1.set(xlabel="K (experts per token)", ylabel="decode tok/s", title="decode speed")
    ax2.set(xlabel="K (experts per token)", ylabel="MiB per token", title="expert bytes per token")
    for ax in (ax1, ax2):
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
    fig.suptitle(
        f"{Path(c['model']).name} ({c['model_type']}), {c['device']['backend']}, {c['mode']}"
        + (f", routing {c['routing']}" if c.get("routing", "model") != "model" else ""),
        fontsize=9,
    )
    fig.tight_layout()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return f"plot written to {out}"

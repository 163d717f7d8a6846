"""A per-layer decode timeline: what each MoE layer's host sync and reads cost, token by token.

Off by default, and then it costs one attribute test per layer call. On
($SSDMOE_TIMELINE=1, or `ssdmoe bench --timeline`), every one-token layer call that
syncs records a row: the time waiting for the router indices (which includes every
kernel queued before them: the earlier layers' compute), the time reading its misses on
the engine thread and waiting for a read-ahead, the bytes it read, its hits and misses,
the experts read ahead for the next layer and those of its own that it used, and how
many of the experts predicted for it (from the previous layer's input) it then routed
to. `sync_probe` times a bare sync, so the sync splits into its parts (docs/benchmarks.md).
"""

from __future__ import annotations

import os
import time

import numpy as np

TIMELINE_ENV = "SSDMOE_TIMELINE"
FIELDS = (
    "sync_ms",  # waiting for the router indices (the compute queued before them included)
    "read_ms",  # reading the layer's misses (engine thread)
    "pf_wait_ms",  # waiting for a read-ahead of this layer to land
    "layer_ms",  # the layer's whole host time, sync included
    "read_bytes",  # bytes of the misses read on demand
    "hits",
    "misses",
    "pf_issued",  # experts read ahead for the next layer
    "pf_used",  # experts read ahead for this layer and used now
    "pred_hit",  # experts predicted for this layer that it routed to
    "pred_n",  # experts predicted for this layer (0: no prediction)
)


def timeline_on() -> bool:
    """$SSDMOE_TIMELINE: `1`/`on` records the timeline from the load on."""
    return os.environ.get(TIMELINE_ENV, "").strip().lower() in ("1", "on", "true", "yes")


class Timeline:
    """Rows of (token, layer, *FIELDS), one per one-token layer call."""

    def __init__(self) -> None:
        self.rows: list[tuple] = []
        self._expect: dict[int, np.ndarray] = {}

    def clear(self) -> None:
        self.rows.clear()
        self._expect.clear()

    def expect(self, layer: int, ids: np.ndarray) -> None:
        """The experts predicted for `layer` (scored when it routes)."""
        self._expect[layer] = ids

    def scored(self, layer: int, routed: np.ndarray) -> tuple[int, int]:
        """(predicted experts `layer` routed to, experts predicted) and forget them."""
        ids = self._expect.pop(layer, None)
        if ids is None:
            return 0, 0
        return int(np.isin(ids, routed).sum()), len(ids)

    def record(self, token: int, layer: int, *values: float) -> None:
        self.rows.append((token, layer, *values))

    def array(self) -> np.ndarray:
        """(rows, 2 + len(FIELDS)) float64."""
        return np.array(self.rows, dtype=np.float64).reshape(-1, 2 + len(FIELDS))


def summarize(rows: np.ndarray) -> dict:
    """Per layer: medians of the times, means of the counts, and the prediction's
    precision (routed / predicted); per token: the sums' medians."""
    out: dict = {"layers": [], "per_token": {}}
    if not len(rows):
        return out
    names = ("token", "layer", *FIELDS)
    col = {n: i for i, n in enumerate(names)}
    for layer in np.unique(rows[:, 1]).astype(int):
        r = rows[rows[:, 1] == layer]
        d: dict = {"layer": int(layer), "calls": len(r)}
        for f in ("sync_ms", "read_ms", "pf_wait_ms", "layer_ms"):
            d[f] = round(float(np.median(r[:, col[f]])), 4)
        for f in ("read_bytes", "hits", "misses", "pf_issued", "pf_used"):
            d[f + "_mean"] = round(float(r[:, col[f]].mean()), 4)
        n = r[:, col["pred_n"]].sum()
        d["pred_precision"] = round(float(r[:, col["pred_hit"]].sum() / n), 4) if n else None
        out["layers"].append(d)
    per_tok = {}
    for f in ("sync_ms", "read_ms", "pf_wait_ms", "layer_ms", "read_bytes", "misses", "pf_issued"):
        sums = [rows[rows[:, 0] == t, col[f]].sum() for t in np.unique(rows[:, 0])]
        per_tok[f] = round(float(np.median(sums)), 4)
    out["per_token"] = per_tok
    return out


def sync_probe(run_layer, repeats: int = 30) -> dict:
    """Median ms of a host sync with nothing queued (an `mx.eval` of a fresh scalar), and
    with one layer's expert compute queued before it (`run_layer()` returns that lazy
    array), and of that compute's sync alone minus the bare one: a layer's sync wait in
    the timeline is its queued compute plus the bare latency."""
    import mlx.core as mx

    bare, layer = [], []
    for _ in range(repeats):
        a = mx.array(1.0) + 1.0
        t0 = time.perf_counter()
        mx.eval(a)
        bare.append(time.perf_counter() - t0)
        y = run_layer()
        t0 = time.perf_counter()
        mx.eval(y)
        layer.append(time.perf_counter() - t0)
    b, lay = float(np.median(bare)) * 1e3, float(np.median(layer)) * 1e3
    return {"bare_sync_ms": round(b, 4), "sync_after_one_layer_ms": round(lay, 4),
            "one_layer_compute_ms": round(lay - b, 4), "repeats": repeats}  # fmt: skip

"""Per-rank counters of a distributed run, summed and shown as one line."""

from __future__ import annotations

from ssdmoe_tui.engine.distributed.expert_map import ExpertMap


class DecodeMeter:
    """Counters at the start, at the first token (end of prefill) and now."""

    def __init__(self, dist, sm) -> None:
        self.dist, self.sm = dist, sm
        self._start = self._read()
        self._first: dict | None = None

    def _read(self) -> dict:
        from ssdmoe_tui.engine.experts import iostats

        c, d = self.sm.cache.counters, self.dist.counters
        return {
            "hits": c.hits,
            "misses": c.misses,
            "requested_bytes": c.bytes_read,
            "device_bytes": iostats.device_read_bytes(),
            "read_s": c.read_s,
            "prefetch_issued": c.prefetch_issued,
            "prefetch_used": c.prefetch_used,
            "prefetch_dropped": c.prefetch_dropped,
            "all_sum_s": d.all_sum_s,
            "all_sum_calls": d.all_sum_calls,
            "expert_compute_s": d.expert_compute_s,
        }

    def on_token(self, generated: int) -> None:
        if generated == 1:
            self._first = self._read()

    def window(self) -> dict:
        """decode_*: from the first token on; the rest: the whole run."""
        end = self._read()
        first = self._first or end

        def diff(a: dict, b: dict, key: str):
            if a[key] is None or b[key] is None:
                return None
            v = b[key] - a[key]
            return round(v, 6) if isinstance(v, float) else v

        out = {f"decode_{k}": diff(first, end, k) for k in end}
        out.update({k: diff(self._start, end, k) for k in end})
        return out


def decode_payload_bytes(sm) -> int:
    """One decode step's per-layer all_sum: K rows of the hidden size."""
    c = sm.cache.banks[0]
    name = "down_proj.weight" if "down_proj.weight" in c else "fc2.weight"
    return int(c[name].shape[1]) * max(sm.times.last_k, 1) * sm.dtype.size


def rank_stats(dist, sm, window: dict | None = None) -> dict:
    """This rank's numbers for the run's stats (bytes, hits, all_sum time, owned share)."""
    m = dist.partition(sm.index).map
    c = dist.counters
    out = {
        "rank": dist.rank,
        "owned_experts": m.owned_count(dist.rank),
        "owned_fraction": round(m.owned_count(dist.rank) / (m.num_layers * m.num_experts), 4),
        "expert_cache_slots": sm.cache.capacity,
        "expert_cache_budget_bytes": sm.cache.budget_bytes,
        "all_sum_s": round(c.all_sum_s, 6),
        "all_sum_calls": c.all_sum_calls,
        "all_sum_bytes": c.all_sum_bytes,
        "expert_compute_s": round(c.expert_compute_s, 6),
    }
    if window:
        out.update(window)
    return out


def summarize(per_rank: list[dict], steps: int, emap: ExpertMap, latency_s: float | None) -> dict:
    """Per-rank and total numbers for bench JSON / `generate --json`."""
    steps = max(steps, 1)

    def total(key: str):
        vals = [r.get(key) for r in per_rank]
        return None if any(v is None for v in vals) else sum(vals)

    hits, misses = total("decode_hits") or 0, total("decode_misses") or 0
    out = {
        "ranks": len(per_rank),
        "expert_map": emap.as_dict(),
        "per_rank": per_rank,
        "total_requested_mib_per_token": _mib(total("decode_requested_bytes"), steps),
        "total_device_mib_per_token": _mib(total("decode_device_bytes"), steps),
        "hit_rate": round(hits / (hits + misses), 4) if hits + misses else None,
        "all_sum_ms_per_token": round(
            max(r.get("decode_all_sum_s", 0.0) for r in per_rank) * 1e3 / steps, 4
        ),
        "all_sum_calls_per_token": round(
            max(r.get("decode_all_sum_calls", 0) for r in per_rank) / steps, 2
        ),
        "all_sum_latency_us": None if latency_s is None else round(latency_s * 1e6, 1),
        "note": "all_sum time = transfer + waiting for the slower rank; "
        "all_sum_latency_us = one decode-sized all_sum alone (median)",
    }
    for r in per_rank:
        r["requested_mib_per_token"] = _mib(r.get("decode_requested_bytes"), steps)
        r["device_mib_per_token"] = _mib(r.get("decode_device_bytes"), steps)
        h, mi = r.get("decode_hits", 0), r.get("decode_misses", 0)
        r["hit_rate"] = round(h / (h + mi), 4) if h + mi else None
        r["all_sum_ms_per_token"] = round(r.get("decode_all_sum_s", 0.0) * 1e3 / steps, 4)
    return out


def _mib(b, steps: int):
    return None if b is None else round(b / steps / 2**20, 4)


def summary_line(s: dict) -> str:
    """One line for the terminal: per-rank MiB/token and hit rate, the all_sum cost."""
    ranks = " | ".join(
        f"rank {r['rank']}: {r['owned_fraction']:.0%} of experts, "
        f"{r['requested_mib_per_token'] or 0:.2f} MiB/tok, hit {r['hit_rate'] or 0:.1%}"
        for r in s["per_rank"]
    )
    lat = s.get("all_sum_latency_us")
    return (
        f"[{s['ranks']} ranks | {ranks} | total {s['total_requested_mib_per_token'] or 0:.2f} "
        f"MiB/tok | all_sum {s['all_sum_ms_per_token']:.2f} ms/tok"
        + (f", {lat:.0f} us each alone" if lat is not None else "")
        + "]"
    )

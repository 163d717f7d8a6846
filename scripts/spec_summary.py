"""What to read from `ssdmoe bench --speculate --json` files, one line a row, with issue 43
item 3's targets beside it (scripts/gpu_spec.sh runs it after its demo step):

    python scripts/spec_summary.py OUTDIR/spec-demo-*.json

Per row: the wall and CPU-time ratios against plain decode, the acceptance, the depths
the governor used (auto rows), its probes, whether greedy tokens equal plain greedy, and
for oracle rows where each run's reply left the first plain run (None: never; on
MLX-CUDA a verify chunk flips near-ties) and how many proposals the oracle re-anchored
or left empty. A target line says met / NOT met where the file names one.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

# file stem -> (speculate label or None for every row, depth, the least ratio)
TARGETS = {
    "spec-demo-oracle": [("oracle:1", "auto", 1.8)],
    "spec-demo-chat": [(None, "auto", 0.97)],
}


def row_line(r: dict) -> str:
    acc = "-" if r.get("acceptance") is None else f"{r['acceptance']:.0%}"
    depths = ",".join(f"{d}:{n}" for d, n in sorted(r.get("depths", {}).items()))
    line = (
        f"  {r['speculate'] + (' exact' if r.get('exact_verify') else ''):<10} depth {r['depth']!s:<4} ratio {r.get('ratio') or 0:.2f} "
        f"(cpu {r.get('cpu_ratio') or 0:.2f})  accept {acc:>4}  same {r['same_tokens']}  "
        f"probes {r.get('probes', 0)}  depths {depths}"
    )
    if "oracle_diverged_at" in r:
        line += (
            f"\n{'':13}oracle: left plain at {r['oracle_diverged_at']}, "
            f"references {r.get('oracle_references')}, re-anchored {r.get('oracle_reanchored')}, "
            f"empty {r.get('oracle_unanchored')}"
        )
    return line


def summary(path: Path) -> list[str]:
    data = json.loads(path.read_text())
    rows = data.get("rows", [])
    out = [
        f"{path.name}: {data.get('rounds')} of {data.get('rounds_asked')} rounds, "
        f"{data.get('decode_tokens')} tokens, load {data.get('load')}, "
        f"plain {rows[0]['plain_tok_s'] if rows else '-'} tok/s"
    ]
    out += [row_line(r) for r in rows]
    for label, depth, least in TARGETS.get(path.stem, []):
        for r in rows:
            if r.get("exact_verify"):
                continue  # the targets are plain verify's; exact rows say what it costs
            if (label is None or r["speculate"] == label) and str(r["depth"]) == depth:
                met = (r.get("ratio") or 0) >= least
                out.append(
                    f"  target {r['speculate']} {depth} >= {least}: "
                    f"{'met' if met else 'NOT met'} ({r.get('ratio')})"
                )
    return out


def main(argv: list[str]) -> int:
    if not argv:
        print("usage: spec_summary.py SPEC.json [...]", file=sys.stderr)
        return 2
    for name in argv:
        path = Path(name)
        try:
            lines = summary(path)
        except (OSError, ValueError, KeyError) as exc:
            lines = [f"{path.name}: unreadable ({exc.__class__.__name__}: {exc})"]
        print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))

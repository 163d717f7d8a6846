"""Where a batched decode step's host time goes, from a py-spy `--native` raw profile of
`scripts/batch_vs_mlx.py` (docs/measurements/2026-12-07-h100-ninth/calls/y.sh):

    py-spy record --native --rate 500 --idle --format raw -o OUT.txt -- \\
        python scripts/batch_vs_mlx.py --out DIR --batch 8 --rounds 2 --host-split ...
    python scripts/batch_spy_summary.py OUT.txt

Each sample inside the engine's batch (`engine_batch`) is put at the deepest line of
`engine/run/batch.py` on its stack, and inside mlx-lm's (`ResidentBatch.batch`) at the
deepest line of `mlx_lm/generate.py`, with the innermost named frame it was in (a wait on
the device shows as a CUDA or synchronisation call there; bare addresses are skipped). Why: the H100 of
2026-12-07 left 8.2 ms of the engine's 31 ms B = 8 step outside its build, queue and sync
(docs/benchmarks.md, "2026-12-07, ninth session").
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import Counter
from pathlib import Path

from loop_profile import raw_samples  # the py-spy raw format's one reader (scripts/)

_SIDES = {
    "engine": ("engine_batch (", re.compile(r"\(ssdmoe_tui/engine/run/batch\.py:\d+\)")),
    "mlx": ("batch (ssdmoe_tui/bench/batch_compare.py", re.compile(r"\(mlx_lm/generate\.py:\d+\)")),
}


def summarize(lines: list[str], top: int) -> dict[str, list[tuple[str, int, float]]]:
    """side -> [(frame at its deepest line | innermost frame, samples, share of side)]."""
    out: dict[str, list[tuple[str, int, float]]] = {}
    for side, (marker, line_re) in _SIDES.items():
        counts: Counter[str] = Counter()
        total = 0
        for frames, n in raw_samples(lines):
            # the side's own frame ("batch (" is also the tail of "engine_batch (")
            if not any(f.startswith(marker) for f in frames):
                continue
            at = [i for i, f in enumerate(frames) if line_re.search(f)]
            where = frames[at[-1]] if at else "(outside)"
            named = [f for f in frames if not f.startswith("0x")]  # unsymbolized: skipped
            counts[f"{where} | {(named[-1] if named else frames[-1])[:80]}"] += n
            total += n
        out[side] = [(k, v, round(v / total, 4)) for k, v in counts.most_common(top)]
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    ap.add_argument("profile", type=Path, help="py-spy --format raw output")
    ap.add_argument("--top", type=int, default=15)
    args = ap.parse_args()
    try:
        lines = args.profile.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError as e:
        print(f"batch_spy_summary: {args.profile}: {e.strerror or e}", file=sys.stderr)
        return 2
    for side, rows in summarize(lines, args.top).items():
        print(f"\n{side}: samples by deepest loop line | innermost frame")
        for where, n, share in rows:
            print(f"  {share:6.1%} {n:6d}  {where}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

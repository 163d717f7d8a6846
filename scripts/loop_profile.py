"""Where the decode loops' host time goes, from a py-spy profile of `ssdmoe bench`:

    py-spy record --rate 1000 --idle --format raw -o OUT.txt --nonblocking -- \\
        python -m ssdmoe_tui.cli bench --speculate none,ngram \\
        --prompt-file scripts/spec_prompts/chat.txt --decode-tokens 200 --rounds 8
    python scripts/loop_profile.py OUT.txt --rate 1000 --json OUT.json

For plain decode (`Runner._decode_loop`) and the speculative loop (`spec_loop`), each
sample is put where the loop's own frame was: waiting for the device (the lines that
call `mx.async_eval` or `.item()`: py-spy sets the C wait on either), building the next
step (`Runner._schedule`), or anything else the loop does per token (its bookkeeping,
by the function it called). On a host-bound GPU token (the demo's 1 ms on the H100)
the bookkeeping is what the speculative loop costs over plain; divide each figure by
the tokens each loop produced (the bench's rounds x configurations x decode tokens).
Why a script: docs/benchmarks.md, "2026-12-06, fourth session".
"""

from __future__ import annotations

import argparse
import inspect
import json
import re
import sys
from collections import Counter
from collections.abc import Iterable, Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

LOOPS = {"Runner._decode_loop": "plain", "spec_loop": "spec"}
BUILD = "Runner._schedule"


def wait_lines() -> dict[str, set[int]]:
    """Each loop's lines that wait on the device (async_eval / .item())."""
    from ssdmoe_tui.engine.run.runner import Runner
    from ssdmoe_tui.engine.spec.loop import spec_loop

    out = {}
    for name, fn in (("Runner._decode_loop", Runner._decode_loop), ("spec_loop", spec_loop)):
        lines, first = inspect.getsourcelines(fn)
        out[name] = {
            first + i for i, text in enumerate(lines) if "async_eval(" in text or ".item()" in text
        }
    return out


def raw_samples(lines: Iterable[str]) -> Iterator[tuple[list[str], int]]:
    """(frames, outermost first; samples) of each line of a py-spy `--format raw`
    profile ("frame;frame;... count"); lines without a count are skipped."""
    for line in lines:
        stack, _, count = line.rstrip("\n").rpartition(" ")
        if count.isdigit():
            yield stack.split(";"), int(count)


def profile(path: Path, rate: float) -> dict:
    waits = wait_lines()
    split: dict[str, Counter] = {name: Counter() for name in LOOPS.values()}
    frame = re.compile(r"^(\S+) \((.*):(\d+)\)$")
    with path.open(encoding="utf-8") as f:
        for frames, count in raw_samples(f):
            for i in range(len(frames) - 1, -1, -1):  # the innermost loop frame
                m = frame.match(frames[i])
                if m is None or m.group(1) not in LOOPS:
                    continue
                below = frames[i + 1].split(" ")[0] if i + 1 < len(frames) else ""
                lineno = int(m.group(3))
                if below == BUILD:
                    what = "build"
                elif not below and lineno in waits[m.group(1)]:
                    what = "wait"
                else:
                    what = f"other: {below or 'the loop itself'}"
                split[LOOPS[m.group(1)]][what] += count
                break
    ms = 1e3 / rate
    return {
        loop: {
            "total_ms": round(sum(c.values()) * ms, 1),
            "wait_ms": round(c["wait"] * ms, 1),
            "build_ms": round(c["build"] * ms, 1),
            "other_ms": round(sum(n for k, n in c.items() if k.startswith("other")) * ms, 1),
            "other": {k[7:]: round(n * ms, 1) for k, n in c.most_common() if k.startswith("other")},
        }
        for loop, c in split.items()
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    ap.add_argument("raw", type=Path, help="py-spy's --format raw output")
    ap.add_argument("--rate", type=float, default=1000.0, help="py-spy's --rate (samples/s)")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    if not args.raw.is_file():
        print(f"loop_profile: not a file: {args.raw}", file=sys.stderr)
        return 2
    result = profile(args.raw, args.rate)
    for loop, r in result.items():
        print(f"{loop}: {r['total_ms']} ms = wait {r['wait_ms']} + build {r['build_ms']} "
              f"+ other {r['other_ms']}")  # fmt: skip
        for name, v in list(r["other"].items())[:12]:
            print(f"    {v:>8} ms  {name}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

#!/usr/bin/env python3
"""Regenerate the bad-input table in docs/reliability.md from tests/helpers/bad_inputs.py.

    python scripts/bad_inputs_table.py            # rewrite the table in place
    python scripts/bad_inputs_table.py --check    # exit 1 if a case breaks the contract

Every case runs as the test runs it (real CLI in process, real loaders, real files in a
scratch folder, SSDMOE_HOME and the lock folder throwaway), under an address-space cap,
pending ones included (marked with their owner). Scratch paths print as `<tmp>`.
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
DOC = ROOT / "docs" / "reliability.md"
BEGIN, END = "<!-- bad-inputs:begin -->", "<!-- bad-inputs:end -->"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0], allow_abbrev=False)
    ap.add_argument("--check", action="store_true", help="do not write; exit 1 on a failure")
    args = ap.parse_args()
    resource.setrlimit(resource.RLIMIT_AS, (6 << 30, 6 << 30))
    scratch = Path(tempfile.mkdtemp(prefix="ssdmoe-bad-inputs-"))
    os.environ["SSDMOE_HOME"] = str(scratch / "home")
    os.environ["SSDMOE_LOCK_DIR"] = str(scratch / "locks")
    from tests.helpers.bad_inputs import CASES, PENDING, problems
    from tests.helpers.checkpoints import build

    built: dict[str, Path] = {}

    def model() -> Path:
        if "m" not in built:
            built["m"] = build("qwen3_moe", scratch / "tiny-qwen3_moe")
        return built["m"]

    rows, failed, t0 = [], 0, time.monotonic()
    for i, case in enumerate(CASES, 1):
        tmp = scratch / f"case-{i}"
        tmp.mkdir()
        try:
            outcome = case.run(tmp, model)
            bad = problems(outcome)
            message = outcome.message
        except MemoryError:
            bad, message = ["MemoryError (over the 6 GiB cap)"], ""
        message = " ".join(message.split())
        message = re.sub(r"/tmp/[^\s:'\")]*?(case-\d+|tmp\w+)", "<tmp>", message)
        message = message.replace(str(scratch), "<tmp>")[:160].replace("|", "\\|")
        if not bad:
            status = "ok"
        elif case.id in PENDING:
            status = f"pending ({PENDING[case.id].split(':')[0]}): {'; '.join(bad)}"
        else:
            status, failed = f"**FAILS**: {'; '.join(bad)}", failed + 1
        what = case.what.replace("|", "\\|")
        if len(what) > 60:
            what = what[:57] + "..."
        rows.append(f"| {i} | `{case.id}` | {what} | {status} | {message} |")
    ok = sum(1 for r in rows if "| ok |" in r)
    summary = (
        f"{len(CASES)} bad inputs, {ok} answered in one line naming the file or value, "
        f"{len(CASES) - ok - failed} pending other work, {failed} failing "
        f"({time.monotonic() - t0:.0f} s, {time.strftime('%Y-%m-%d', time.gmtime())})."
    )
    table = "\n".join(
        [summary, "", "| # | case | input | result | message |", "|---|---|---|---|---|", *rows]
    )
    print(summary)
    if args.check:
        return 1 if failed else 0
    text = DOC.read_text(encoding="utf-8")
    if BEGIN not in text or END not in text:
        raise SystemExit(f"{DOC}: no {BEGIN} ... {END} markers")
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    DOC.write_text(f"{head}{BEGIN}\n{table}\n{END}{tail}", encoding="utf-8")
    print(f"wrote {DOC}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

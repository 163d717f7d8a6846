#!/usr/bin/env python3
"""List the functions longer than a limit (60 lines by default), longest first.

    python scripts/long_functions.py                 # ssdmoe_tui/, over 60 lines
    python scripts/long_functions.py --limit 40 scripts tests

A function's length is its lines from `def` (decorators excluded) to its last line, as
Python's AST counts them: docstrings and comments inside count, nested functions count
in their parent and again on their own. Exit status 0; the count is the last line.
"""

from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def long_functions(paths: list[Path], limit: int) -> list[tuple[int, str]]:
    """(lines, "file:line qualified.name") for every function over `limit` lines."""
    out = []
    for path in paths:
        files = sorted(path.rglob("*.py")) if path.is_dir() else [path]
        for file in files:
            tree = ast.parse(file.read_text(), str(file))
            out += _walk(tree, file.relative_to(ROOT), "", limit)
    return sorted(out, key=lambda row: (-row[0], row[1]))


def _walk(node: ast.AST, file: Path, prefix: str, limit: int) -> list[tuple[int, str]]:
    out = []
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            name = f"{prefix}{child.name}"
            if not isinstance(child, ast.ClassDef):
                lines = child.end_lineno - child.lineno + 1
                if lines > limit:
                    out.append((lines, f"{file}:{child.lineno} {name}"))
            out += _walk(child, file, name + ".", limit)
        else:
            out += _walk(child, file, prefix, limit)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0], allow_abbrev=False)
    ap.add_argument("paths", nargs="*", type=Path, default=[ROOT / "ssdmoe_tui"])
    ap.add_argument("--limit", type=int, default=60, help="longest allowed (lines)")
    args = ap.parse_args()
    rows = long_functions([p.resolve() for p in args.paths], args.limit)
    for lines, where in rows:
        print(f"{lines:4d}  {where}")
    print(f"{len(rows)} functions over {args.limit} lines")
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Check that every file, folder, module and function docs/*.md (and README.md) names exists.

    python scripts/check_docs.py          # one line per stale name, exit 1 if any

What counts as a name: a path with a slash under one of the repository's folders
(`tests/app/test_ui_app.py`, `engine/run/service.py`, `ssdmoe_tui/ui/`), a file name in
backticks (`test_fuzz.py`, `app.tcss`), a dotted module (`ssdmoe_tui.engine.run.service`),
and a function or class after a module (`sessions/turns.build_prompt`,
`tests/app/test_ui_app.py::test_quit_asks_while_streaming`, `ui/fmt.fmt_bytes`).
A path is looked up from the repository root, then under ssdmoe_tui/ (the docs name the
package's modules by their path inside it); a bare file name anywhere in the tree; `<x>`
and `*` are wildcards, `/.../` any folders; an `@path` is the app's attachment syntax in
an example, not a file of the tree. URLs, absolute and home paths, and the sibling ../shared are
outside the repository and not checked. Behaviour claims are not checked: a script
cannot read them; the review that goes with this script does.
"""

from __future__ import annotations

import ast
import re
import sys
from dataclasses import dataclass
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = [*sorted((ROOT / "docs").glob("*.md")), ROOT / "README.md"]
# The package's own docstrings and comments cite files too (`tests/... checks this`).
SOURCES = sorted((ROOT / "ssdmoe_tui").rglob("*.py"))
TOP = ("ssdmoe_tui", "tests", "scripts", "docs", "native", ".ci")
PACKAGE_DIRS = tuple(
    p.name for p in (ROOT / "ssdmoe_tui").iterdir() if p.is_dir() and p.name != "__pycache__"
)
EXTENSIONS = ("py", "md", "toml", "tcss", "c", "h", "sh", "json", "jsonl", "txt", "csv", "gz")
FOLDERS = "|".join(re.escape(d) for d in (*TOP, *PACKAGE_DIRS))
# A path under a known folder: letters, digits, _ . - / < > * (wildcards), optionally
# followed by ::name or .name (a function in that module).
PATH = re.compile(
    rf"(?<![\w/.~@-])(?:\.\./)?((?:{FOLDERS})/[\w./<>*-]*)(?:::(\w+))?",
)
# Bare file names of code only: a bare `history.json` or `table.md` is a file the program
# or a user writes, not one in the tree.
BARE_FILE = re.compile(r"`([\w-]+\.(?:py|tcss|sh|c|h|toml))`")
DOTTED = re.compile(r"(?<![\w.])(ssdmoe_tui(?:\.\w+)+)")


@dataclass(frozen=True)
class Stale:
    doc: Path
    line: int
    name: str
    why: str

    def __str__(self) -> str:
        return f"{self.doc.relative_to(ROOT)}:{self.line}: {self.name}: {self.why}"


@cache
def tracked() -> tuple[Path, ...]:
    """Every file in the tree that is not a build output or a virtual environment."""
    skip = {".git", ".venv", "build", "__pycache__", ".pytest_cache", ".ruff_cache"}
    return tuple(
        p for p in ROOT.rglob("*") if p.is_file() and not skip & set(p.relative_to(ROOT).parts)
    )


@cache
def defined_names(path: Path) -> frozenset[str]:
    """Top-level functions, classes and assignments of a module, and every class's methods
    (as `name` and `Class.name`)."""
    names: set[str] = set()
    for node in ast.parse(path.read_text(), str(path)).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        if isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef):
                    names |= {item.name, f"{node.name}.{item.name}"}
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {t.id for t in targets if isinstance(t, ast.Name)}
    return frozenset(names)


def candidates(rel: str) -> list[Path]:
    """Where a doc's path may point: from the root, or inside the package."""
    rel = rel.rstrip("/")
    out = [ROOT / rel]
    if not rel.startswith(TOP):
        out.append(ROOT / "ssdmoe_tui" / rel)
    if "." not in rel.rsplit("/", 1)[-1]:  # `sessions/checkpoints`: a module named by path
        out += [p.with_name(p.name + ".py") for p in out]
    return out


def resolve(rel: str) -> Path | None:
    """The file or folder `rel` names (a wildcard matches at least one), else None."""
    for path in candidates(rel):
        if "<" in rel or "*" in rel or "/.../" in rel:
            pattern = re.sub(r"<[^>]*>", "*", str(path.relative_to(ROOT)))
            pattern = pattern.replace("/.../", "/**/")
            if any(ROOT.glob(pattern)):
                return path
        elif path.exists():
            return path
    return None


def check_path(rel: str, member: str | None) -> str | None:
    """Why `rel` (and `member` in it) is stale, or None when it exists."""
    rel = rel.rstrip(".,;:)")
    if rel.endswith(".py.") or rel.endswith("/."):
        rel = rel[:-1]
    found = resolve(rel)
    if found is None and member is None:
        # `sessions/turns.build_prompt`: a module path and a name defined in it.
        module, _, name = rel.rpartition(".")
        if name and not name.isdigit() and name not in EXTENSIONS:
            module_file = resolve(module + ".py")
            if module_file is not None:
                return check_member(module_file, name)
    if found is None:
        return "no such file or folder"
    if member is not None:
        return check_member(found, member)
    return None


def check_member(path: Path, name: str) -> str | None:
    if path.suffix != ".py" or not path.is_file():
        return None
    if name in defined_names(path):
        return None
    return f"{name} is not defined in {path.relative_to(ROOT)}"


def check_dotted(name: str) -> str | None:
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        base = ROOT.joinpath(*parts[:cut])
        rest = parts[cut:]
        if base.is_dir() or any(base.parent.glob(base.name + ".*")):  # package, module, .so
            if not rest:
                return None
            module = base / "__init__.py" if base.is_dir() else base.with_suffix(".py")
            if not module.is_file():
                return f"{rest[0]} is not in {base.relative_to(ROOT)}"
            return check_member(module, ".".join(rest[:2]) if len(rest) > 1 else rest[0])
    return "no such module"


def check_bare(name: str) -> str | None:
    if any(p.name == name for p in tracked()):
        return None
    return "no file of that name in the tree"


def stale_in(doc: Path) -> list[Stale]:
    """The stale names in a doc; in a Python source, only the names of files in the tree
    (its comments also describe the folders the program writes: `sessions/<id>/...`)."""
    code = doc.suffix == ".py"
    out = []
    for number, line in enumerate(doc.read_text().splitlines(), 1):
        if "://" in line:
            line = re.sub(r"\w+://\S+", "", line)
        for m in PATH.finditer(line):
            if m.group(0).startswith("../"):
                continue  # the sibling ../shared folder: outside the repository
            if code and not re.search(r"\.(py|md|sh|tcss)$", m.group(1).rstrip(".,;:)")):
                continue
            why = check_path(m.group(1), m.group(2))
            if why:
                out.append(Stale(doc, number, m.group(0).rstrip(".,;:)"), why))
        for m in BARE_FILE.finditer(line):
            why = check_bare(m.group(1))
            if why:
                out.append(Stale(doc, number, m.group(1), why))
        for m in DOTTED.finditer(line):
            why = check_dotted(m.group(1).rstrip("."))
            if why:
                out.append(Stale(doc, number, m.group(1), why))
    return out


def main() -> int:
    stale = [s for doc in (*DOCS, *SOURCES) for s in stale_in(doc)]
    for s in stale:
        print(s)
    names = "name" if len(stale) == 1 else "names"
    files = len(DOCS) + len(SOURCES)
    print(
        f"{len(stale)} stale {names} in {files} files"
        if stale
        else f"{files} files: every name exists"
    )
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())

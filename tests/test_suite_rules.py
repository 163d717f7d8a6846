"""Rules the suite holds itself to, checked on its own source (no imports run)."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent


def _imported_modules(path: Path) -> list[tuple[int, str]]:
    """(line, module) for every import in `path`, at any depth (functions included)."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.append((node.lineno, node.module))
        elif isinstance(node, ast.Import):
            out += [(node.lineno, alias.name) for alias in node.names]
    return out


def test_no_module_imports_a_test_module():
    """Shared helpers live in tests/helpers/ (or conftest.py fixtures): importing from a
    test_*.py module ties two test files together (splitting or renaming one breaks the
    other, an imported fixture is a second copy with its own scope) and hides which
    helpers are shared."""
    bad = []
    for path in sorted([*TESTS.rglob("*.py"), *(ROOT / "scripts").rglob("*.py")]):
        for line, module in _imported_modules(path):
            if module.startswith("tests.") and module.rsplit(".", 1)[-1].startswith("test_"):
                bad.append(f"{path.relative_to(ROOT)}:{line} imports {module}")
    assert not bad, "import helpers from tests/helpers/ instead:\n" + "\n".join(bad)


def test_the_code_is_ruff_format_clean():
    """Issue 44 item 6: five files had drifted from `ruff format` unseen (`make lint` ran
    only `ruff check`). The suite holds the formatting now, where ruff is installed."""
    import shutil
    import subprocess
    import sys

    import pytest

    ruff = shutil.which("ruff") or shutil.which("ruff", path=str(Path(sys.executable).parent))
    if ruff is None:
        pytest.skip("ruff is not installed (pip install -e '.[dev]')")
    out = subprocess.run(
        [ruff, "format", "--check", "ssdmoe_tui", "tests", "scripts"],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr

"""Every file, module and function the docs (and the package's docstrings) name exists:
scripts/check_docs.py run as a user runs it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_every_name_in_the_docs_exists():
    r = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "check_docs.py")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert "every name exists" in r.stdout


def test_a_stale_name_is_one_line_naming_doc_and_line(tmp_path, monkeypatch):
    """The checker itself finds what it should: a missing file, a missing function in a
    real module, and not a real one."""
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import check_docs
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    doc = tmp_path / "page.md"
    doc.write_text(
        "See `tests/app/test_ui_gone.py` and `sessions/turns.build_prompt`,\n"
        "`ui/fmt.no_such_function`, `ssdmoe_tui.engine.run.service.EngineService`,\n"
        "`ssdmoe_tui.engine.run.nothing` and tests/test_layering.py::test_no_import_cycles.\n"
    )
    monkeypatch.setattr(check_docs, "ROOT", ROOT)
    found = [(s.line, s.name) for s in check_docs.stale_in(doc)]
    assert found == [
        (1, "tests/app/test_ui_gone.py"),
        (2, "ui/fmt.no_such_function"),
        (3, "ssdmoe_tui.engine.run.nothing"),
    ], found

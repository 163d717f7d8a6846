"""`ssdmoe_tui.checkpoint` sits below `engine` and `models`: it imports neither (nor
sessions, ui, textual), and `models.registry` no longer reaches back into `models.scan`."""

from __future__ import annotations

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parents[2] / "ssdmoe_tui"


def imported(path: Path) -> set[str]:
    """Every module a file imports, at top level or inside functions."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
    return out


def test_checkpoint_imports_nothing_above_it() -> None:
    above = ("ssdmoe_tui.engine", "ssdmoe_tui.models", "ssdmoe_tui.sessions", "ssdmoe_tui.ui",
             "ssdmoe_tui.commands", "textual")  # fmt: skip
    for path in sorted((PKG / "checkpoint").glob("*.py")):
        bad = sorted(m for m in imported(path) if m.startswith(above))
        assert not bad, f"{path.name} imports {bad}"


def test_no_registry_scan_cycle() -> None:
    assert not any(
        m.startswith("ssdmoe_tui.models.scan") for m in imported(PKG / "models/registry.py")
    )


def test_one_header_reader() -> None:
    """Nothing outside checkpoint/header.py unpacks a safetensors header length itself."""
    for path in sorted(PKG.rglob("*.py")):
        if path.parent.name == "checkpoint":
            continue
        assert 'struct.unpack("<Q"' not in path.read_text(), path

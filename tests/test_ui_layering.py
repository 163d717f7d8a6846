"""Layering: the UI never loads mlx/safetensors; the engine never imports Textual."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parents[1]


def _loaded_after(import_line: str) -> set[str]:
    code = f"import sys, json\n{import_line}\nprint(json.dumps(sorted(sys.modules)))"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT
    )
    assert out.returncode == 0, out.stderr
    return {name.split(".")[0] for name in json.loads(out.stdout.splitlines()[-1])}


def test_importing_the_app_loads_neither_mlx_nor_safetensors():
    loaded = _loaded_after(
        "import ssdmoe_tui.ui.app, ssdmoe_tui.commands.chat, ssdmoe_tui.engine.service"
    )
    assert "textual" in loaded  # the import really happened
    assert "mlx" not in loaded
    assert "mlx_lm" not in loaded
    assert "safetensors" not in loaded


def test_importing_the_engine_service_loads_no_textual():
    loaded = _loaded_after("import ssdmoe_tui.engine.service, ssdmoe_tui.engine.protocol")
    assert "textual" not in loaded


def imported_names(path: Path) -> list[str]:
    """Every module a source file imports, at any depth (lazy imports too)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    names: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            names.append(node.module or "")
    return names


def test_no_engine_module_imports_textual():
    engine = ROOT / "ssdmoe_tui" / "engine"
    files = sorted(engine.rglob("*.py"))
    assert files
    for path in files:
        for name in imported_names(path):
            assert name.split(".")[0] != "textual", f"{path} imports {name}"
            assert not name.startswith("ssdmoe_tui.ui"), f"{path} imports {name}"


def test_no_ui_module_imports_mlx_or_safetensors():
    for path in sorted((ROOT / "ssdmoe_tui" / "ui").rglob("*.py")):
        for name in imported_names(path):
            assert name.split(".")[0] not in ("mlx", "mlx_lm", "safetensors"), (
                f"{path} imports {name}"
            )


def test_chat_controller_needs_no_textual_and_screens_never_import_the_app():
    loaded = _loaded_after("import ssdmoe_tui.chat.controller, ssdmoe_tui.chat.progress")
    assert "textual" not in loaded and "mlx" not in loaded
    ui = ROOT / "ssdmoe_tui" / "ui"
    for path in sorted(ui.rglob("*.py")):
        if path.name == "app.py":
            continue
        for name in imported_names(path):
            assert name != "ssdmoe_tui.ui.app", f"{path} imports the app (a cycle)"

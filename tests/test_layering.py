"""Layering: the named import contracts of pyproject.toml ([tool.importlinter], run by
import-linter's `lint-imports`), no import cycles, and what importing the app or the
engine really loads."""

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
        "import ssdmoe_tui.ui.app, ssdmoe_tui.commands.chat, ssdmoe_tui.engine.run.service"
    )
    assert "textual" in loaded  # the import really happened
    assert "mlx" not in loaded
    assert "mlx_lm" not in loaded
    assert "safetensors" not in loaded


def test_the_model_lock_checks_memory_without_loading_mlx():
    """A second model is checked against the machine's memory before anything loads
    (models/lock.py reads ssdmoe_tui/memory.py, not the engine's cache module)."""
    loaded = _loaded_after(
        "import ssdmoe_tui.models.lock as lock; assert lock.available_memory_bytes() > 0"
    )
    assert "mlx" not in loaded and "mlx_lm" not in loaded


def test_importing_the_engine_service_loads_no_textual():
    loaded = _loaded_after("import ssdmoe_tui.engine.run.service, ssdmoe_tui.engine.run.protocol")
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


# --------------------------------------------------------------------------- import graph

PACKAGE = ROOT / "ssdmoe_tui"


def _module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


def import_graph() -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    """(package module -> package modules it imports, module -> outside top-level names).

    Every import counts, wherever it is written: at the top, inside functions, under
    `if TYPE_CHECKING:`. `from pkg import name` is an edge to `pkg.name` when that is a
    module, else to `pkg`; relative imports are resolved."""
    files = {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}
    graph: dict[str, set[str]] = {m: set() for m in files}
    outside: dict[str, set[str]] = {m: set() for m in files}
    for mod, path in files.items():
        is_pkg = path.name == "__init__.py"
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in ast.walk(tree):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = mod.split(".") if is_pkg else mod.split(".")[:-1]
                    anchor = anchor[: len(anchor) - (node.level - 1)]
                    base = ".".join([*anchor, *([base] if base else [])])
                targets = [
                    f"{base}.{a.name}" if f"{base}.{a.name}" in files else base for a in node.names
                ]
            for t in targets:
                if t.split(".")[0] != "ssdmoe_tui":
                    outside[mod].add(t.split(".")[0])
                    continue
                while t and t not in files:  # a name inside a module: the module
                    t = t.rpartition(".")[0]
                if t and t != mod:
                    graph[mod].add(t)
    return graph, outside


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                scc = []
                while True:
                    m = stack.pop()
                    on_stack.discard(m)
                    scc.append(m)
                    if m == node:
                        break
                if len(scc) > 1:
                    out.append(sorted(scc))
    return sorted(out)


def test_import_graph_sees_lazy_and_type_checking_imports():
    graph, outside = import_graph()
    assert "ssdmoe_tui.engine.run.runner" in graph["ssdmoe_tui.engine.run.open"]  # TYPE_CHECKING
    assert "ssdmoe_tui.engine.model.loader" in graph["ssdmoe_tui.engine.run.open"]  # in a function
    assert "mlx" in outside["ssdmoe_tui.engine.run.runner"]
    assert import_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_chat_controller_needs_no_textual_and_screens_never_import_the_app():
    loaded = _loaded_after("import ssdmoe_tui.chat.controller, ssdmoe_tui.chat.progress")
    assert "textual" not in loaded and "mlx" not in loaded
    ui = ROOT / "ssdmoe_tui" / "ui"
    for path in sorted(ui.rglob("*.py")):
        if path.name == "app.py":
            continue
        for name in imported_names(path):
            assert name != "ssdmoe_tui.ui.app", f"{path} imports the app (a cycle)"


def _contracts() -> list[dict]:
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib
    with open(ROOT / "pyproject.toml", "rb") as f:
        return tomllib.load(f)["tool"]["importlinter"]["contracts"]


def test_the_named_layering_contracts_hold():
    """Every contract in pyproject.toml, each a rule with its reason in its name
    (harlequin's import-linter contracts are the model): import-linter sees every import,
    lazy ones and those under TYPE_CHECKING included, and follows chains through other
    modules."""
    contracts = _contracts()
    rules = {tuple(c["source_modules"]): set(c["forbidden_modules"]) for c in contracts}
    assert "ssdmoe_tui.engine" in rules[("ssdmoe_tui.models", "ssdmoe_tui.checkpoint")]
    assert {"ssdmoe_tui.sessions", "ssdmoe_tui.ui", "textual"} <= rules[("ssdmoe_tui.engine",)]
    lint = Path(sys.executable).with_name("lint-imports")
    out = subprocess.run(
        [str(lint), "--no-cache"], capture_output=True, text=True, timeout=300, cwd=ROOT
    )
    report = out.stdout + out.stderr
    assert out.returncode == 0 and f"{len(contracts)} kept, 0 broken" in report, report[-6000:]


def test_no_import_cycles():
    cycles = import_cycles(import_graph()[0])
    assert not cycles, "import cycles remain:\n" + "\n".join(" <-> ".join(c) for c in cycles)


def test_nothing_under_engine_renders_a_chat_template():
    """The engine takes token ids: messages become tokens in prompting/ (called by the
    app, the server and `generate`), never under engine/ (the contract keeps prompting/
    and Jinja out of its imports; this keeps a tokenizer's own template call out)."""
    bad = [
        str(path)
        for path in sorted((PACKAGE / "engine").rglob("*.py"))
        if "apply_chat_template" in path.read_text(encoding="utf-8")
    ]
    assert not bad, "\n".join(bad)


def test_engine_top_level_holds_at_most_eight_modules():
    engine = ROOT / "ssdmoe_tui" / "engine"
    top = sorted(p.name for p in engine.glob("*.py"))
    assert len(top) <= 8, top

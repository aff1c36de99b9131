"""The layout of zres/ shows its architecture: no import cycles, the pure core and scheduler
depend on nothing above them, and no module grows past about 400 lines.

Imports are read with ``ast``, wherever they stand: at the top, inside a function, or
under ``if TYPE_CHECKING``; a cycle through any of them still ties two rooms together.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import zres

ROOT = Path(zres.__file__).parent
MAX_LINES = 450  # "about 400"


def module_names(root: Path) -> dict[str, Path]:
    """Every module under ROOT (a package directory) by dotted name."""
    names = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        names[".".join(parts)] = path
    return names


def imported(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The modules of MODULES that module NAME (at PATH) imports, anywhere in it."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[:len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, *([base] if base else [])])
            # `from pkg import mod` imports the module pkg.mod; `from mod import name`, mod.
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base
                       for a in node.names]
        else:
            continue
        for target in targets:
            while target and target not in modules:  # `import a.b.c` needs a.b.c's module
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def import_graph(root: Path) -> dict[str, set[str]]:
    modules = module_names(root)
    return {name: imported(name, path, modules) for name, path in modules.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """Return one import cycle as a list of modules (first == last), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for target in sorted(graph.get(node, ())):
            if state.get(target) == 1:
                return [*path[path.index(target):], target]
            if target not in state and (cycle := visit(target)) is not None:
                return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)) is not None:
            return cycle
    return None


def test_zres_has_no_import_cycle():
    cycle = find_cycle(import_graph(ROOT))
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_the_cycle_finder_finds_cycles_through_type_checking_and_function_imports(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from typing import TYPE_CHECKING\n"
                              "if TYPE_CHECKING:\n    from .sub import b\n")
    (pkg / "sub" / "b.py").write_text("def f():\n    from ..c import g\n")
    (pkg / "c.py").write_text("import pkg.a\n")
    assert find_cycle(import_graph(pkg)) == ["pkg.a", "pkg.sub.b", "pkg.c", "pkg.a"]
    (pkg / "c.py").write_text("import os\n")
    assert find_cycle(import_graph(pkg)) is None


def zres_imports(package: str) -> set[str]:
    graph = import_graph(ROOT)
    return {t for m, targets in graph.items() if m.startswith(package) for t in targets}


def test_the_core_depends_on_no_other_part_of_zres():
    assert {t for t in zres_imports("zres.core") if not t.startswith("zres.core")} == set()


def test_the_scheduler_is_pure_and_depends_only_on_the_core():
    assert {t for t in zres_imports("zres.scheduler")
            if not t.startswith(("zres.scheduler", "zres.core"))} == set()
    for path in (ROOT / "scheduler").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level
                     else [])
            for name in names:
                top = name.split(".")[0]
                assert top not in {"zmq", "socket", "threading", "time", "os", "subprocess",
                                   "select", "asyncio"}, f"{path.name} imports {name}: no I/O"
                assert top in sys.stdlib_module_names or top == "zres", \
                    f"{path.name} imports {name}"


@pytest.mark.parametrize("path", sorted(ROOT.rglob("*.py")), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_module_is_much_over_400_lines(path):
    lines = len(path.read_text().splitlines())
    assert lines <= MAX_LINES, f"{path.relative_to(ROOT)} has {lines} lines: split it"


@pytest.mark.parametrize("module", ["zres.agent.worker", "zres.agent.daemon", "zres.cli.main",
                                    "zres.client.client"])
def test_processes_start_without_what_only_some_of_them_use(module):
    """A worker process, an agent, every ``zres`` command and a client program start without
    importing asyncio (zres runs no event loop of its own), structlog (it renders only
    what a daemon emits) or http.server (the broker's dashboard): ~100 ms of each start
    together, and the suite starts thousands of processes (bench/startup.py)."""
    heavy = ("asyncio", "structlog", "http.server")
    found = subprocess.run(
        [sys.executable, "-c", f"import sys, {module}; "
         f"print(*[m for m in {heavy!r} if m in sys.modules])"],
        capture_output=True, text=True, timeout=60, check=True).stdout.split()
    assert found == [], f"importing {module} imports {found}"


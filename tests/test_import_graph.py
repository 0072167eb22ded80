"""The import graph of remote/ and tui/, read from their source: no circles, and the boundaries hold.

Every import counts, also those inside functions (a lazy import still ties two modules together).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = {"remote": "homegpu.remote", "tui": "homegpu.tui"}


def _imports(path: Path, package: str) -> set[str]:
    """Every module `path` imports (absolute names; `from pkg import mod` names pkg.mod when mod is one)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + [base]).rstrip(".")
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return found


def import_graph() -> dict[str, set[str]]:
    """module -> the modules of remote/ and tui/ it imports (other imports under the key "external")."""
    modules = {f"{package}.{path.stem}": path
               for folder, package in PACKAGES.items() for path in sorted((ROOT / folder).glob("*.py"))
               if path.stem != "__init__"}
    graph = {}
    for name, path in modules.items():
        imported = _imports(path, name.rsplit(".", 1)[0])
        graph[name] = {module for module in imported if module in modules and module != name}
    return graph


def external_imports(folder: str) -> dict[str, set[str]]:
    """module file -> every top-level package it imports, for the boundary rules."""
    return {path.name: {name.split(".")[0] if not name.startswith("homegpu.") else ".".join(name.split(".")[:2])
                        for name in _imports(path, PACKAGES[folder])}
            for path in sorted((ROOT / folder).glob("*.py"))}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One circle of the graph as a path that ends where it starts, or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(module: str) -> list[str] | None:
        state[module] = 1
        path.append(module)
        for target in sorted(graph.get(module, ())):
            if state.get(target) == 1:
                return path[path.index(target):] + [target]
            if target not in state and (cycle := visit(target)):
                return cycle
        path.pop()
        state[module] = 2
        return None

    for module in sorted(graph):
        if module not in state and (cycle := visit(module)):
            return cycle
    return None


def test_find_cycle_finds_a_circle_and_none_in_a_tree():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


def test_imports_inside_functions_count(tmp_path):
    source = tmp_path / "mod.py"
    source.write_text("def f():\n    from homegpu.remote import docker_runtime\n")
    assert "homegpu.remote.runtimes.docker_runtime" in _imports(source, "homegpu.remote")


def test_no_import_circle_among_remote_and_tui():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import circle: " + " -> ".join(cycle)


@pytest.mark.parametrize("folder, banned", [
    ("tui", {"asyncssh", "docker", "homegpu.trainer"}),
    ("remote", {"textual", "homegpu.tui"}),
])
def test_boundaries(folder, banned):
    crossing = {name: sorted(found & banned) for name, found in external_imports(folder).items() if found & banned}
    assert not crossing, f"{folder}/ imports what it must not: {crossing}"


RUNTIME_MODULES = {"runtime.py", "process_runtime.py", "docker_runtime.py", "runtime_factory.py"}


def test_only_the_runtimes_name_a_runtime_class():
    """What differs by runtime is a method of the runtime: nobody else asks which one it is."""
    named = {}
    for folder in PACKAGES:
        for path in sorted((ROOT / folder).glob("*.py")):
            if path.name in RUNTIME_MODULES:
                continue
            names = {node.id for node in ast.walk(ast.parse(path.read_text())) if isinstance(node, ast.Name)}
            if names & {"ProcessRuntime", "DockerRuntime"}:
                named[f"{folder}/{path.name}"] = sorted(names & {"ProcessRuntime", "DockerRuntime"})
    assert not named, f"runtime classes named outside the runtimes: {named}"

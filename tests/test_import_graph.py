"""The import graph of remote/ and tui/, read from their source: the groups' order, no circles, and
the boundaries hold.

remote/ is one folder per concern (its groups), in an order: a group may import the groups before it,
never one after it. Another group is reached through its package's exports (`__all__` in its
`__init__.py`), never through its modules. The scripts that run on the nodes (node_side/) use the
standard library and each other only. Every import counts, also those inside functions (a lazy
import still ties two modules together).
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = {"remote": "homegpu.remote", "tui": "homegpu.tui"}

# remote/'s groups, each importing only those before it (README, "Architecture").
GROUP_ORDER = ("node_side", "config", "nodes", "logs", "net", "record", "plan", "runtimes", "images", "jobs",
               "doctor", "alerts", "history", "serve", "queue")
NODE_SIDE = "node_side"


def module_name(path: Path) -> str:
    """homegpu.remote.nodes.session for remote/nodes/session.py; a package's name for its __init__.py."""
    parts = path.relative_to(ROOT).with_suffix("").parts
    parts = parts[:-1] if parts[-1] == "__init__" else parts
    return ".".join(("homegpu",) + parts)


def source_files(folder: str) -> list[Path]:
    return sorted((ROOT / folder).rglob("*.py"))


def imports(path: Path) -> list[tuple[str, tuple[str, ...]]]:
    """Every import of `path` as (module, names taken from it); `import a.b` takes no names."""
    package = module_name(path) if path.name == "__init__.py" else module_name(path).rsplit(".", 1)[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(alias.name, ()) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                kept = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(kept + ([base] if base else []))
            found.append((base, tuple(alias.name for alias in node.names)))
    return found


def imported_modules(path: Path, known: set[str]) -> set[str]:
    """The modules of `known` that `path` imports (`from pkg import mod` names pkg.mod when mod is one)."""
    found = set()
    for module, names in imports(path):
        submodules = {f"{module}.{name}" for name in names} & known
        found.update(submodules)
        if not names or len(submodules) < len(names):  # `from pkg import mod` alone needs pkg's module only
            found.add(module)
    return found & known


def all_modules() -> dict[str, Path]:
    return {module_name(path): path for folder in PACKAGES for path in source_files(folder)}


def import_graph() -> dict[str, set[str]]:
    """module -> the modules of remote/ and tui/ it imports (a package counts as its __init__)."""
    modules = all_modules()
    return {name: imported_modules(path, set(modules)) - {name} for name, path in modules.items()}


def group_of(module: str) -> str | None:
    """The remote/ group a module belongs to ("nodes" for homegpu.remote.nodes.session), else None."""
    parts = module.split(".")
    return parts[2] if parts[:2] == ["homegpu", "remote"] and len(parts) > 2 else None


def exports(group: str) -> set[str]:
    """The names in a group's `__all__` (read from its __init__.py, which must list them literally)."""
    init = ROOT / "remote" / group / "__init__.py"
    for node in ast.parse(init.read_text()).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "__all__" for t in node.targets):
            return set(ast.literal_eval(node.value))
    return set()


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


def order_violations(graph: dict[str, set[str]], order: tuple[str, ...]) -> list[str]:
    """"A -> B" for every import of a group later in `order` than the importer's own."""
    rank = {group: index for index, group in enumerate(order)}
    return sorted(f"{source} -> {target}" for source, targets in graph.items() for target in targets
                  if group_of(source) in rank and group_of(target) in rank
                  and rank[group_of(target)] > rank[group_of(source)])


def private_reaches(folder: str) -> list[str]:
    """Imports from `folder` into another group of remote/ that bypass that group's exports."""
    bad = []
    for path in source_files(folder):
        own = group_of(module_name(path))
        for module, names in imports(path):
            target = group_of(module)
            if target is None or target == own:
                continue
            if module != f"homegpu.remote.{target}":
                bad.append(f"{path.relative_to(ROOT)}: {module} (import it from homegpu.remote.{target})")
            elif unexported := sorted(set(names) - exports(target)):
                bad.append(f"{path.relative_to(ROOT)}: {', '.join(unexported)} not exported by homegpu.remote.{target}")
    return bad


# -- the checks work ----------------------------------------------------------------------------------


def test_find_cycle_finds_a_circle_and_none_in_a_tree():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


def test_an_import_of_a_later_group_is_a_violation():
    graph = {"homegpu.remote.nodes.cluster": {"homegpu.remote.alerts.watcher", "homegpu.remote.config"},
             "homegpu.remote.alerts.watcher": {"homegpu.remote.nodes"}}
    assert order_violations(graph, GROUP_ORDER) == ["homegpu.remote.nodes.cluster -> homegpu.remote.alerts.watcher"]


def test_imports_inside_functions_and_relative_imports_count(tmp_path, monkeypatch):
    folder = tmp_path / "remote" / "jobs"
    folder.mkdir(parents=True)
    source = folder / "mod.py"
    source.write_text("from . import guard\ndef f():\n    from homegpu.remote.runtimes import docker_runtime\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    found = imported_modules(source, {"homegpu.remote.runtimes.docker_runtime", "homegpu.remote.jobs.guard"})
    assert found == {"homegpu.remote.runtimes.docker_runtime", "homegpu.remote.jobs.guard"}


def test_a_flat_remote_folder_fails_the_layout_check(tmp_path, monkeypatch):
    """Today's checks would have failed on the flat remote/ of 76 modules: none is in a group."""
    (tmp_path / "remote").mkdir()
    (tmp_path / "remote" / "__init__.py").write_text("")
    (tmp_path / "remote" / "job_run.py").write_text("")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    assert loose_modules() == ["remote/job_run.py"]


def test_reaching_into_another_groups_module_is_caught(tmp_path, monkeypatch):
    for group, text in (("nodes", '__all__ = ["Cluster"]\n'), ("jobs", "")):
        (tmp_path / "remote" / group).mkdir(parents=True)
        (tmp_path / "remote" / group / "__init__.py").write_text(text)
    (tmp_path / "remote" / "jobs" / "run.py").write_text(
        "from homegpu.remote.nodes import Cluster, NodeSession\nfrom homegpu.remote.nodes.session import NODE_GONE\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    assert private_reaches("remote") == [
        "remote/jobs/run.py: NodeSession not exported by homegpu.remote.nodes",
        "remote/jobs/run.py: homegpu.remote.nodes.session (import it from homegpu.remote.nodes)"]


# -- the code keeps them ------------------------------------------------------------------------------


def loose_modules() -> list[str]:
    """Modules of remote/ outside every group (remote/__init__.py aside)."""
    return sorted(str(path.relative_to(ROOT)) for path in source_files("remote")
                  if path != ROOT / "remote" / "__init__.py" and group_of(module_name(path)) not in GROUP_ORDER)


def test_every_module_of_remote_is_in_a_group_of_the_order():
    assert not loose_modules(), f"modules outside remote/'s groups {GROUP_ORDER}: {loose_modules()}"
    groups = {path.name for path in (ROOT / "remote").iterdir() if (path / "__init__.py").is_file()}
    assert groups == set(GROUP_ORDER)


def test_no_import_circle_among_remote_and_tui():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import circle: " + " -> ".join(cycle)


def test_no_group_imports_a_later_group():
    violations = order_violations(import_graph(), GROUP_ORDER)
    assert not violations, "imports against the group order " + " < ".join(GROUP_ORDER) + ":\n" + "\n".join(violations)


@pytest.mark.parametrize("folder", ["remote", "tui"])
def test_other_groups_are_reached_through_their_exports(folder):
    bad = private_reaches(folder)
    assert not bad, "\n".join(bad)


def test_every_export_exists():
    for group in GROUP_ORDER:
        package = __import__(f"homegpu.remote.{group}", fromlist=["*"])
        missing = sorted(name for name in exports(group) if not hasattr(package, name))
        assert not missing, f"homegpu.remote.{group}.__all__ names what it does not have: {missing}"


def test_node_scripts_import_only_the_standard_library_and_each_other():
    # pynvml: the agent's optional NVML binding, shipped with it by the controller (nodes/agent_bundle.py);
    # a sibling's plain name: how node_side modules import each other on a node (stats_agent.py's docstring)
    siblings = {path.stem for path in source_files(f"remote/{NODE_SIDE}")} - {"__init__"}
    allowed = set(sys.stdlib_module_names) | {"__future__", "pynvml"} | siblings
    bad = {}
    for path in source_files(f"remote/{NODE_SIDE}"):
        for module, names in imports(path):
            top = module.split(".")[0]
            inside = module.startswith(f"homegpu.remote.{NODE_SIDE}")
            if not inside and top not in allowed:
                bad.setdefault(path.name, []).append(module)
    assert not bad, f"node scripts import what a node does not have: {bad}"


@pytest.mark.parametrize("folder, banned", [
    ("tui", {"asyncssh", "docker", "homegpu.trainer"}),
    ("remote", {"textual", "homegpu.tui"}),
])
def test_boundaries(folder, banned):
    crossing = {}
    for path in source_files(folder):
        tops = {name.split(".")[0] if not name.startswith("homegpu.") else ".".join(name.split(".")[:2])
                for name, _ in imports(path)}
        if tops & banned:
            crossing[str(path.relative_to(ROOT))] = sorted(tops & banned)
    assert not crossing, f"{folder}/ imports what it must not: {crossing}"


def test_only_the_runtimes_name_a_runtime_class():
    """What differs by runtime is a method of the runtime: nobody else asks which one it is."""
    named = {}
    for folder in PACKAGES:
        for path in source_files(folder):
            if group_of(module_name(path)) == "runtimes":
                continue
            names = {node.id for node in ast.walk(ast.parse(path.read_text())) if isinstance(node, ast.Name)}
            if names & {"ProcessRuntime", "DockerRuntime"}:
                named[str(path.relative_to(ROOT))] = sorted(names & {"ProcessRuntime", "DockerRuntime"})
    assert not named, f"runtime classes named outside the runtimes: {named}"


def test_every_group_is_packaged():
    """A folder missing from pyproject.toml's packages works in an editable install and is missing
    from a real one (`pip install .`, README's first command)."""
    import tomllib

    packages = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    missing = sorted({f"homegpu.remote.{group}" for group in GROUP_ORDER} - packages)
    assert not missing, f"pyproject.toml [tool.setuptools] packages lacks {missing}"

"""The import graph of remote/ and tui/: the order of their rooms, no circles, and the boundaries hold.

The order is written as import-linter contracts in pyproject.toml ([tool.importlinter]), as harlequin
does, and `lint-imports` checks it here: remote/ is one folder per concern (its groups), each importing
only the groups below it; tui/ is rooms (cli, daemon, app | web, view, errors), each importing only the
rooms below it, and nothing in view/ imports Textual. What import-linter cannot say is walked here from
the source: another group of remote/ is reached through its package's exports (`__all__` in its
`__init__.py`), never through its modules; the scripts that run on the nodes (node_side/) use the
standard library and each other only: the stats agent's modules (node_side/agent/) each other and pynvml,
a one-shot script (node_side/scripts/) the standard library alone; no circle among modules; every folder
is packaged. Every import counts, also those inside functions (a lazy import still ties two modules
together).
"""

from __future__ import annotations

import ast
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = {"remote": "homegpu.remote", "tui": "homegpu.tui"}
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def contract(name: str) -> dict:
    """The import-linter contract of pyproject.toml whose name starts with `name`."""
    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    return next(c for c in contracts if c["name"].startswith(name))


# remote/'s groups, lowest first, and tui/'s rooms (ARCHITECTURE.md): read from the contracts.
GROUP_ORDER = tuple(reversed(contract("remote/'s groups")["layers"]))
TUI_ROOMS = {part.strip() for layer in contract("tui/'s rooms")["layers"] for part in layer.split("|")}
NODE_SIDE = "node_side"
MAX_TUI_TOP = 8  # modules at tui/'s top, __init__.py included: past that, rooms


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


def lint_imports(root: Path) -> subprocess.CompletedProcess[str]:
    """`lint-imports` with pyproject.toml's contracts, on the homegpu packages found under `root` first."""
    return subprocess.run([str(LINT_IMPORTS), str(ROOT / "pyproject.toml"), "--no-cache"],
                          cwd=root, env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"},
                          capture_output=True, text=True, timeout=120)


def test_the_import_contracts_hold():
    done = lint_imports(ROOT / "tests")  # no homegpu there: the installed (editable) one, this checkout
    assert done.returncode == 0 and "0 broken" in done.stdout, done.stdout + done.stderr


@pytest.mark.parametrize("module, line, contract_name", [
    ("tui/view/plot.py", "import textual", "view/ is pure"),
    ("tui/view/plot.py", "from homegpu.tui.app import main", "tui/'s rooms in order"),
    ("tui/web/token_gate.py", "from homegpu.tui.app import screens", "tui/'s rooms in order"),  # siblings
    ("remote/nodes/units.py", "from homegpu.remote.alerts import AlertWatcher", "remote/'s groups in order"),
    ("remote/queue/runner.py", "from homegpu.remote.slurm import slurm_login", "who places a run"),
    ("tui/cli/queue.py", "from homegpu.remote.slurm import slurm_login", "who places a run"),
])
def test_a_step_back_up_breaks_a_contract(tmp_path, module, line, contract_name):
    """The contracts are tried on a copy of the tree with one import against them (inside a function:
    lazy imports count too)."""
    copy = tmp_path / "homegpu"
    for folder in ("remote", "tui", "trainer"):
        shutil.copytree(ROOT / folder, copy / folder, ignore=shutil.ignore_patterns("__pycache__"))
    with (copy / module).open("a") as source:
        source.write(f"\n\ndef _against_the_order():\n    {line}\n")
    done = lint_imports(tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    broken = done.stdout.split("Broken contracts")[-1]
    assert contract_name in broken, done.stdout


def test_tui_is_in_rooms():
    top = sorted(path.name for path in (ROOT / "tui").glob("*.py"))
    assert len(top) <= MAX_TUI_TOP, f"tui/ keeps {len(top)} modules at its top: {top}"
    rooms = {path.name for path in (ROOT / "tui").iterdir() if (path / "__init__.py").is_file()}
    modules = {name.removesuffix(".py") for name in top} - {"__init__"}
    assert rooms | modules == TUI_ROOMS, f"tui/'s rooms and top modules {sorted(rooms | modules)} against the " \
                                         f"contract's {sorted(TUI_ROOMS)}"
    for room in rooms:
        assert (ROOT / "tui" / room / "__init__.py").read_text().startswith('"""'), f"tui/{room}/__init__.py: say what it holds"


def test_no_import_circle_among_remote_and_tui():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import circle: " + " -> ".join(cycle)


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
    # a sibling's plain name: how node_side modules import each other on a node (agent/stats_agent.py's docstring)
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


@pytest.mark.parametrize("folder, shipped_with", [
    ("agent", {"pynvml"}),  # nodes/agent_bundle.py ships the folder's modules together, and pynvml
    ("scripts", set()),  # each alone, as `python -c`: no sibling beside it on the node
])
def test_a_node_script_imports_only_what_is_shipped_with_it(folder, shipped_with):
    """The agent's modules import the standard library, pynvml and each other; a one-shot script the standard
    library alone: neither imports the other folder (node_side/'s __init__.py and each folder's say so)."""
    own = f"homegpu.remote.{NODE_SIDE}.{folder}"
    siblings = {path.stem for path in source_files(f"remote/{NODE_SIDE}/{folder}")} - {"__init__"}
    allowed = set(sys.stdlib_module_names) | {"__future__"} | shipped_with | (siblings if shipped_with else set())
    bad = {}
    for path in source_files(f"remote/{NODE_SIDE}/{folder}"):
        for module, _ in imports(path):
            sibling = bool(shipped_with) and (module == own or module.startswith(f"{own}."))
            if not sibling and module.split(".")[0] not in allowed:
                bad.setdefault(path.name, []).append(module)
    assert siblings and not bad, f"node_side/{folder}/ imports what is not shipped with it: {bad}"


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


# Whether a run is placed by Slurm (or any placement) is asked of the placement seam: a branch on the scheduler
# outside it, as `uses_slurm` was in six places, would be one more place a new placement has to be added.
PLACEMENT_BRANCH = re.compile(r"\buses_slurm\b|\bscheduler\s*[!=]=|[!=]=\s*SLURM\b|\bSLURM\s*[!=]=")
PLACEMENT_HOMES = ("remote/placement/", "remote/slurm/", "remote/config/slurm_keys.py")  # the seam, Slurm, its keys
MAX_RUN_PART_LINES = 300
RUN_PARTS = ("remote/jobs/run.py", "remote/jobs/run_*.py")  # JobRun and its parts


def test_only_the_placement_seam_asks_which_placement_it_is():
    found = [f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
             for folder in PACKAGES for path in source_files(folder)
             if not str(path.relative_to(ROOT)).startswith(PLACEMENT_HOMES)
             for number, line in enumerate(path.read_text().splitlines(), 1) if PLACEMENT_BRANCH.search(line)]
    assert not found, "ask remote/placement/ (make_placement) instead:\n" + "\n".join(found)


def test_the_placement_branch_pattern_catches_each_form():
    caught = ["if spec.uses_slurm:", "if cluster.scheduler == 'slurm':", "x.scheduler != HOMEGPU",
              "if scheduler == SLURM:", "SLURM == spec.scheduler"]
    assert all(PLACEMENT_BRANCH.search(line) for line in caught)
    assert not PLACEMENT_BRANCH.search("placement = make_placement(spec)  # by [cluster] scheduler")


def test_jobrun_and_each_of_its_parts_stay_short():
    parts = sorted({path for pattern in RUN_PARTS for path in ROOT.glob(pattern)})
    assert len(parts) > 5, parts
    lines = {str(path.relative_to(ROOT)): len(path.read_text().splitlines()) for path in parts}
    long = {part: n for part, n in lines.items() if n > MAX_RUN_PART_LINES}
    assert not long, f"over {MAX_RUN_PART_LINES} lines: {long}; split the concern into a part of its own"


def test_every_group_and_room_is_packaged():
    """A folder missing from pyproject.toml's packages works in an editable install and is missing
    from a real one (`pip install .`, README's first command)."""
    packages = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    folders = {f"homegpu.{path.parent.relative_to(ROOT)}".replace("/", ".")
               for folder in PACKAGES for path in (ROOT / folder).rglob("__init__.py")}
    missing = sorted(folders - packages)
    assert not missing, f"pyproject.toml [tool.setuptools] packages lacks {missing}"

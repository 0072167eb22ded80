"""What a test needs, said by marks that come from the fixtures it uses, and checked while it runs.

A test that uses the `sim_cluster` fixture is marked `lan` (and `root`), one that uses `tf_image` is
marked `docker` and `tensorflow`, and so on (FIXTURE_NEEDS): nobody has to remember a mark. A test with
none of these marks is marked `fast`: the fast tier, `pytest -m fast`, needs no root, no LAN, no Docker,
no TensorFlow and no browser.

The marks are also checked: the slow parts call `need()` when they start (a simulated node, the Docker
engine, a browser, a second Unix user), and an import of TensorFlow is noticed, in this process and in
every Python the tests start here (tests/tier_guard/sitecustomize.py). A test that reaches one of them
without its mark fails, naming the fixture to take: otherwise it would run in the fast tier and fail or
crawl there.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

# mark -> what it means (pyproject.toml declares the same marks for --strict-markers).
NEEDS = {
    "lan": "the simulated LAN (network namespaces with real sshd nodes)",
    "docker": "a Docker engine",
    "tensorflow": "TensorFlow on this machine",
    "browser": "Debian's chromium",
    "pytorch": "PyTorch on this machine",
    "jax": "JAX on this machine",
    "root": "root (namespaces, a second Unix user)",
}
# fixture -> the marks a test that uses it (even through another fixture) gets.
FIXTURE_NEEDS = {
    "lan": ("lan", "root"),
    "sim_cluster": ("lan", "root"),
    "docker_engine": ("docker", "root"),
    "busybox_image": ("docker", "root"),
    "tf_image": ("docker", "tensorflow", "root"),
    "torch_image": ("docker", "pytorch", "root"),
    "jax_image": ("docker", "jax", "root"),
    "tensorflow": ("tensorflow",),
    "chromium": ("browser",),
    "pytorch": ("pytorch",),
    "jax": ("jax",),
    "root": ("root",),
}
# what to take for each mark, as the failure says
FIXTURE_FOR = {"lan": "lan (or sim_cluster)", "docker": "docker_engine", "tensorflow": "tensorflow",
               "browser": "chromium", "pytorch": "pytorch", "jax": "jax",
               "root": "root"}
FAST = "fast"
TF_MODULES = ("tensorflow", "tf_keras")
NOTES_ENV = "HOMEGPU_TEST_TF_NOTES"  # where a Python started by a test notes that it imported TensorFlow
GUARD_PATH = Path(__file__).with_name("tier_guard")


def mark(items: list[pytest.Item]) -> None:
    """Give every test the marks of the fixtures it uses, and `fast` to those that need none of them."""
    for item in items:
        needs = {need for fixture in item.fixturenames for need in FIXTURE_NEEDS.get(fixture, ())}
        needs |= {marker.name for marker in item.iter_markers() if marker.name in NEEDS}
        for need in sorted(needs):
            item.add_marker(need)
        if not needs:
            item.add_marker(FAST)


class _Running:
    """The test running now: its name and marks (None between tests, and outside pytest)."""

    item: pytest.Item | None = None
    marks: frozenset[str] = frozenset()


def running(item: pytest.Item | None) -> None:
    _Running.item = item
    _Running.marks = frozenset(marker.name for marker in item.iter_markers()) if item else frozenset()


def need(what: str) -> None:
    """Called by a slow part as it starts: fails the running test unless it is marked `what`."""
    if _Running.item is not None and what not in _Running.marks:
        pytest.fail(unmarked(_Running.item.nodeid, what), pytrace=False)


def unmarked(test: str, what: str) -> str:
    return (f"{test} needs {NEEDS[what]} but is not marked {what}: take the {FIXTURE_FOR[what]} fixture, "
            "which marks it (tests/tiers.py), so that the fast tier leaves it out")


class TensorFlowImports:
    """A finder at the front of sys.meta_path that notes an import of TensorFlow and imports nothing."""

    def __init__(self) -> None:
        self.seen: list[str] = []

    def find_spec(self, name, path=None, target=None):
        if name in TF_MODULES:
            self.seen.append(name)
        return None

    def __enter__(self) -> TensorFlowImports:
        sys.meta_path.insert(0, self)
        return self

    def __exit__(self, *exc: object) -> None:
        sys.meta_path.remove(self)


def imported_here() -> list[str]:
    """TensorFlow's modules already imported by this process (then no finder sees their import again)."""
    return [name for name in TF_MODULES if name in sys.modules]


def notes(folder: Path) -> list[str]:
    """The command lines of the Pythons started by a test that imported TensorFlow."""
    return [path.read_text(errors="replace") for path in sorted(folder.glob("*"))] if folder.is_dir() else []


def guard_subprocesses() -> None:
    """Every Python the tests start loads tier_guard/sitecustomize.py (it notes TensorFlow where told to)."""
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, (str(GUARD_PATH), os.environ.get("PYTHONPATH"))))

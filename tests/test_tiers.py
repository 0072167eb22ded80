"""The marks of tests/tiers.py: given by the fixtures a test uses, and a test that needs more than its marks say
fails. Tried on probe tests run by a pytest of their own, in a folder under tests/ (so this conftest.py
applies), removed afterwards."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent

PROBES = '''
import subprocess, sys

def test_plain():
    assert 1 + 1 == 2

def test_imports_tensorflow_here():
    import tensorflow

def test_starts_a_python_that_imports_tensorflow():
    assert subprocess.run([sys.executable, "-c", "import tensorflow"]).returncode == 0

def test_takes_the_fixture(tensorflow):
    assert subprocess.run([sys.executable, "-c", "import tensorflow"]).returncode == 0

def test_starts_a_simulated_node():
    from simcluster import SimCluster
    SimCluster(1, first_host=250, name="probe").start()
'''


@pytest.fixture
def probes(request) -> Path:
    folder = TESTS / f"tier_probe_{uuid.uuid4().hex[:8]}"
    folder.mkdir()
    request.addfinalizer(lambda: shutil.rmtree(folder))
    (folder / "test_probes.py").write_text(PROBES)
    return folder / "test_probes.py"


def run(probes: Path, *args: str) -> dict[str, str]:
    """Each probe's outcome (passed, failed, error) and the lines said about it, from a pytest of its own."""
    result = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-rA", "-q", *args, str(probes)],
                            cwd=TESTS.parent, capture_output=True, text=True, timeout=600,
                            env={**os.environ, "COLUMNS": "2000"})  # summary lines whole
    outcomes = {}
    for line in result.stdout.splitlines():
        if m := re.match(r"(PASSED|FAILED|ERROR) \S+::(test_\w+)(?: - (.*))?", line):
            outcomes[m.group(2)] = f"{m.group(1).lower()} {m.group(3) or ''}".strip()
    return outcomes


def test_an_unmarked_test_that_uses_tensorflow_or_a_node_fails_naming_the_fixture(probes, tensorflow):
    outcomes = run(probes)
    assert outcomes["test_plain"] == "passed"
    assert outcomes["test_takes_the_fixture"] == "passed"
    for probe in ("test_imports_tensorflow_here", "test_starts_a_python_that_imports_tensorflow"):
        assert outcomes[probe].startswith("error ") and "is not marked tensorflow: take the tensorflow fixture" \
            in outcomes[probe], outcomes
    assert outcomes["test_starts_a_simulated_node"].startswith("failed ") and \
        "needs the simulated LAN" in outcomes["test_starts_a_simulated_node"], outcomes


def test_the_fast_tier_is_what_no_fixture_marks(probes):
    listed = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-m", "fast", "--co",
                             str(probes)], cwd=TESTS.parent, capture_output=True, text=True, timeout=120).stdout
    chosen = sorted(re.findall(r"::(test_\w+)", listed))
    assert chosen == ["test_imports_tensorflow_here", "test_plain", "test_starts_a_python_that_imports_tensorflow",
                      "test_starts_a_simulated_node"], listed

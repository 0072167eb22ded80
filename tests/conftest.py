"""Session fixtures: the simulated LAN cluster, its cluster.toml, a Docker engine and iperf3.

All of them need root and real system tools. A machine without them fails the tests with a message
naming what to install (`bash tests/run.sh` installs it all): skipping would hide that the cluster
tests never ran.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Callable, TypeVar

import pytest

import cpu_times
import simnet
import tiers
from simcluster import (
    SimCluster, SimClusterError, alive, require_root_tools, stop_all,
)
from simdocker import DockerEngine, ensure_docker

# Test images built locally (tests/images.py): busybox in seconds, Python + TensorFlow 2.21 in ~100 s.
from images import busybox_image, jax_image, tf_image, torch_image  # noqa: E402,F401  (session fixtures)

T = TypeVar("T")

# The tests, and every homegpu and Python they start, have a home of their own: HOME and the XDG folders
# point into a temp dir made before any test module is imported, so nothing of the user's (~/.ssh,
# ~/.cache/homegpu, serve's history in ~/.local/share/homegpu) is read or written.
PRIVATE_HOME = Path(tempfile.mkdtemp(prefix="homegpu-test-home-"))
for _name, _folder in (("HOME", "home"), ("XDG_CACHE_HOME", "cache"), ("XDG_CONFIG_HOME", "config"),
                       ("XDG_DATA_HOME", "data")):
    os.environ[_name] = str(PRIVATE_HOME / _folder)
    (PRIVATE_HOME / _folder).mkdir()
tiers.guard_subprocesses()

# The third node gets a directory first on its PATH; tests put a replaying nvidia-smi there.
EXTRA_PATH_NODE = "node3"


def pytest_configure(config: pytest.Config) -> None:
    cpu_times.register(config)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    tiers.mark(items)


def pytest_collection_finish(session: pytest.Session) -> None:
    if imported := tiers.imported_here():
        pytest.exit(f"collecting the tests imported {', '.join(imported)}: import it inside a test that takes the "
                    "tensorflow fixture, so that the fast tier never waits for it", returncode=3)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    tiers.running(item)


def pytest_runtest_teardown(item: pytest.Item) -> None:
    tiers.running(None)


@pytest.fixture(autouse=True)
def _tensorflow_only_where_marked(request: pytest.FixtureRequest, tmp_path_factory) -> Iterator[None]:
    """A test not marked `tensorflow` that imports it, here or in a Python it starts, fails (tests/tiers.py)."""
    if request.node.get_closest_marker("tensorflow"):
        yield
        return
    notes = tmp_path_factory.mktemp("tf-notes")
    os.environ[tiers.NOTES_ENV] = str(notes)
    try:
        with tiers.TensorFlowImports() as imports:
            yield
    finally:
        del os.environ[tiers.NOTES_ENV]
    if imports.seen or tiers.notes(notes):
        where = "this test" if imports.seen else "a Python it started: " + tiers.notes(notes)[0]
        pytest.fail(tiers.unmarked(request.node.nodeid, "tensorflow") + f" (imported by {where})", pytrace=False)


@pytest.fixture(scope="session")
def lan() -> None:
    """The simulated LAN's tools and root: a test that makes its own SimCluster takes this."""
    _or_fail(require_root_tools)


@pytest.fixture(scope="session")
def root() -> None:
    """Root, for a test that switches users or changes the system (iptables, mounts)."""
    if os.geteuid() != 0:
        pytest.fail("this test needs root: run the suite as root (sudo bash tests/run.sh), or the fast tier "
                    "(pytest -m fast) without it", pytrace=False)


@pytest.fixture(scope="session")
def tensorflow() -> None:
    """TensorFlow and tf-keras installed here: a test that imports them, or starts a Python that does, takes
    this (it imports nothing itself: the fast tier's collection never waits for TensorFlow)."""
    missing = [name for name in ("tensorflow", "tf_keras", "numpy") if importlib.util.find_spec(name) is None]
    if missing:
        pytest.fail(f"{', '.join(missing)} not installed: pip install -e '.[tensorflow]' "
                    "(tensorflow==2.21.*, tf-keras==2.21.*)", pytrace=False)


@pytest.fixture(scope="session")
def pytorch() -> None:
    """PyTorch installed here (the nodes' python is this one): a test that runs a PyTorch job takes this."""
    if importlib.util.find_spec("torch") is None:
        pytest.fail("torch not installed: pip install -e '.[pytorch]' (or bash tests/run.sh)", pytrace=False)


@pytest.fixture(scope="session")
def jax() -> None:
    """JAX installed here (the nodes' python is this one): a test that runs a JAX job takes this."""
    if importlib.util.find_spec("jax") is None:
        pytest.fail("jax not installed: pip install -e '.[jax]' (or bash tests/run.sh)", pytrace=False)


@pytest.fixture(scope="session")
def chromium() -> str:
    """Debian's chromium (tests/run.sh installs it), for a test that renders a page."""
    path = shutil.which("chromium")
    if path is None:
        pytest.fail("chromium is not installed: install it (apt-get install chromium, or bash tests/run.sh)",
                    pytrace=False)
    return path


def _or_fail(step: Callable[[], T]) -> T:
    """Run a setup step, turning SimClusterError into pytest.fail (never a skip)."""
    try:
        return step()
    except SimClusterError as exc:
        problem = str(exc)
    # Failing outside the except block keeps the report to one line, with no chained traceback.
    pytest.fail(f"test environment not ready: {problem}", pytrace=False)


@pytest.fixture(scope="session", autouse=True)
def _private_home() -> Iterator[None]:
    """Removes the tests' own home (made at import, below) at the end of the session."""
    yield
    shutil.rmtree(PRIVATE_HOME, ignore_errors=True)


@pytest.fixture(scope="session", autouse=True)
def _no_sim_node_outlives_the_session() -> Iterator[None]:
    """Set up first, torn down last: stops any node a test started and never stopped, and says so."""
    yield
    leaked = stop_all()
    simnet.teardown()  # the namespaces of clusters a test never closed, then the bridge and rule
    if leaked:
        pytest.fail(f"tests left simulated nodes running (now stopped): {', '.join(leaked)}", pytrace=False)


@pytest.fixture(scope="session")
def sim_cluster(lan) -> Iterator[SimCluster]:
    """Three machines on the LAN, node1..node3 at 10.213.0.2..4 (ssh aliases node1..node3, links
    at 1 Gbit/s); node3 has an extra_path dir.

    Teardown stops every process of the nodes, deletes their namespaces and checks by pid that no
    process survived.
    """
    cluster = _or_fail(lambda: SimCluster(3, first_host=2, extra_path_nodes=[EXTRA_PATH_NODE]).start())
    seen = cluster.pids()
    yield cluster
    seen |= cluster.pids()
    cluster.close()
    leftover = alive(seen) | cluster.pids()
    if leftover:
        pytest.fail(f"simulated nodes left processes running: {sorted(leftover)}", pytrace=False)


@pytest.fixture(scope="session")
def cluster_toml(sim_cluster: SimCluster, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A cluster.toml (runtime "process") for sim_cluster, in its own temp dir."""
    return sim_cluster.write_cluster_toml(tmp_path_factory.mktemp("cluster") / "cluster.toml")


@pytest.fixture
def home_ssh_config(monkeypatch) -> Iterator[Path]:
    """~/.ssh/config under the tests' own HOME (tests/conftest.py), read as a user's is: without
    HOMEGPU_SSH_CONFIG. Removed afterwards, so that no other test reads it."""
    monkeypatch.delenv("HOMEGPU_SSH_CONFIG", raising=False)
    path = Path.home() / ".ssh" / "config"
    path.parent.mkdir(mode=0o700, exist_ok=True)
    yield path
    path.unlink(missing_ok=True)


@pytest.fixture(scope="session")
def docker_engine() -> Iterator[DockerEngine]:
    """A Docker engine that answers /_ping; started for the session only if none was running."""
    engine = _or_fail(ensure_docker)
    yield engine
    engine.stop()


@pytest.fixture(scope="session")
def iperf3_path() -> str:
    """Absolute path of the iperf3 binary."""
    path = shutil.which("iperf3")
    if path is None:
        pytest.fail("iperf3 is not installed; run: apt-get install -y iperf3", pytrace=False)
    return path

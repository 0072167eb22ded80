"""Session fixtures: the simulated LAN cluster, its cluster.toml, a Docker engine and iperf3.

All of them need root and real system tools. A machine without them fails the tests with a message
naming what to install (`bash tests/run.sh` installs it all): skipping would hide that the cluster
tests never ran.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Callable, TypeVar

import pytest

import simnet
from simcluster import (
    SimCluster, SimClusterError, alive, require_root_tools, stop_all,
)
from simdocker import DockerEngine, ensure_docker

# Test images built locally (tests/images.py): busybox in seconds, Python + TensorFlow 2.21 in ~100 s.
from images import busybox_image, tf_image  # noqa: E402,F401  (session fixtures)

T = TypeVar("T")

# The third node gets a directory first on its PATH; tests put a replaying nvidia-smi there.
EXTRA_PATH_NODE = "node3"


def _or_fail(step: Callable[[], T]) -> T:
    """Run a setup step, turning SimClusterError into pytest.fail (never a skip)."""
    try:
        return step()
    except SimClusterError as exc:
        problem = str(exc)
    # Failing outside the except block keeps the report to one line, with no chained traceback.
    pytest.fail(f"test environment not ready: {problem}", pytrace=False)


@pytest.fixture(scope="session", autouse=True)
def _private_cache_and_config() -> Iterator[None]:
    """The tests (and every homegpu they start) keep their cache and config in a temp dir: never in
    the user's real ~/.cache/homegpu, nor serve's history in ~/.local/share/homegpu. Fails at the end if
    something wrote the real cache anyway."""
    real = Path.home() / ".cache" / "homegpu"
    started = time.time()
    private = Path(tempfile.mkdtemp(prefix="homegpu-test-home-"))
    saved = {name: os.environ.get(name) for name in ("XDG_CACHE_HOME", "XDG_CONFIG_HOME", "XDG_DATA_HOME")}
    os.environ["XDG_CACHE_HOME"], os.environ["XDG_CONFIG_HOME"] = str(private / "cache"), str(private / "config")
    os.environ["XDG_DATA_HOME"] = str(private / "data")
    yield
    for name, value in saved.items():
        if value is None:
            del os.environ[name]
        else:
            os.environ[name] = value
    shutil.rmtree(private, ignore_errors=True)
    written = [p.name for p in real.glob("*") if p.stat().st_mtime >= started] if real.is_dir() else []
    if written:
        pytest.fail(f"tests wrote the user's real cache: {', '.join(written)} in {real}", pytrace=False)


@pytest.fixture(scope="session", autouse=True)
def _no_sim_node_outlives_the_session() -> Iterator[None]:
    """Set up first, torn down last: stops any node a test started and never stopped, and says so."""
    yield
    leaked = stop_all()
    simnet.teardown()  # the namespaces of clusters a test never closed, then the bridge and rule
    if leaked:
        pytest.fail(f"tests left simulated nodes running (now stopped): {', '.join(leaked)}", pytrace=False)


@pytest.fixture(scope="session")
def sim_cluster() -> Iterator[SimCluster]:
    """Three machines on the LAN, node1..node3 at 10.213.0.2..4 (ssh aliases node1..node3, links
    at 1 Gbit/s); node3 has an extra_path dir.

    Teardown stops every process of the nodes, deletes their namespaces and checks by pid that no
    process survived.
    """
    _or_fail(require_root_tools)
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

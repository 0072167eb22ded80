"""The Slurm cluster of tests/simslurm.py, checked with Slurm's own commands as a user runs them on a login node.

Three machines of their own (10.213.0.120-122): node1 is the login node, no compute node; node2 and node3 are
the compute nodes, each running its own slurmd in its own network namespace.
"""

from __future__ import annotations

import re
import shlex
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from helpers import wait_for
from simcluster import SimCluster, alive, own_cluster
from simslurm import SimSlurm


@pytest.fixture
def lab(lan) -> Iterator[SimCluster]:
    with own_cluster(3, first_host=120) as cluster:
        yield cluster


def on_login(cluster: SimCluster, command: str, timeout: float = 60) -> subprocess.CompletedProcess:
    """Run a shell command on node1 over SSH through its ssh config alias, as a user does."""
    return subprocess.run(["ssh", "-F", str(cluster.ssh_config_path), "-o", "BatchMode=yes", "node1", command],
                          capture_output=True, text=True, timeout=timeout)


def sbatch(cluster: SimCluster, *options: str, wrap: str) -> str:
    """Submit a batch job on the login node; its id."""
    result = on_login(cluster, shlex.join(["sbatch", "--parsable", *options, "--wrap", wrap]))
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout.strip()


def task_lines(out: Path) -> list[str]:
    return re.findall(r"^task .*$", out.read_text(), re.M) if out.exists() else []


def names(pids: set[int]) -> list[str]:
    """The command names of those of `pids` that still run."""
    found = []
    for pid in pids:
        try:
            found.append(Path(f"/proc/{pid}/comm").read_text().strip())
        except OSError:
            pass
    return found


def job_state(slurm: SimSlurm, job: str) -> tuple[str, str]:
    """(state, reason) of a job as squeue says it, finished jobs included."""
    result = slurm.run(["squeue", "--noheader", "--states=all", f"--jobs={job}", "--format=%T %r"])
    fields = result.stdout.strip().split(maxsplit=1) if result.returncode == 0 else []
    return tuple(fields) if len(fields) == 2 else ("", "")


def test_a_job_takes_both_compute_nodes_the_next_waits_for_them_until_it_is_cancelled(lab: SimCluster, tmp_path):
    with SimSlurm(lab, ["node2", "node3"]) as slurm:
        out = tmp_path / "job.out"
        task = 'echo task $SLURM_NODEID $SLURMD_NODENAME $HOMEGPU_SIMNODE $(ip -4 -o addr show eth0)'
        # --exclusive: the whole of both nodes (a task takes one of each node's CPUs otherwise, leaving room)
        first = sbatch(lab, "--nodes=2", "--exclusive", f"--output={out}",
                       wrap=f"srun sh -c {shlex.quote(task)}; sleep 300")
        lines = wait_for(lambda: len(found := task_lines(out)) == 2 and found, 30, "a line of each task")
        tasks = {fields[2]: fields for fields in map(str.split, lines)}
        assert sorted(tasks) == ["node2", "node3"] and {tasks[name][1] for name in tasks} == {"0", "1"}, lines
        for name, fields in tasks.items():
            node = lab.node(name)
            assert fields[3] == node.marker, lines  # the task is the compute node's process, not node1's
            assert f"inet {node.address}/24" in " ".join(fields), lines  # in the node's own namespace
        assert job_state(slurm, first) == ("RUNNING", "None")
        running = slurm.pids()

        second = sbatch(lab, "--nodes=2", f"--output={tmp_path / 'second.out'}", wrap="srun sleep 300")
        wait_for(lambda: job_state(slurm, second) == ("PENDING", "Resources"), 20, "the second job waiting for nodes")

        cancelled = on_login(lab, f"scancel {first}")
        assert cancelled.returncode == 0, cancelled.stderr
        wait_for(lambda: job_state(slurm, second)[0] == "RUNNING", 30, "the second job to run once the first ended")
        assert job_state(slurm, first)[0] == "CANCELLED"
        wait_for(lambda: sum(name == "sleep" for name in names(slurm.pids())) == 2, 10, "a task on each node")
        running |= slurm.pids()
    assert not alive(running), "closing the Slurm cluster left its processes or a running job's behind"


def test_partitions_time_limits_a_shared_home_and_a_partition_that_does_not_exist(lab: SimCluster):
    with SimSlurm(lab, ["node2", "node3"], partitions={"short": ["node3"]}, max_time={"short": 5},
                  shared_home="node1") as slurm:
        limits = slurm.run(["sinfo", "--noheader", "--format=%P %l %N"]).stdout.split("\n")
        assert "debug* infinite node[2-3]" in limits and "short 5:00 node3" in limits, limits

        # srun on the login node: the task runs on node3 and sees node1's ~/.homegpu as its own.
        ran = on_login(lab, "srun --partition=short sh -c 'echo $SLURMD_NODENAME > ~/.homegpu/from-job; "
                            "echo $HOMEGPU_SIMNODE'")
        assert ran.returncode == 0 and ran.stdout.strip() == lab.node("node3").marker, ran.stdout + ran.stderr
        assert (lab.node("node1").work_dir / "from-job").read_text() == "node3\n"

        refused = on_login(lab, "sbatch --partition=nope --wrap true")
        assert refused.returncode == 1 and "invalid partition" in refused.stderr.lower(), refused.stderr
        conf = slurm.conf
    assert not conf.exists()  # close() removed its temp dir

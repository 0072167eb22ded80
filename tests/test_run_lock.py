"""remote/jobs/lock.py against the real sshd test cluster: one run per job, whoever asks.

Two controllers are two Cluster objects (two SSH connections to node1). Owners other than this
test process are ProcessIdentity values: a dead pid on this machine, or a host that is not this one.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import socket
import subprocess
from pathlib import Path

import pytest

from homegpu.remote.config.cluster_spec import load_cluster
from homegpu.remote.jobs.lock import ProcessIdentity, acquire, holder, refresh, release
from homegpu.remote.nodes.cluster import Cluster


NODE = "node1"


@pytest.fixture
def job() -> str:
    return f"lock-test-{secrets.token_hex(3)}"  # each test its own lock


async def _open(cluster_toml: Path) -> tuple[Cluster, object, str]:
    cluster = Cluster(load_cluster(cluster_toml), stream_stats=False)
    await cluster.__aenter__()
    node = cluster.node(NODE)
    await node.wait_online(timeout=60)
    return cluster, node, cluster.spec.work_dir_of(node.spec)


@pytest.fixture
def node_disk(sim_cluster) -> Path:
    """The lock node's ~/.homegpu as this machine sees it (the node's own disk: nothing is shared)."""
    return sim_cluster.node(NODE).work_dir


def _lock_file(node_disk: Path, job: str) -> dict:
    return json.loads((node_disk / "locks" / f"{job}.lock").read_text())


def _dead_pid() -> int:
    process = subprocess.Popen(["true"])
    process.wait()
    return process.pid


async def test_of_concurrent_acquires_exactly_one_wins(cluster_toml, job, node_disk):
    (first, node_a, work_dir), (second, node_b, _) = await asyncio.gather(_open(cluster_toml), _open(cluster_toml))
    try:
        runs = [f"run-{i}" for i in range(8)]
        results = await asyncio.gather(*(acquire((node_a, node_b)[i % 2], work_dir, job, run)
                                         for i, run in enumerate(runs)))
        winners = [run for run, result in zip(runs, results) if result.acquired]
        assert len(winners) == 1, results
        winner, = winners
        for result in results:
            if not result.acquired:
                assert result.holder.run_id == winner
                assert (result.holder.host, result.holder.pid) == (socket.gethostname(), ProcessIdentity.this().pid)
                assert result.holder.age is not None and result.holder.age >= 0
        on_disk = _lock_file(node_disk, job)
        assert (on_disk["run_id"], on_disk["host"], on_disk["pid"]) == (winner, socket.gethostname(),
                                                                        ProcessIdentity.this().pid)
        assert on_disk["heartbeat"] >= on_disk["acquired"] > 0
        again = await acquire(node_b, work_dir, job, winner)  # the winner asking again keeps it
        assert again.acquired and again.took_over is None
        assert (await holder(node_a, work_dir, job)).run_id == winner
    finally:
        await asyncio.gather(first.close(), second.close())


async def test_a_lock_of_a_dead_controller_on_this_machine_is_taken_over(cluster_toml, job, node_disk):
    cluster, node, work_dir = await _open(cluster_toml)
    try:
        this = ProcessIdentity.this()
        dead = ProcessIdentity(this.host, _dead_pid(), this.machine)
        assert (await acquire(node, work_dir, job, "crashed-run", owner=dead)).acquired
        result = await acquire(node, work_dir, job, "new-run")  # default stale_after: minutes
        assert result.acquired
        assert (result.took_over.run_id, result.took_over.pid) == ("crashed-run", dead.pid)
        assert _lock_file(node_disk, job)["run_id"] == "new-run"
        assert not await refresh(node, work_dir, job, "crashed-run", owner=dead)  # it lost the lock

        alive = ProcessIdentity(this.host, this.pid, this.machine, this.start_time)  # a live one is kept
        held = await acquire(node, work_dir, job, "third-run", owner=alive)
        assert not held.acquired and held.holder.run_id == "new-run"
    finally:
        await cluster.close()


async def test_a_lock_from_another_host_is_stale_only_without_heartbeats(cluster_toml, job, node_disk):
    cluster, node, work_dir = await _open(cluster_toml)
    try:
        laptop = ProcessIdentity("other-laptop", 4242, "another-machine-id")
        assert (await acquire(node, work_dir, job, "laptop-run", owner=laptop)).acquired
        held = await acquire(node, work_dir, job, "my-run")  # pid 4242 means nothing on this host
        assert not held.acquired and held.holder.host == "other-laptop"

        before = _lock_file(node_disk, job)["heartbeat"]
        assert await refresh(node, work_dir, job, "laptop-run", owner=laptop)
        assert _lock_file(node_disk, job)["heartbeat"] > before

        taken = await acquire(node, work_dir, job, "my-run", stale_after=0.0)  # no heartbeat since
        assert taken.acquired and taken.took_over.run_id == "laptop-run"
        assert not await refresh(node, work_dir, job, "laptop-run", owner=laptop)
        assert await refresh(node, work_dir, job, "my-run")
    finally:
        await cluster.close()


async def test_a_controller_that_took_a_run_over_takes_its_live_lock(cluster_toml, job, node_disk):
    """serve restarted while its queue's run went on: asking with that run's id, it gets the lock at once
    (heartbeats fresh or not), and then alone refreshes and releases it; any other run id is refused."""
    cluster, node, work_dir = await _open(cluster_toml)
    try:
        killed_serve = ProcessIdentity("serve-host", 4242, "another-machine-id")
        assert (await acquire(node, work_dir, job, "queued-run", owner=killed_serve)).acquired
        assert not (await acquire(node, work_dir, job, "other-run")).acquired
        resumed = await acquire(node, work_dir, job, "queued-run")
        assert resumed.acquired and resumed.took_over is None
        assert _lock_file(node_disk, job)["pid"] == ProcessIdentity.this().pid
        assert not await refresh(node, work_dir, job, "queued-run", owner=killed_serve)
        assert await release(node, work_dir, job, "queued-run")
    finally:
        await cluster.close()


async def test_release_frees_the_lock_and_only_its_owner_can(cluster_toml, job, node_disk):
    cluster, node, work_dir = await _open(cluster_toml)
    try:
        assert (await acquire(node, work_dir, job, "run-a")).acquired
        assert not await release(node, work_dir, job, "run-b")  # not the owner: left alone
        assert (await holder(node, work_dir, job)).run_id == "run-a"
        assert await release(node, work_dir, job, "run-a")
        assert not (node_disk / "locks" / f"{job}.lock").exists()
        assert await holder(node, work_dir, job) is None
        assert not await refresh(node, work_dir, job, "run-a")
        assert (await acquire(node, work_dir, job, "run-b")).acquired
        assert await release(node, work_dir, job, "run-b")
    finally:
        await cluster.close()


@pytest.mark.parametrize("name", ["", "../escape", ".hidden", "a/b"])
async def test_a_job_name_that_is_no_file_name_is_refused(cluster_toml, name):
    cluster, node, work_dir = await _open(cluster_toml)
    try:
        with pytest.raises(ValueError):
            await acquire(node, work_dir, name, "run")
    finally:
        await cluster.close()

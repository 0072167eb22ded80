"""Who owns each GPU process: the node-side lookup (remote/node_side/agent/process_owners.py), the words the
controller makes of it (remote/nodes/owners.py) and the agent shipping it.

There is no GPU here. The parsers and the classification are table-tested; the lookup runs on this
machine's real /proc against real processes (one with homegpu's worker markers, one run as
`nobody`) and real containers of the test Docker engine; the agent runs on a replayed H100
nvidia-smi whose recorded process entries are mapped onto those real pids (gpu_replay.write_apps_with_pids).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import docker
import pytest

from gpu_replay import FIXTURES, write_apps_with_pids, write_replay_nvidia_smi
from homegpu.remote.events import NA, GpuProcess, GpuStats, NodeStats, ProcessOwner
from homegpu.remote.jobs.launch_plan import worker_markers
from homegpu.remote.node_side.agent import process_owners
from homegpu.remote.node_side.agent.process_owners import (
    ProcessOwners, classify, parse_cgroup_container, parse_container_reply, parse_markers,
    parse_status_uid,
)
from homegpu.remote.nodes.agent_bundle import agent_command, agent_payload
from homegpu.remote.nodes.owners import budget_text, card_budgets, foreign_memory_warnings, owner_text
from homegpu.remote.nodes.stats import parse_agent_line
from homegpu.remote.runtimes import docker_runtime
from homegpu.trainer.gpu_budget import BUDGET_ENV

H100 = FIXTURES / "h100-80gb-hbm3"
NOBODY = 65534
CONTAINER_ID = "4f2a" + "0" * 56 + "beef"
BUDGET = 5 * 1024 ** 3  # a job's gpu_memory = "5GiB", as its workers' environment carries it


# --- parsers ----------------------------------------------------------------------------------------

def test_status_gives_the_real_uid() -> None:
    text = "Name:\tsleep\nState:\tS (sleeping)\nUid:\t65534\t0\t65534\t65534\nGid:\t65534\t65534\t65534\t65534\n"
    assert parse_status_uid(text) == NOBODY
    assert parse_status_uid("Name:\tx\n") is None


def test_markers_are_read_from_environ_and_nothing_else() -> None:
    environ = b"PATH=/usr/bin\0HOMEGPU_RUN_ID=demo-1\0HOMEGPU_WORKER_INDEX=2\0HOMEGPU_JOB=demo\0SECRET=x=y\0"
    assert parse_markers(environ) == {"HOMEGPU_RUN_ID": "demo-1", "HOMEGPU_WORKER_INDEX": "2", "HOMEGPU_JOB": "demo"}
    assert parse_markers(environ + b"HOMEGPU_GPU_MEMORY=5368709120\0")["HOMEGPU_GPU_MEMORY"] == "5368709120"
    assert parse_markers(b"") == {}


@pytest.mark.parametrize(("cgroup", "container"), [
    (f"0::/system.slice/docker-{CONTAINER_ID}.scope\n", CONTAINER_ID),  # systemd driver, cgroup v2
    (f"12:memory:/docker/{CONTAINER_ID}\n1:name=systemd:/docker/{CONTAINER_ID}\n", CONTAINER_ID),  # cgroupfs, v1
    (f"0::/user.slice/user-1000.slice/user@1000.service/user.slice/libpod-{CONTAINER_ID}.scope\n", CONTAINER_ID),
    (f"0::/kubepods.slice/kubepods-pod1.slice/cri-containerd-{CONTAINER_ID}.scope\n", CONTAINER_ID),
    ("0::/user.slice/user-0.slice/session-3.scope\n", None),
    ("0::/\n", None),  # the agent itself in a cgroup namespace
])
def test_cgroup_names_the_container(cgroup: str, container: str | None) -> None:
    assert parse_cgroup_container(cgroup) == container


def test_classify_markers_then_labels_then_container_then_user() -> None:
    markers = {"HOMEGPU_RUN_ID": "r1", "HOMEGPU_JOB": "demo", "HOMEGPU_WORKER_INDEX": "3"}
    labels = {"homegpu.run": "r2", "homegpu.job": "other", "homegpu.index": "0"}
    assert classify(1000, "alice", markers) == {"kind": "worker", "uid": 1000, "user": "alice", "run_id": "r1",
                                                  "job": "demo", "index": 3}
    assert classify(1000, "alice", {}, CONTAINER_ID, labels, "homegpu-r2-node1-g1") == {
        "kind": "worker", "uid": 1000, "user": "alice", "run_id": "r2", "job": "other", "index": 0,
        "container": CONTAINER_ID[:12], "container_name": "homegpu-r2-node1-g1"}
    assert classify(0, "root", None, CONTAINER_ID, {}, "ollama") == {
        "kind": "container", "uid": 0, "user": "root", "container": CONTAINER_ID[:12], "container_name": "ollama"}
    assert classify(NOBODY, "nobody") == {"kind": "process", "uid": NOBODY, "user": "nobody"}
    assert classify(4242, None) == {"kind": "process", "uid": 4242, "user": "4242"}  # no passwd entry


def test_a_workers_budget_is_read_from_its_markers_or_its_containers_labels() -> None:
    markers = {"HOMEGPU_RUN_ID": "r1", "HOMEGPU_JOB": "demo", "HOMEGPU_WORKER_INDEX": "0"}
    assert classify(1000, "alice", {**markers, "HOMEGPU_GPU_MEMORY": str(BUDGET)})["gpu_memory"] == BUDGET
    labels = {"homegpu.run": "r2", "homegpu.job": "demo", "homegpu.index": "1", "homegpu.gpu_memory": str(BUDGET)}
    assert classify(0, "root", {}, CONTAINER_ID, labels)["gpu_memory"] == BUDGET
    for nonsense in ("", "0", "lots", "-5"):  # no budget, or one the agent cannot read: none said
        assert "gpu_memory" not in classify(1000, "alice", {**markers, "HOMEGPU_GPU_MEMORY": nonsense})
    stranger = classify(NOBODY, "nobody", {"HOMEGPU_GPU_MEMORY": str(BUDGET)})  # a budget without a run: no worker
    assert stranger == {"kind": "process", "uid": NOBODY, "user": "nobody"}


def test_docker_reply_gives_name_and_labels() -> None:
    body = json.dumps({"Name": "/ollama", "Config": {"Labels": {"homegpu.run": "r"}}}).encode()
    assert parse_container_reply(b"HTTP/1.0 200 OK\r\nContent-Type: application/json\r\n\r\n" + body) == (
        "ollama", {"homegpu.run": "r"})
    assert parse_container_reply(b"HTTP/1.0 404 Not Found\r\n\r\n{}") is None


def test_the_runtimes_mark_workers_as_the_lookup_reads_them() -> None:
    """The controller's marker and label names are the ones the node-side lookup reads."""
    assert {*worker_markers("demo", "r", 1), BUDGET_ENV} == set(process_owners.MARKERS)
    prefix = docker_runtime.LABEL_PREFIX
    assert {f"{prefix}run", f"{prefix}job", f"{prefix}index", f"{prefix}gpu_memory"} == {
        process_owners.LABEL_RUN, process_owners.LABEL_JOB, process_owners.LABEL_INDEX, process_owners.LABEL_BUDGET}


# --- what the controller says -------------------------------------------------------------------------

def owner(**fields) -> ProcessOwner:
    return ProcessOwner(**fields)


def test_owner_text() -> None:
    worker = owner(kind="worker", run_id="r1", job="demo", index=0, user="alice", uid=1000)
    assert owner_text(worker, "r1") == "this job's worker 0"
    assert owner_text(worker, "r2") == "homegpu worker 0 of job demo run r1"
    assert owner_text(worker) == "homegpu worker 0 of job demo run r1"
    assert owner_text(owner(kind="container", container="4f2a00000000", container_name="ollama", user="root")) \
        == "container ollama (user root)"
    assert owner_text(owner(kind="container", container="4f2a00000000")) == "container 4f2a00000000"
    assert owner_text(owner(kind="process", user="nobody", uid=NOBODY)) == "user nobody"
    assert owner_text(owner(kind="unknown")) == owner_text(None) == "owner unknown"


def h100(*processes: GpuProcess, index: int = 0) -> GpuStats:
    return GpuStats(index, "NVIDIA H100 80GB HBM3", f"GPU-{index}", 100, 20085, 81559, 52, 702.84, 700.0, 1410,
                    processes)


def node_stats(*gpus: GpuStats) -> NodeStats:
    return NodeStats(0.0, "nvidia-smi", gpus, "580.159.04", "13.0", 5.0, (0.1, 0.1, 0.1), 1000, 8000, 1000)


def test_a_card_shared_by_budgets_says_whose_and_how_much_each_worker_once() -> None:
    def worker(pid: int, run: str, index: int, budget=NA, mem: int = 4000) -> GpuProcess:
        return GpuProcess(pid, "python3", mem, owner(kind="worker", run_id=run, job="sweep", index=index,
                                                     gpu_memory=budget))

    stranger = GpuProcess(777, "python3", 20076, owner(kind="process", user="nobody", uid=NOBODY))
    loader = GpuProcess(901, "python3", 300, worker(900, "r1", 0, BUDGET).owner)  # worker 0's child: its markers
    card = h100(worker(900, "r1", 0, BUDGET), loader, worker(902, "r2", 0, BUDGET), worker(903, "r2", 1, BUDGET),
                stranger, worker(904, "r3", 0))  # r3 has no gpu_memory: a whole-GPU run's worker
    assert card_budgets(card) == "budgets 15.0 GiB of 79.6 GiB, for 2 runs"
    assert card_budgets(h100(worker(900, "r1", 0, BUDGET))) == "budgets 5.0 GiB of 79.6 GiB, for 1 run"
    assert card_budgets(h100(stranger, worker(904, "r3", 0))) == card_budgets(h100()) == ""
    assert budget_text(worker(900, "r1", 0, BUDGET).owner) == "gpu_memory 5.0 GiB"
    assert budget_text(worker(900, "r1", 0, 512 * 1024 ** 2).owner) == "gpu_memory 512 MiB"
    assert budget_text(stranger.owner) == budget_text(worker(904, "r3", 0).owner) == budget_text(None) == ""


def test_preflight_warns_of_other_processes_over_a_tenth_of_the_jobs_gpus() -> None:
    stranger = GpuProcess(777, "python3", 20076, owner(kind="process", user="nobody", uid=NOBODY))
    small = GpuProcess(778, "Xorg", 8000, owner(kind="process", user="root", uid=0))  # 9.8%: not worth a word
    ours = GpuProcess(779, "python3", 30000, owner(kind="worker", run_id="r1", job="demo", index=0))
    unknown = GpuProcess(780, "python3", 9000)  # no owner known (an older agent)
    stats = node_stats(h100(stranger, small, ours), h100(unknown, index=1))
    assert foreign_memory_warnings("node3", stats, None, "r1") == [
        "node3: GPU 0 already holds 19.6 GiB (25%) for pid 777 python3 (user nobody); the job's workers there "
        "get that much less memory",
        "node3: GPU 1 already holds 8.8 GiB (11%) for pid 780 python3 (owner unknown); the job's workers there "
        "get that much less memory"]
    assert len(foreign_memory_warnings("node3", stats, [1], "r1")) == 1  # the plan gives the job GPU 1 only
    assert foreign_memory_warnings("node3", stats, [], "r1") == []  # CPU workers there
    assert len(foreign_memory_warnings("node3", stats, None, "r0")) == 3  # another run's worker counts too
    assert foreign_memory_warnings("node3", None, None, "r1") == []


# --- the lookup on this machine's real processes ---------------------------------------------------------

@pytest.fixture
def real_processes(root):
    """A worker-like process (homegpu's markers and its job's gpu_memory in its environment) and a stranger's,
    run as nobody."""
    env = {**os.environ, **worker_markers("demo", "demo-20260101-000000-abcd", 1), BUDGET_ENV: str(BUDGET)}
    worker = subprocess.Popen(["sleep", "300"], env=env)
    stranger = subprocess.Popen(["sleep", "300"], user=NOBODY, group=NOBODY, extra_groups=[])
    try:
        yield worker.pid, stranger.pid
    finally:
        for proc in (worker, stranger):
            proc.kill()
            proc.wait()


def test_real_processes_are_told_apart(real_processes) -> None:
    worker, stranger = real_processes
    owners = ProcessOwners()
    assert owners.owner(worker) == {"kind": "worker", "uid": os.getuid(), "user": "root",
                                    "run_id": "demo-20260101-000000-abcd", "job": "demo", "index": 1,
                                    "gpu_memory": BUDGET}
    assert owners.owner(stranger) == {"kind": "process", "uid": NOBODY, "user": "nobody"}
    assert owners.owner(2 ** 22 + 1) == {"kind": "unknown"}  # above pid_max: no such process


def test_owners_are_looked_up_once_per_pid_and_forgotten_when_it_goes(real_processes, monkeypatch) -> None:
    worker, stranger = real_processes
    owners, looked_up = ProcessOwners(), []
    lookup = owners.owner
    monkeypatch.setattr(owners, "owner", lambda pid: looked_up.append(pid) or lookup(pid))
    for _ in range(3):  # three process-cadence refreshes of the same list
        lists = [[{"pid": worker, "mem": 1}], [{"pid": stranger, "mem": 2}]]
        owners.annotate(lists)
    assert sorted(looked_up) == sorted([worker, stranger])
    assert lists[1][0]["owner"]["user"] == "nobody"
    owners.annotate([[{"pid": worker, "mem": 1}]])
    assert set(owners.by_pid) == {worker}  # the stranger's pid may be reused: forgotten


def test_containers_are_named_and_homegpu_labels_make_a_worker(docker_engine, busybox_image) -> None:
    client = docker.DockerClient(base_url=f"unix://{docker_engine.socket_path}")
    labels = {"homegpu.run": "demo-20260101-000000-abcd", "homegpu.job": "demo", "homegpu.index": "2",
              "homegpu.gpu_memory": str(BUDGET)}
    ours = client.containers.run(busybox_image, ["sleep", "300"], labels=labels, detach=True,
                                 name="homegpu-owner-test-worker")
    other = client.containers.run(busybox_image, ["sleep", "300"], detach=True, name="homegpu-owner-test-other")
    try:
        for container in (ours, other):
            container.reload()  # run() returns what create() said: no pid yet
        owners = ProcessOwners(docker_socket=docker_engine.socket_path)
        found = {name: owners.owner(c.attrs["State"]["Pid"]) for name, c in (("ours", ours), ("other", other))}
    finally:
        for container in (ours, other):
            container.remove(force=True)
        client.close()
    assert found["ours"] == {"kind": "worker", "uid": 0, "user": "root", "run_id": "demo-20260101-000000-abcd",
                             "job": "demo", "index": 2, "gpu_memory": BUDGET, "container": ours.id[:12],
                             "container_name": "homegpu-owner-test-worker"}
    assert found["other"] == {"kind": "container", "uid": 0, "user": "root", "container": other.id[:12],
                              "container_name": "homegpu-owner-test-other"}


def test_the_shipped_agent_marks_replayed_gpu_processes_with_real_owners(real_processes, tmp_path: Path) -> None:
    """The agent as nodes run it (bootstrap + payload), on the H100's recorded nvidia-smi output
    whose one recorded training process is mapped onto the two real pids."""
    worker, stranger = real_processes
    apps = write_apps_with_pids(H100 / "apps_load.csv", [worker, stranger], tmp_path / "apps.csv")
    bin_dir = write_replay_nvidia_smi(tmp_path / "bin", H100 / "gpus_load.csv", apps,
                                      version_fixture=H100 / "smi_version.txt")
    argv = agent_command(python=sys.executable, interval=0.2, work_dir=str(tmp_path), source="nvidia-smi")
    result = subprocess.run([*argv, "--once"], input=agent_payload(), capture_output=True, timeout=60,
                            env={**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"})
    assert result.returncode == 0, result.stderr
    [gpu] = parse_agent_line(result.stdout.decode().splitlines()[0]).gpus
    by_pid = {process.pid: process for process in gpu.processes}
    assert by_pid[worker].owner == ProcessOwner("worker", "root", 0, "demo-20260101-000000-abcd", "demo", 1,
                                                gpu_memory=BUDGET)
    assert by_pid[stranger].owner == ProcessOwner("process", "nobody", NOBODY)
    assert by_pid[stranger].mem == 20076  # as recorded


def test_an_agent_without_its_owners_module_still_streams(tmp_path: Path) -> None:
    """Run as a script from a folder with its other modules but without process_owners.py: processes
    simply have no owner."""
    from homegpu.remote.node_side import AGENT_MODULES
    from homegpu.remote.node_side.agent import stats_agent

    node_side = Path(stats_agent.__file__).parent
    for name in {"stats_agent", *AGENT_MODULES} - {"process_owners"}:
        (tmp_path / f"{name}.py").write_bytes((node_side / f"{name}.py").read_bytes())
    script = tmp_path / "stats_agent.py"
    bin_dir = write_replay_nvidia_smi(tmp_path / "bin", H100 / "gpus_load.csv", H100 / "apps_load.csv")
    result = subprocess.run([sys.executable, str(script), "--once", "--source", "nvidia-smi", "--work-dir",
                             str(tmp_path)], capture_output=True, text=True, timeout=60,
                            env={**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"})
    assert result.returncode == 0, result.stderr
    [gpu] = parse_agent_line(result.stdout.splitlines()[0]).gpus
    assert [(p.pid, p.owner) for p in gpu.processes] == [(468, None)]

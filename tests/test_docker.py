"""Docker over SSH: the forwarded socket, DockerRuntime, and `homegpu image build|copy`.

Everything runs against real engines through real sshd nodes (tests/simcluster.py). The nodes here
share this machine's Docker engine; the copy and build commands, which need engines apart, are
tested on machines with engines of their own in tests/test_image_commands.py. Containers run the
busybox test image (tests/images.py), built here in seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import stat
import threading
import time
import uuid
from dataclasses import replace
from pathlib import Path
from typing import AsyncIterator, Iterator

import docker
import docker.errors
import pytest

from helpers import wait_until
from images import busybox_image  # noqa: F401  (fixture)
from simcluster import SimCluster
from homegpu.remote.config.cluster_spec import ClusterSpec, NodeSpec, load_cluster
from homegpu.remote.config.job_spec import JobSpec
from homegpu.remote.images.node_images import build_message_lines
from homegpu.remote.nodes.cluster import Cluster
from homegpu.remote.nodes.transport import SshTransport
from homegpu.remote.plan.tfconfig import tf_config_json, worker_slots
from homegpu.remote.runtimes.base import WorkerLaunch
from homegpu.remote.runtimes.docker_link import DockerUnavailable, SocketForwarder, docker_client, explain
from homegpu.remote.runtimes.docker_runtime import (
    CODE_DIR, DATA_DIR, OUT_DIR, DockerRuntime, container_args, container_name, logs_argv, status_from_attrs,
)
from homegpu.remote.runtimes.errors import RuntimeError_



# -- fixtures --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def engine(docker_engine) -> Iterator[docker.DockerClient]:
    """A client of the engine every simulated node reaches by default."""
    client = docker.DockerClient(base_url=f"unix://{docker_engine.socket_path}")
    yield client
    client.close()


@pytest.fixture(scope="module")
def docker_toml(sim_cluster: SimCluster, tmp_path_factory) -> Path:
    """cluster.toml with every node on runtime "docker" and the default (shared) engine."""
    return sim_cluster.write_cluster_toml(tmp_path_factory.mktemp("docker") / "cluster.toml", runtime="docker")


@contextlib.asynccontextmanager
async def online(toml: Path, *names: str) -> AsyncIterator[Cluster]:
    """The cluster of `toml` with the named nodes (default: all) connected; no stats agents."""
    async with Cluster(load_cluster(toml), stream_stats=False) as cluster:
        for name in names or tuple(cluster.nodes):
            await cluster.node(name).wait_online(60)
        yield cluster


def by_label(client: docker.DockerClient, key: str, value: str, running_only: bool = False) -> list:
    filters = {"label": f"homegpu.{key}={value}"}
    if running_only:
        filters["status"] = "running"
    return client.containers.list(all=True, filters=filters)


# -- the forwarded socket --------------------------------------------------------------------------


async def test_forwarded_socket_answers_and_lives_in_a_private_dir_removed_on_exit(docker_toml, engine):
    async with online(docker_toml, "node1") as cluster:
        node = cluster.node("node1")
        assert isinstance(node.transport, SshTransport)  # really over SSH, not the local socket
        async with docker_client(node) as link:
            assert await link.call(link.client.ping) is True
            version = await link.call(link.client.version)
            assert version["ApiVersion"] == engine.version()["ApiVersion"]
            assert version["Version"] == engine.version()["Version"]
            private_dir = os.path.dirname(link.socket_path)
            assert link.socket_path != node.spec.docker_socket
            assert stat.S_ISSOCK(os.stat(link.socket_path).st_mode)
            assert stat.S_IMODE(os.stat(private_dir).st_mode) == 0o700
            assert os.stat(private_dir).st_uid == os.getuid()
        assert not os.path.exists(private_dir)


async def test_socket_dir_is_removed_when_the_block_fails(docker_toml):
    async with online(docker_toml, "node1") as cluster:
        with pytest.raises(ZeroDivisionError):
            async with docker_client(cluster.node("node1")) as link:
                private_dir = os.path.dirname(link.socket_path)
                1 / 0
    assert not os.path.exists(private_dir)


async def test_a_local_node_uses_its_socket_directly(docker_engine, engine):
    spec = ClusterSpec(name="here", nodes=(NodeSpec(name="here", host="local", runtime="docker",
                                                    docker_socket=docker_engine.socket_path),))
    async with Cluster(spec, stream_stats=False) as cluster:
        await cluster.node("here").wait_online(60)
        async with docker_client(cluster.node("here")) as link:
            assert link.socket_path == docker_engine.socket_path
            assert (await link.call(link.client.version))["Version"] == engine.version()["Version"]
    bad = ClusterSpec(name="here", nodes=(NodeSpec(name="here", host="local", docker_socket="/nonexistent/d.sock"),))
    async with Cluster(bad, stream_stats=False) as cluster:
        await cluster.node("here").wait_online(60)
        with pytest.raises(DockerUnavailable, match=r"^here: no Docker socket at /nonexistent/d.sock"):
            async with docker_client(cluster.node("here")):
                pass


async def test_unusable_sockets_are_explained_per_node(sim_cluster, tmp_path):
    not_a_socket = tmp_path / "plain-file"
    not_a_socket.write_text("")
    refusing = tmp_path / "dead.sock"  # a socket file nobody listens on: a stopped engine's leftover
    with socket.socket(socket.AF_UNIX) as dead:
        dead.bind(str(refusing))
    toml = sim_cluster.write_cluster_toml(tmp_path / "cluster.toml", runtime="docker", node_overrides={
        "node1": {"docker_socket": "/nonexistent/docker.sock"},
        "node2": {"docker_socket": str(refusing)},
        "node3": {"docker_socket": str(not_a_socket)},
    })
    expected = {"node1": "no Docker socket at /nonexistent/docker.sock: install Docker Engine",
                "node2": "the Docker engine is not running",
                "node3": "is not a socket"}
    async with online(toml) as cluster:
        for name, text in expected.items():
            with pytest.raises(DockerUnavailable) as caught:
                async with docker_client(cluster.node(name)):
                    pass
            message = str(caught.value)
            assert message.startswith(f"{name}: ") and text in message, message
            assert "\n" not in message


def _rss_mib() -> int:
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmRSS:")) >> 10


async def test_forwarder_memory_stays_bounded_when_the_local_reader_is_slow(docker_toml, tmp_path):
    """asyncssh's own forward_local_path buffers about as much as it carries here (~300 MiB)."""
    total = 320 << 20
    remote, local = str(tmp_path / "remote.sock"), str(tmp_path / "local.sock")
    server = socket.socket(socket.AF_UNIX)
    server.bind(remote)
    server.listen(1)

    def send_all() -> None:  # "the engine": answers as fast as SSH takes it
        peer, _ = server.accept()
        with peer:
            for _ in range(total >> 20):
                peer.sendall(b"x" * (1 << 20))
        server.close()

    def read_slowly(received: list[int]) -> None:  # "docker load on a slower node"
        with socket.socket(socket.AF_UNIX) as client:
            client.connect(local)
            while data := client.recv(1 << 16):
                received.append(len(data))
                time.sleep(0.001)

    async with online(docker_toml, "node1") as cluster:
        forwarder = SocketForwarder(cluster.node("node1").transport.conn, remote)
        await forwarder.listen(local)
        received: list[int] = []
        threads = [threading.Thread(target=send_all), threading.Thread(target=read_slowly, args=(received,))]
        start_rss = peak_rss = _rss_mib()
        for thread in threads:
            thread.start()
        while threads[1].is_alive():
            peak_rss = max(peak_rss, _rss_mib())
            await asyncio.sleep(0.05)
        await forwarder.close()
    assert sum(received) == total
    assert peak_rss - start_rss < 128, f"the forwarder buffered {peak_rss - start_rss} MiB"


def test_permission_denied_names_the_docker_group_fix():
    assert explain("node1", "alice", "/var/run/docker.sock", "denied") == (
        "node1: permission denied on /var/run/docker.sock: add the user to the docker group "
        "(sudo usermod -aG docker alice) and reconnect")
    assert explain("node1", "alice", "/s", "other boom").startswith("node1: cannot reach the Docker engine at /s (boom)")


# -- pure parts of the runtime ---------------------------------------------------------------------


def _launch(job: JobSpec, spec, label: str, generation: int, argv: tuple[str, ...], image: str,
            run_id: str, data_dir: str = "", code_dir: str = "", output_dir: str = "") -> WorkerLaunch:
    slots = worker_slots(spec, job)
    slot = next(s for s in slots if s.label == label)
    return WorkerLaunch(job=job.name, run_id=run_id, generation=generation, slot=slot,
                        tf_config=tf_config_json(slots, slot.index), argv=argv, cwd=CODE_DIR, python=argv[0],
                        code_dir=code_dir, output_dir=output_dir,
                        env={"HOMEGPU_OUTPUT_DIR": OUT_DIR}, image=image, data_dir=data_dir)


def test_container_args_host_network_labels_mounts_and_gpus(cluster_toml):
    spec = load_cluster(cluster_toml)
    job = JobSpec(name="train", workers_per_node=2, nodes=("node2",))
    launch = _launch(job, spec, "node2#1", 3, ("python3", "-m", "x"), "img:1", "train-20260101-000000-abcd")
    args = container_args(launch, code_dir="/n/code", out_dir="/n/out", data_dir="", gpus=False, user="1000:1000")
    assert args["name"] == "homegpu-train-20260101-000000-abcd-node2_1-g3"
    assert args["network_mode"] == "host" and args["init"] is True and args["user"] == "1000:1000"
    assert args["labels"] == {"homegpu.job": "train", "homegpu.run": "train-20260101-000000-abcd",
                              "homegpu.node": "node2", "homegpu.index": "1", "homegpu.generation": "3",
                              "homegpu.label": "node2#1"}
    assert args["environment"]["TF_CONFIG"] == launch.tf_config
    assert [(m["Target"], m["Source"], m["ReadOnly"]) for m in args["mounts"]] == [
        (CODE_DIR, "/n/code", True), (OUT_DIR, "/n/out", False)]
    assert "device_requests" not in args
    with_gpus = container_args(launch, code_dir="/n/code", out_dir="/n/out", data_dir="/n/data", gpus=True)
    assert (DATA_DIR, "/n/data", True) in [(m["Target"], m["Source"], m["ReadOnly"]) for m in with_gpus["mounts"]]
    (request,) = with_gpus["device_requests"]
    assert request["Count"] == -1 and request["Capabilities"] == [["gpu"]]
    assert "user" not in with_gpus
    budgeted = replace(launch, env={**launch.env, "HOMEGPU_GPU_MEMORY": "5368709120"})  # gpu_memory = "5GiB"
    labels = container_args(budgeted, code_dir="/n/code", out_dir="/n/out", data_dir="", gpus=True)["labels"]
    assert labels == {**args["labels"], "homegpu.gpu_memory": "5368709120"}  # for an agent that cannot read its env


@pytest.mark.parametrize("state, exit_code, expected", [
    ("running", 0, ("running", None)),
    ("restarting", 1, ("running", None)),
    ("exited", 0, ("exited", 0)),
    ("exited", 137, ("exited", 137)),
    ("created", 0, ("missing", None)),
    ("dead", 255, ("vanished", None)),
])
def test_status_from_container_state(state, exit_code, expected):
    attrs = {"Config": {"Labels": {"homegpu.label": "node1", "homegpu.generation": "2", "homegpu.run": "r",
                                   "homegpu.job": "j"}},
             "State": {"Status": state, "ExitCode": exit_code}}
    status = status_from_attrs(attrs)
    assert (status.state, status.exit_status) == expected
    assert (status.label, status.generation, status.run_id, status.job) == ("node1", 2, "r", "j")


def test_logs_argv_merges_stderr_and_names_the_socket():
    assert logs_argv("/run/d.sock", "c1") == ["sh", "-c", 'exec "$@" 2>&1', "sh", "docker", "--host",
                                               "unix:///run/d.sock", "logs", "--follow", "c1"]
    assert "--follow" not in logs_argv("/run/d.sock", "c1", follow=False)


# -- DockerRuntime against the engine --------------------------------------------------------------


@pytest.fixture
def run_id(engine) -> Iterator[str]:
    """A fresh run id; every container of it is removed afterwards, whatever the test did."""
    value = f"t-{uuid.uuid4().hex[:8]}"
    yield value
    for container in by_label(engine, "run", value):
        container.remove(force=True)


@pytest.fixture
def worker_dirs(tmp_path) -> tuple[Path, Path]:
    code, data = tmp_path / "code", tmp_path / "data"
    code.mkdir()
    data.mkdir()
    (code / "hello.txt").write_text("hello from code\n")
    (data / "d.txt").write_text("hello from data\n")
    return code, data


WORKER_SCRIPT = ("echo TF_CONFIG=$TF_CONFIG; echo to-stderr >&2; cat hello.txt /data/d.txt; "
                 "touch /homegpu/out/marker; exec sleep 1000")


async def test_runtime_start_status_tail_list_stop_remove_on_two_nodes(
        sim_cluster, docker_toml, engine, busybox_image, run_id, worker_dirs):
    code, data = worker_dirs
    spec = load_cluster(docker_toml)
    job = JobSpec(name="dtest", image=busybox_image, nodes=("node1", "node2"), data_dir=str(data))
    async with online(docker_toml, "node1", "node2") as cluster:
        runtimes = {name: DockerRuntime(cluster.node(name), f"{sim_cluster.node(name).work_dir}/runs")
                    for name in ("node1", "node2")}
        launches = {}
        for name, runtime in runtimes.items():
            # no job python: the image's python3 (the node's own python runs helpers on the node)
            assert runtime.worker_paths(run_id, name, str(code), str(data), "").python == "python3"
            paths = runtime.worker_paths(run_id, name, str(code), str(data), "sh")
            assert (paths.python, paths.code_dir, paths.output_dir, paths.data_dir) == ("sh", CODE_DIR, OUT_DIR,
                                                                                        DATA_DIR)
            launches[name] = _launch(job, spec, name, 1, ("sh", "-c", WORKER_SCRIPT), busybox_image, run_id,
                                     str(data), str(code), runtime.out_dir(run_id, name))
            assert await runtime.preflight(launches[name]) == []
        await asyncio.gather(*(runtimes[n].start(launches[n]) for n in runtimes))

        for name, runtime in runtimes.items():
            status = await runtime.status(run_id, name)
            assert (status.state, status.generation, status.run_id, status.job) == ("running", 1, run_id, "dtest")
            (container,) = [c for c in by_label(engine, "label", name) if c.labels["homegpu.run"] == run_id]
            labels = container.labels
            assert labels["homegpu.run"] == run_id and labels["homegpu.node"] == name
            assert labels["homegpu.index"] == str(launches[name].slot.index)
            assert container.name == container_name(run_id, name, 1)
            assert container.attrs["HostConfig"]["NetworkMode"] == "host"
            mounts = {m["Destination"]: (m["Source"], m["RW"]) for m in container.attrs["Mounts"]}
            assert mounts[CODE_DIR] == (str(code), False) and mounts[DATA_DIR] == (str(data), False)
            assert mounts[OUT_DIR] == (runtime.out_dir(run_id, name), True)

            tail = runtime.tail(run_id, name, 1).start()
            try:
                await wait_until(lambda: len(tail.lines) >= 4, 60, "four lines tailed")
                texts = [line.text for line in tail.lines]
            finally:
                await tail.stop()
            # stdout in order; stderr merged in (Docker reads the two pipes apart, so not in sequence)
            assert [t for t in texts if t != "to-stderr"] == [f"TF_CONFIG={launches[name].tf_config}",
                                                               "hello from code", "hello from data"]
            assert "to-stderr" in texts
            assert os.path.exists(f"{runtime.out_dir(run_id, name)}/marker")

            listed = await runtime.list_workers()
            assert [(w.label, w.state) for w in listed if w.run_id == run_id] == [(name, "running")]

        stopped = await asyncio.gather(*(runtime.stop(run_id, name, grace=5) for name, runtime in runtimes.items()))
        assert [(s.state, s.exit_status) for s in stopped] == [("exited", 143), ("exited", 143)]  # TERM, not KILL
        assert by_label(engine, "run", run_id, running_only=True) == []
        assert len(by_label(engine, "run", run_id)) == 2  # stopped, not removed: logs stay readable

        # the next generation gets its own container; remove() clears every generation
        relaunch = _launch(job, spec, "node1", 2, ("sh", "-c", "exit 3"), busybox_image, run_id, str(data),
                           str(code), runtimes["node1"].out_dir(run_id, "node1"))
        await runtimes["node1"].start(relaunch)
        await wait_until(lambda: by_label(engine, "generation", "2")[0].status == "exited", 60, "generation 2 exited")
        status = await runtimes["node1"].status(run_id, "node1")
        assert (status.state, status.exit_status, status.generation) == ("exited", 3, 2)
        for name, runtime in runtimes.items():
            await runtime.remove(run_id, name)
        assert by_label(engine, "run", run_id) == []
        assert (await runtimes["node1"].status(run_id, "node1")).state == "missing"


async def test_stop_kills_a_worker_that_ignores_term_after_the_grace(
        sim_cluster, docker_toml, engine, busybox_image, run_id, worker_dirs):
    code, _ = worker_dirs
    spec = load_cluster(docker_toml)
    job = JobSpec(name="stubborn", image=busybox_image, nodes=("node1",))
    async with online(docker_toml, "node1") as cluster:
        runtime = DockerRuntime(cluster.node("node1"), f"{sim_cluster.node('node1').work_dir}/runs")
        launch = _launch(job, spec, "node1", 1, ("sh", "-c", "trap '' TERM; echo ready; while :; do sleep 0.2; done"),
                         busybox_image, run_id, "", str(code), runtime.out_dir(run_id, "node1"))
        await runtime.start(launch)
        tail = runtime.tail(run_id, "node1", 1).start()
        try:
            await wait_until(lambda: any(line.text == "ready" for line in tail.lines), 60, "the container's ready line")
        finally:
            await tail.stop()
        started = time.monotonic()
        status = await runtime.stop(run_id, "node1", grace=2)
        assert time.monotonic() - started >= 1.9
        assert (status.state, status.exit_status) == ("exited", 137)
        assert by_label(engine, "run", run_id, running_only=True) == []
        # stopping what has ended already is fine
        assert (await runtime.stop(run_id, "node1", grace=2)).exit_status == 137


async def test_tail_without_follow_ends_with_the_output(
        sim_cluster, docker_toml, engine, busybox_image, run_id, worker_dirs):
    code, _ = worker_dirs
    spec = load_cluster(docker_toml)
    job = JobSpec(name="short", image=busybox_image, nodes=("node1",))
    async with online(docker_toml, "node1") as cluster:
        runtime = DockerRuntime(cluster.node("node1"), f"{sim_cluster.node('node1').work_dir}/runs")
        await runtime.start(_launch(job, spec, "node1", 1, ("sh", "-c", "echo one; echo two >&2; exit 0"),
                                    busybox_image, run_id, "", str(code), runtime.out_dir(run_id, "node1")))
        await wait_until(lambda: by_label(engine, "run", run_id)[0].status == "exited", 60, "the run's container exited")
        tail = runtime.tail(run_id, "node1", 1, follow=False).start()
        await asyncio.wait_for(tail.finished.wait(), 60)
        assert sorted(line.text for line in tail.lines) == ["one", "two"]  # stdout and stderr: no order
        assert (await runtime.status(run_id, "node1")).exit_status == 0


async def test_gpus_on_an_engine_without_the_nvidia_toolkit_fail_with_the_fix(
        sim_cluster, docker_toml, engine, busybox_image, run_id, worker_dirs):
    code, _ = worker_dirs
    spec = load_cluster(docker_toml)
    job = JobSpec(name="gpu", image=busybox_image, nodes=("node1",))
    async with online(docker_toml, "node1") as cluster:
        runtime = DockerRuntime(cluster.node("node1"), f"{sim_cluster.node('node1').work_dir}/runs", gpus=True)
        with pytest.raises(RuntimeError_) as caught:
            await runtime.start(_launch(job, spec, "node1", 1, ("true",), busybox_image, run_id, "", str(code),
                                        runtime.out_dir(run_id, "node1")))
    assert str(caught.value).startswith("node1: Docker cannot give containers the GPUs: install the NVIDIA "
                                        "Container Toolkit")
    assert by_label(engine, "run", run_id) == []  # the created container went with the failed start


async def test_preflight_names_the_node_and_the_fix_for_a_missing_image(sim_cluster, docker_toml, run_id):
    spec = load_cluster(docker_toml)
    job = JobSpec(name="noimage", image="homegpu-test/absent:1", nodes=("node3",))
    async with online(docker_toml, "node3") as cluster:
        runtime = DockerRuntime(cluster.node("node3"), f"{sim_cluster.node('node3').work_dir}/runs")
        problems = await runtime.preflight(_launch(job, spec, "node3", 1, ("true",), job.image, run_id))
    assert problems == ["image homegpu-test/absent:1 is missing on node3: run `homegpu image build --node node3` "
                        "or `homegpu image copy homegpu-test/absent:1 --from OTHER`"]


async def test_preflight_reports_an_unreachable_engine(sim_cluster, tmp_path, run_id):
    toml = sim_cluster.write_cluster_toml(tmp_path / "cluster.toml", runtime="docker",
                                          node_overrides={"node1": {"docker_socket": "/nonexistent/d.sock"}})
    spec = load_cluster(toml)
    job = JobSpec(name="noengine", image="whatever:1", nodes=("node1",))
    async with online(toml, "node1") as cluster:
        runtime = DockerRuntime(cluster.node("node1"), "/tmp/unused")
        (problem,) = await runtime.preflight(_launch(job, spec, "node1", 1, ("true",), job.image, run_id))
    assert problem.startswith("node1: no Docker socket at /nonexistent/d.sock")


# -- image build (the copy and build commands themselves: tests/test_image_commands.py) ----------


def test_build_message_lines_keep_text_and_drop_progress_bars():
    assert build_message_lines({"stream": "Step 1/2 : FROM x\n\n ---> abc\n"}) == ["Step 1/2 : FROM x", " ---> abc"]
    assert build_message_lines({"status": "Downloading", "id": "l1", "progressDetail": {"current": 1}}) == []
    assert build_message_lines({"status": "Pull complete", "id": "l1", "progressDetail": {}}) == ["l1: Pull complete"]
    assert build_message_lines({"aux": {"ID": "sha256:1"}}) == []

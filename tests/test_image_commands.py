"""`homegpu image copy` and `homegpu image build` between machines with engines of their own.

A LAN of four machines (tests/simcluster.py): node1 uses this machine's Docker engine, where the
test images are built; node2..node4 each run an engine of their own, reached as their default
/var/run/docker.sock (tests/simdocker.py). A copy therefore really crosses between engines, node
to node over the shaped links, and each engine is asked afterwards for the image id.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Iterator

import docker
import docker.errors
import pytest
from helpers import homegpu, wait_for

from images import ensure_random_image
from simcluster import SimCluster, SimNode
from simdocker import NodeEngine, image_id, own_engines
from homegpu.remote.config.cluster_spec import load_cluster
from homegpu.remote.images import chain as image_chain
from homegpu.remote.images.node_images import copy_image
from homegpu.remote.node_side import script
from homegpu.remote.nodes.cluster import Cluster


TARGETS = ("node2", "node3", "node4")
# The relay's own source is in its argv (python -c SOURCE): this line of it finds it among processes.
RELAY_MARK = b"def run_target(part, listener, hop):"


@pytest.fixture(scope="module")
def copy_lan(lan, docker_engine, busybox_image) -> Iterator[tuple[SimCluster, dict[str, NodeEngine]]]:
    with SimCluster(4, first_host=20, name="copylan") as sim, own_engines(sim, TARGETS) as engines:
        yield sim, engines


@pytest.fixture(scope="module")
def toml(copy_lan, tmp_path_factory) -> Path:
    sim, _ = copy_lan
    return sim.write_cluster_toml(tmp_path_factory.mktemp("copylan") / "cluster.toml", runtime="docker")


@pytest.fixture(scope="module")
def host(docker_engine) -> Iterator[docker.DockerClient]:
    """This machine's engine: node1's, where the images are."""
    client = docker.DockerClient(base_url=f"unix://{docker_engine.socket_path}")
    yield client
    client.close()


def drop_everywhere(engines: dict[str, NodeEngine], tag: str) -> None:
    for engine in engines.values():
        client = engine.client()
        try:
            with contextlib.suppress(docker.errors.ImageNotFound):
                client.images.remove(tag, force=True)
        finally:
            client.close()


def relays_left(sim: SimCluster) -> list[int]:
    """Pids of image relays still running on any node."""
    found = []
    for node in sim.nodes:
        for pid in node.pids():
            with contextlib.suppress(OSError):
                if RELAY_MARK in Path(f"/proc/{pid}/cmdline").read_bytes():
                    found.append(pid)
    return found


def listeners(node: SimNode) -> list[str]:
    """The TCP ports listening in the node's namespace."""
    out = subprocess.run(node.in_namespace(["ss", "-ltnH"]), capture_output=True, text=True, check=True).stdout
    return sorted(line.split()[3].rsplit(":", 1)[1] for line in out.splitlines())


def assert_nothing_left(sim: SimCluster) -> None:
    assert not relays_left(sim), "an image relay outlived the copy"
    for node in sim.nodes:
        assert listeners(node) == ["22"], f"{node.name} still listens on {listeners(node)}"


# -- copy ------------------------------------------------------------------------------------------


def test_image_copy_chains_an_image_into_three_engines(copy_lan, toml, host, busybox_image):
    sim, engines = copy_lan
    drop_everywhere(engines, busybox_image)
    result = homegpu("--config", str(toml), "image", "copy", busybox_image, "--from", "node1")
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == f"copying {busybox_image} from node1 to node2, node3, node4"
    source_id = host.images.get(busybox_image).id
    for name in TARGETS:
        assert image_id(engines[name].socket_path, busybox_image) == source_id
        assert any(line.startswith(f"{name} | received ") and line.endswith(", loading") for line in lines), lines
        assert any(line.startswith(f"{name} | loaded (") for line in lines), lines
        assert f"{name}: ok: Loaded image: {busybox_image}" in lines
    assert_nothing_left(sim)

    again = homegpu("--config", str(toml), "image", "copy", busybox_image, "--from", "node1")
    assert again.returncode == 0
    assert all(f"{name}: ok: already has {busybox_image}" in again.stdout for name in TARGETS), again.stdout


def test_image_copy_of_an_absent_image_fails_with_the_fix(toml):
    result = homegpu("--config", str(toml), "image", "copy", "homegpu-test/absent:1", "--from", "node1")
    assert result.returncode == 1
    assert ("image homegpu-test/absent:1 is not on node1: build it there first "
            "(homegpu image build --node node1)") in result.stdout


def test_image_copy_rejects_a_port_that_is_not_one(toml):
    result = homegpu("--config", str(toml), "image", "copy", "x", "--from", "node1", "--port", "70000")
    assert result.returncode != 0 and "--port 70000 is not a TCP port" in result.stderr + result.stdout
    assert "Traceback" not in result.stderr


async def test_copy_image_reports_each_target(copy_lan, tmp_path, busybox_image):
    sim, engines = copy_lan
    drop_everywhere(engines, busybox_image)
    toml = sim.write_cluster_toml(tmp_path / "cluster.toml", runtime="docker",
                                  node_overrides={"node3": {"docker_socket": "/nonexistent/d.sock"}})
    reports = []
    async with Cluster(load_cluster(toml), stream_stats=False) as cluster:
        for name in cluster.nodes:
            await cluster.node(name).wait_online(60)
        nodes = [cluster.node(name) for name in ("node2", "node3", "node4", "node1")]
        outcomes = await copy_image(busybox_image, cluster.node("node1"), nodes, reports.append)
    assert [(o.node, o.ok) for o in outcomes] == [("node2", True), ("node3", False), ("node4", True),
                                                  ("node1", True)]
    assert outcomes[1].detail.startswith("no Docker socket at /nonexistent/d.sock")
    assert outcomes[3].detail.startswith(f"already has {busybox_image}")  # the source's own engine
    loaded = [r for r in reports if r.loaded]
    assert sorted(r.target for r in loaded) == ["node2", "node4"]
    assert all(r.bytes_sent > 1_000_000 for r in loaded)  # the busybox binary alone is ~2 MB
    assert_nothing_left(sim)


@pytest.mark.parametrize("how", ["cut_link", "kill_relay"])
async def test_a_node_lost_mid_copy_fails_it_and_the_nodes_after_it(copy_lan, toml, host, how, monkeypatch):
    """node3 drops out while the image streams through it: node2 (before it) still loads the image,
    node3 and node4 (after it) fail with one line each saying why, and nothing is left running."""
    sim, engines = copy_lan
    image = ensure_random_image(host, megabytes=48, layers=2)
    drop_everywhere(engines, image)
    monkeypatch.setattr(image_chain, "PROGRESS_SECONDS", 0.1)
    monkeypatch.setattr(image_chain, "PROGRESS_BYTES", 1 << 20)
    dropped = sim.node("node3")

    def drop(progress) -> None:
        if progress.target == "node3" and progress.bytes_sent and not getattr(drop, "done", False):
            drop.done = True
            if how == "cut_link":
                dropped.cut_link()
            else:
                for pid in relays_left(sim):
                    if pid in dropped.pids():
                        with contextlib.suppress(ProcessLookupError):  # a wrapper that ended meanwhile
                            os.kill(pid, signal.SIGKILL)

    for name in TARGETS:
        sim.node(name).set_link_speed(100)  # 48 MB take ~4 s: time to drop out mid-way
    try:
        async with Cluster(load_cluster(toml), stream_stats=False) as cluster:
            for name in cluster.nodes:
                await cluster.node(name).wait_online(60)
            outcomes = await copy_image(image, cluster.node("node1"), [cluster.node(n) for n in TARGETS], drop,
                                        idle=5.0)
    finally:
        dropped.restore_link()
        for name in TARGETS:
            sim.node(name).set_link_speed(sim.mbit)
    assert getattr(drop, "done", False), "node3 never reported progress"
    by_node = {o.node: o for o in outcomes}
    assert by_node["node2"].ok, by_node["node2"]
    assert image_id(engines["node2"].socket_path, image) == host.images.get(image).id
    assert not by_node["node3"].ok and not by_node["node4"].ok
    lost = by_node["node3"].detail
    assert lost.startswith("lost during the copy" if how == "cut_link" else "the relay ended without a word"), lost
    assert by_node["node4"].detail == f"not copied: node3 before it in the chain failed: {lost}"
    assert all("\n" not in o.detail for o in outcomes)
    assert image_id(engines["node4"].socket_path, image) is None
    # the relays bound their own lives: node3's ends at its idle timeout, link or no link
    wait_for(lambda: not relays_left(sim), 30, "the relays to end")
    assert_nothing_left(sim)


def test_a_connection_without_the_secret_is_closed_unread(tmp_path):
    """The relay's listener takes only its upstream: a stranger is turned away and the relay waits on."""
    part = {"role": "target", "name": "t", "socket": str(tmp_path / "none.sock"), "idle": 5, "listen": "127.0.0.1",
            "port": 0, "secret": "ab" * 32, "upstream": "up", "accept_wait": 30, "progress_seconds": 1,
            "progress_bytes": 1 << 20}
    relay = subprocess.Popen([sys.executable, "-c", script("image_relay")], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    try:
        relay.stdin.write(json.dumps(part) + "\n" + json.dumps({"next": None}) + "\n")
        relay.stdin.flush()
        port = json.loads(relay.stdout.readline())["port"]
        with socket.create_connection(("127.0.0.1", port)) as stranger:
            stranger.sendall(b"\0" * 32 + b"not an image")
            try:
                assert stranger.recv(10) == b""  # closed on us
            except ConnectionResetError:
                pass  # closed with our bytes unread: the kernel says so with a reset
        assert json.loads(relay.stdout.readline()) == {"peer": "127.0.0.1", "event": "rejected"}
        assert relay.poll() is None  # still waiting for its upstream
        relay.stdin.close()  # the controller gives up: the relay ends at once
        assert relay.wait(timeout=5) == 3
    finally:
        relay.kill()
        relay.wait()


def test_a_source_without_its_engine_says_so_after_its_hop_and_exits_cleanly(tmp_path):
    """The source asks its engine for the export as it starts, before it knows where to send it; a
    failure is reported once the hop is known, and the relay exits with its own status: not the
    interpreter's abort (SIGABRT), which a thread blocked reading stdin caused at every exit."""
    part = {"role": "source", "name": "s", "socket": str(tmp_path / "none.sock"), "idle": 5, "image": "x:1",
            "progress_seconds": 1, "progress_bytes": 1 << 20}
    with socket.create_server(("127.0.0.1", 0)) as first_target:
        hop = {"name": "t", "host": "127.0.0.1", "port": first_target.getsockname()[1], "secret": "ab" * 32}
        relay = subprocess.Popen([sys.executable, "-c", script("image_relay")], stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, text=True)
        try:
            relay.stdin.write(json.dumps(part) + "\n" + json.dumps({"next": hop}) + "\n")
            relay.stdin.flush()  # and kept open, as the controller does
            event = json.loads(relay.stdout.readline())
            assert event["event"] == "error" and "No such file or directory" in event["error"], event
            assert relay.wait(timeout=10) == 1
        finally:
            relay.kill()
            relay.wait()


# -- build -----------------------------------------------------------------------------------------


@pytest.fixture
def node2_with_busybox(copy_lan, host, busybox_image) -> docker.DockerClient:
    """node2's engine, holding the busybox image (a build there starts FROM it and cannot pull)."""
    _, engines = copy_lan
    client = engines["node2"].client()
    try:
        client.images.get(busybox_image)
    except docker.errors.ImageNotFound:
        client.images.load(b"".join(host.images.get(busybox_image).save()))
    yield client
    client.close()


def test_image_build_on_two_nodes_in_parallel(toml, host, node2_with_busybox, busybox_image, tmp_path):
    tag = f"homegpu-test/built:{uuid.uuid4().hex[:8]}"
    dockerfile = tmp_path / "ctx" / "Dockerfile"
    dockerfile.parent.mkdir()
    (dockerfile.parent / "payload.txt").write_text("from the context\n")
    dockerfile.write_text(f"FROM {busybox_image}\nCOPY payload.txt /payload.txt\nRUN echo built > /built.txt\n")
    try:
        result = homegpu("--config", str(toml), "image", "build", "--node", "node1", "--node", "node2",
                         "--file", str(dockerfile), "--tag", tag, timeout=300)
        assert result.returncode == 0, result.stdout + result.stderr
        lines = result.stdout.splitlines()
        for name in ("node1", "node2"):
            assert any(line.startswith(f"{name} | Step 3/3 : RUN echo built") for line in lines), result.stdout
            assert any(line.startswith(f"{name}: ok: built {tag}") for line in lines), result.stdout
        for client in (host, node2_with_busybox):
            output = client.containers.run(tag, ["cat", "/payload.txt", "/built.txt"], remove=True)
            assert output == b"from the context\nbuilt\n"
    finally:
        for client in (host, node2_with_busybox):
            with contextlib.suppress(docker.errors.ImageNotFound):
                client.images.remove(tag, force=True)


def test_image_build_failure_is_reported_per_node_with_exit_1(toml, node2_with_busybox, busybox_image, tmp_path):
    dockerfile = tmp_path / "Dockerfile"
    dockerfile.write_text(f"FROM {busybox_image}\nRUN echo about to fail && false\n")
    result = homegpu("--config", str(toml), "image", "build", "--node", "node1", "--node", "node2",
                     "--file", str(dockerfile), "--tag", "homegpu-test/broken:1", timeout=300)
    assert result.returncode == 1
    lines = result.stdout.splitlines()
    for name in ("node1", "node2"):
        assert f"{name} | about to fail" in lines, result.stdout
        assert any(line.startswith(f"{name}: FAILED: ") and "returned a non-zero code: 1" in line
                   for line in lines), result.stdout
    assert "failed on node1, node2" in lines


def test_lan_engines_are_the_nodes_own(copy_lan):
    """Each node's `docker` reaches its own engine (its default socket), not this machine's."""
    sim, engines = copy_lan
    for name in TARGETS:
        node = sim.node(name)
        info = subprocess.run(sim.ssh_argv(node, "docker", "info", "--format", "{{.DockerRootDir}}"),
                              capture_output=True, text=True, timeout=30)
        assert info.stdout.strip() == str(engines[name].dir / "data"), info.stderr


@contextlib.contextmanager
def slow_engine(path: Path, delay: float, body: bytes) -> Iterator[None]:
    """A Unix socket answering one Docker API export (GET /images/NAME/get, in the engine's documented HTTP form)
    only after `delay` seconds: a real engine on a busy machine working on a big image before its first byte,
    which this machine's idle engine cannot be made to do on demand."""
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(path))
    server.listen(1)

    def answer() -> None:
        conn, _ = server.accept()
        with conn:
            conn.recv(65536)  # the request
            time.sleep(delay)
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # a relay that gave up has gone
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/x-tar\r\nContent-Length: %d\r\n\r\n%s"
                             % (len(body), body))

    thread = threading.Thread(target=answer, daemon=True)
    thread.start()
    try:
        yield
    finally:
        server.close()
        thread.join(timeout=10)


@pytest.mark.parametrize("export_wait, sent", [(6, True), (None, False)])
def test_a_source_waits_for_a_slow_engines_first_byte_as_long_as_the_image_needs(tmp_path, export_wait, sent):
    """The engine works on a big image a while before its first byte: the source waits `export_wait` for it (the
    controller sizes it by the image), then connects to the first target and streams; with only `idle` (1 s) it
    says the engine had not begun, in words, not a bare "timed out"."""
    body = os.urandom(3 << 20)
    part = {"role": "source", "name": "s", "socket": str(tmp_path / "engine.sock"), "idle": 1, "image": "x:1",
            "progress_seconds": 60, "progress_bytes": 1 << 30} | ({"export_wait": export_wait} if export_wait else {})
    with slow_engine(tmp_path / "engine.sock", 2.5, body), socket.create_server(("127.0.0.1", 0)) as target:
        hop = {"name": "t", "host": "127.0.0.1", "port": target.getsockname()[1], "secret": "ab" * 32}
        relay = subprocess.Popen([sys.executable, "-c", script("image_relay")], stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, text=True)
        try:
            relay.stdin.write(json.dumps(part) + "\n" + json.dumps({"next": hop}) + "\n")
            relay.stdin.flush()
            if sent:
                conn, _ = target.accept()
                with conn, conn.makefile("rb") as stream:
                    assert stream.read(32) == bytes.fromhex("ab" * 32)
                    received = b""
                    while size := int.from_bytes(stream.read(4), "big"):
                        received += stream.read(size)
                assert received == body
            events = [json.loads(line) for line in relay.stdout]
            assert relay.wait(timeout=10) == (0 if sent else 1)
        finally:
            relay.kill()
            relay.wait()
    if sent:
        assert events[-1] == {"event": "sent", "bytes": len(body)}, events
    else:
        assert events == [{"event": "error", "error": "the Docker engine had not begun to export x:1 after 1 s"}]

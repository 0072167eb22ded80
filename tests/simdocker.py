"""Docker for the simulated cluster: this machine's engine, and an engine of a node's own.

By default every simulated node reaches this machine's one engine at /var/run/docker.sock (the
images are built there once, tests/images.py). A test that needs engines apart, as on real machines
(copying an image between them, a node lacking an image, a job whose containers run on two
machines), gives chosen nodes an engine of their own with `own_engines(cluster, names)`:

- dockerd runs in the node's network namespace, entered with `nsenter --net` plus `unshare -m` (not
  `ip netns exec`: it mounts a fresh /sys without the cgroup v1 hierarchies and dockerd stops with
  "Devices cgroup isn't mounted"), with its own data root, exec root, pid file, socket and config
  file under the node's directory, `--bridge=none --iptables=false` (nothing of this machine's
  network is touched) and its own containerd (a system containerd's socket is hidden from it);
- its mount namespace has the node's work dir at ~/.homegpu, as the node's sshd does, so the bind
  mounts of a job's containers find the node's files where homegpu put them;
- in the node's sshd mount namespace its socket is bind-mounted over /var/run/docker.sock: the
  node's default socket, what `docker` on the node and homegpu's forwarded socket reach, with no
  change to cluster.toml. Its `--network host` containers live on the node's own address.

The engine belongs to the node: SimNode.stop() ends it with the node's other processes, start()
starts it again, close() deletes its data. own_engines() takes the engines away again at the end of
its block, also when the block failed, and the node goes back to this machine's engine.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Callable, Iterable, Iterator, NamedTuple

import tiers
from simcluster import NODE_HOME, SimCluster, SimClusterError, SimNode, _run, _stop_process

DOCKER_SOCKET = "/var/run/docker.sock"
# A system containerd answers here; dockerd would use it instead of starting its own, and that
# one's containers would run in this machine's network namespace, not the node's.
SYSTEM_CONTAINERD_DIR = "/run/containerd"


class DockerEngine(NamedTuple):
    """A Docker engine usable by the tests; stop() says this session is done with it (a dockerd that a test
    session started ends when the last session using it is done)."""

    socket_path: str
    started_by_us: bool
    stop: Callable[[], None]


def docker_ping(socket_path: str = DOCKER_SOCKET, timeout: float = 2.0) -> bool:
    """True if a Docker engine answers GET /_ping on the Unix socket (no docker CLI needed)."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            conn.settimeout(timeout)
            conn.connect(str(socket_path))
            conn.sendall(b"GET /_ping HTTP/1.0\r\nHost: docker\r\n\r\n")
            reply = conn.recv(4096)
    except OSError:
        return False
    return reply.startswith(b"HTTP/1.") and b" 200 " in reply.split(b"\r\n", 1)[0] + b" "


def _dockerd() -> str:
    # root's PATH normally has /usr/sbin, but pytest may run with a trimmed one
    found = shutil.which("dockerd", path=os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin"]))
    if found is None:
        raise SimClusterError("no Docker engine: dockerd is not installed; run: apt-get install -y docker.io")
    return found


# Test sessions side by side (pytest-xdist's workers) share one engine: each holds USERS_LOCK shared while it
# uses it, the one that starts dockerd leaves its pid in PID_FILE, and whichever session leaves last stops it.
USERS_LOCK = "/var/lock/homegpu-test-dockerd.users"
START_LOCK = "/var/lock/homegpu-test-dockerd.start"  # held while a session looks for an engine or starts one
PID_FILE = Path("/run/homegpu-test-dockerd.pid")


@contextlib.contextmanager
def _locked(path: str) -> Iterator[None]:
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def ensure_docker(timeout: float = 60.0, socket_path: str = DOCKER_SOCKET) -> DockerEngine:
    """Use the running Docker engine, or start dockerd and wait for it; stop() ends a dockerd a test
    session started once no other session uses it.

    Raises SimClusterError if dockerd is not installed or does not come up within `timeout`.
    """
    tiers.need("docker")
    users = open(USERS_LOCK, "a")
    fcntl.flock(users, fcntl.LOCK_SH)
    try:
        with _locked(START_LOCK):
            started = not docker_ping(socket_path) and _start_dockerd(timeout, socket_path)
    except BaseException:
        users.close()
        raise
    return DockerEngine(socket_path, started, lambda: _leave(users))


def _start_dockerd(timeout: float, socket_path: str) -> bool:
    """Start dockerd and wait until it answers (True), or find that another one does (False)."""
    dockerd = _dockerd()
    log_dir = Path(tempfile.mkdtemp(prefix="homegpu-dockerd-"))
    log_path = log_dir / "dockerd.log"
    with open(log_path, "ab") as log:
        # setsid -f: dockerd is no child of this session, which may end first (another one stops it).
        subprocess.run(["setsid", "-f", "sh", "-c", 'echo $$ > "$1"; exec "$2"', "dockerd", str(PID_FILE), dockerd],
                       stdin=subprocess.DEVNULL, stdout=log, stderr=log, check=True)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if docker_ping(socket_path):
            if _dockerd_pid() is None:  # ours exited but an engine answers: someone else's, left running
                PID_FILE.unlink(missing_ok=True)
                shutil.rmtree(log_dir, ignore_errors=True)
                return False
            return True
        if _dockerd_pid() is None and PID_FILE.exists() and "pid file found" not in log_path.read_text(errors="replace"):
            break  # ours failed, and not because another dockerd is starting up
        time.sleep(0.2)
    tail = "\n".join(log_path.read_text(errors="replace").splitlines()[-20:])
    _stop_dockerd()
    shutil.rmtree(log_dir, ignore_errors=True)
    raise SimClusterError(f"dockerd did not answer on {socket_path} within {timeout} s:\n{tail}")


def _dockerd_pid() -> int | None:
    """The pid of the dockerd a test session started, None when there is none or it has exited."""
    try:
        pid = int(PID_FILE.read_text())
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, ValueError, IndexError):
        return None
    return None if state in "ZX" else pid


def _stop_dockerd(grace: float = 30.0) -> None:
    pid = _dockerd_pid()
    if pid is not None:
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while _dockerd_pid() is not None and time.monotonic() < deadline:
            time.sleep(0.1)
        if _dockerd_pid() is not None:
            os.kill(pid, signal.SIGKILL)
    PID_FILE.unlink(missing_ok=True)


def _leave(users) -> None:
    """This session is done with the engine: the last one to leave stops a dockerd a session started."""
    with _locked(START_LOCK):
        fcntl.flock(users, fcntl.LOCK_UN)
        try:
            fcntl.flock(users, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return  # another session still uses it
        finally:
            users.close()
        _stop_dockerd()


# -- an engine of a node's own ---------------------------------------------------------------------


class NodeEngine:
    """One node's dockerd: its files under the node's directory, its processes in the node's namespace.

    SimNode calls ensure_running() before it starts sshd and bind_argv() for sshd's mount
    namespace; its stop() ends the engine with every other process of the node.
    """

    def __init__(self, node: SimNode) -> None:
        self.node = node
        self.dir = node.work_dir.parent / "docker"
        self.socket_path = str(self.dir / "docker.sock")
        self.log_path = self.dir / "dockerd.log"
        self._proc: subprocess.Popen | None = None

    @property
    def is_running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def ensure_running(self, timeout: float = 60.0) -> None:
        """Start dockerd in the node's namespace unless it runs; return once it answers /_ping."""
        if self.is_running and docker_ping(self.socket_path):
            return
        if not os.path.exists(DOCKER_SOCKET):
            # the bind mount needs something to cover; this machine's engine makes the file
            raise SimClusterError(f"{DOCKER_SOCKET} is missing: start this machine's Docker engine first")
        self.dir.mkdir(parents=True, exist_ok=True)
        config = self.dir / "daemon.json"
        config.write_text("{}\n")  # not this machine's /etc/docker/daemon.json (its data root, …)
        hide = (f"if [ -d {SYSTEM_CONTAINERD_DIR} ]; then mount -t tmpfs tmpfs {SYSTEM_CONTAINERD_DIR}; fi"
                if os.path.isdir(SYSTEM_CONTAINERD_DIR) else "true")
        home = shlex.join(["mount", "--bind", str(self.node.work_dir), os.path.join(NODE_HOME, ".homegpu")])
        dockerd = shlex.join([
            _dockerd(), "--config-file", str(config), "--data-root", str(self.dir / "data"),
            "--exec-root", str(self.dir / "exec"), "--pidfile", str(self.dir / "docker.pid"),
            "-H", f"unix://{self.socket_path}", "--bridge=none", "--iptables=false", "--ip-masq=false"])
        with open(self.log_path, "ab") as log:
            self._proc = subprocess.Popen(
                ["nsenter", f"--net=/run/netns/{self.node.namespace}", "unshare", "-m", "--propagation",
                 "private", "sh", "-c", f"{hide} && {home} && exec {dockerd}"],
                stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True)
        deadline = time.monotonic() + timeout
        while not docker_ping(self.socket_path):
            if self._proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                tail = "\n".join(self.log_path.read_text(errors="replace").splitlines()[-15:])
                raise SimClusterError(f"{self.node.name}: dockerd did not answer on {self.socket_path}:\n{tail}")
            time.sleep(0.1)

    def bind_argv(self) -> list[str]:
        """The mount that makes this engine the node's default socket (run in sshd's namespace)."""
        return ["mount", "--bind", self.socket_path, DOCKER_SOCKET]

    def stop(self, grace: float = 20.0) -> None:
        """End dockerd (it stops its containerd and containers); SIGKILL after `grace` s."""
        if self._proc is not None:
            _stop_process(self._proc, grace)

    def remove(self) -> None:
        """Stop the engine and delete its data root (its mounts died with its mount namespace)."""
        self.stop()
        _run(["rm", "-rf", "--one-file-system", str(self.dir)], timeout=300)

    def client(self):
        """A docker-py client of this engine (the caller closes it)."""
        import docker  # only the tests that use engines need docker-py

        return docker.DockerClient(base_url=f"unix://{self.socket_path}")


def give_engine(node: SimNode) -> NodeEngine:
    """Start an engine of the node's own and make it the node's default socket, sshd running or not."""
    engine = NodeEngine(node)
    engine.ensure_running()
    node.engine = engine
    if node.is_running:
        _run(["nsenter", "-t", str(node.pid), "-m", *engine.bind_argv()])
    return engine


def take_engine(node: SimNode) -> None:
    """Undo give_engine(): the node reaches this machine's engine again; the engine's data is deleted."""
    engine, node.engine = node.engine, None
    if engine is None:
        return
    if node.is_running:
        subprocess.run(["nsenter", "-t", str(node.pid), "-m", "umount", DOCKER_SOCKET], capture_output=True)
    engine.remove()


@contextlib.contextmanager
def own_engines(cluster: SimCluster, names: Iterable[str]) -> Iterator[dict[str, NodeEngine]]:
    """Engines of their own for the named nodes during the block; {name: engine}."""
    engines: dict[str, NodeEngine] = {}
    try:
        for name in names:
            engines[name] = give_engine(cluster.node(name))
        yield engines
    finally:
        for name in engines:
            take_engine(cluster.node(name))


def image_id(socket_path: str, image: str) -> str | None:
    """The id of `image` in the engine at `socket_path`, None when it is not there (stdlib only)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.settimeout(30)
        conn.connect(str(socket_path))
        conn.sendall(f"GET /images/{image}/json HTTP/1.0\r\nHost: docker\r\n\r\n".encode())
        reply = b""
        while chunk := conn.recv(65536):
            reply += chunk
    head, _, body = reply.partition(b"\r\n\r\n")
    if b" 200 " not in head.split(b"\r\n", 1)[0] + b" ":
        return None
    return json.loads(body)["Id"]

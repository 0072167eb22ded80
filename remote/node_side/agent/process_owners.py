"""Who owns a process on this node: a homegpu worker, another container, or some user's process.

STDLIB ONLY, Python 3.8+: the stats agent runs it on the node (``nodes/agent_bundle.py`` ships its
source with the agent's other modules, or the agent imports it from its own folder), and it imports
nothing from homegpu. The controller imports it too, for the marker names it gives workers.

A GPU process's owner is looked up once, when its pid first shows in the process list (every
``--apps-interval`` seconds, not every sample), from what the node already has:

- ``/proc/PID/status``: the real uid, named through the password database;
- ``/proc/PID/environ``: homegpu's worker markers (``HOMEGPU_RUN_ID``, ``HOMEGPU_JOB``,
  ``HOMEGPU_WORKER_INDEX``, and ``HOMEGPU_GPU_MEMORY`` where its job has a budget), which every
  worker, process or container, gets from its launch and passes on to its children; readable for
  the agent's own user's processes (the workers), not for other users';
- ``/proc/PID/cgroup``: the container the process runs in, if any; then, for a container without
  markers, its labels (homegpu's worker containers carry ``homegpu.run``/``homegpu.index`` and
  ``homegpu.gpu_memory``) and name from the node's Docker socket, one small request per container,
  only where the socket is there and ours to use.

An owner is a JSON-ready dict: ``{"kind": "worker"|"container"|"process"|"unknown", "user", "uid",
"run_id", "job", "index", "gpu_memory", "container", "container_name"}`` with only the keys that are known
(``gpu_memory``: a worker's budget on its GPU in bytes, as its job's ``gpu_memory`` key set it).
"""

from __future__ import annotations

import json
import os
import re
import socket

MARKER_RUN = "HOMEGPU_RUN_ID"
MARKER_JOB = "HOMEGPU_JOB"
MARKER_INDEX = "HOMEGPU_WORKER_INDEX"
MARKER_BUDGET = "HOMEGPU_GPU_MEMORY"  # trainer/gpu_budget.py's BUDGET_ENV (the agent imports nothing of homegpu)
MARKERS = (MARKER_RUN, MARKER_JOB, MARKER_INDEX, MARKER_BUDGET)
LABEL_RUN = "homegpu.run"
LABEL_JOB = "homegpu.job"
LABEL_INDEX = "homegpu.index"
LABEL_BUDGET = "homegpu.gpu_memory"
DOCKER_SOCKET = "/var/run/docker.sock"
DOCKER_TIMEOUT_S = 0.5  # a local socket answers in milliseconds; a hung daemon must not stall a sample
ENVIRON_MAX_BYTES = 1 << 20

# docker (systemd and cgroupfs drivers), podman, containerd and CRI-O name the container in the path.
_CONTAINER_IN_CGROUP = re.compile(r"(?:docker|libpod|cri-containerd|crio)[-/]([0-9a-f]{64})")


# --- parsers (pure) ------------------------------------------------------------------------------

def parse_status_uid(text):
    """The real uid from /proc/PID/status ("Uid:\\treal effective saved fs"); None if absent."""
    for line in text.splitlines():
        if line.startswith("Uid:"):
            fields = line.split()
            return int(fields[1]) if len(fields) > 1 and fields[1].isdigit() else None
    return None


def parse_markers(environ):
    """homegpu's worker markers from /proc/PID/environ's bytes (NUL-separated KEY=VALUE)."""
    found = {}
    for entry in environ.split(b"\0"):
        key, sep, value = entry.partition(b"=")
        name = key.decode("ascii", "replace")
        if sep and name in MARKERS:
            found[name] = value.decode("utf-8", "replace")
    return found


def parse_cgroup_container(text):
    """The 64-hex id of the container a process runs in, from /proc/PID/cgroup; None on the host."""
    match = _CONTAINER_IN_CGROUP.search(text)
    return match.group(1) if match else None


def _index(value):
    text = str(value).strip() if value is not None else ""
    return int(text) if text.isdigit() else None


def _budget(owner, value):
    """A worker's gpu_memory (bytes) into its owner, where its job gave one."""
    size = _index(value)
    if size:
        owner["gpu_memory"] = size


def classify(uid=None, user=None, markers=None, container=None, labels=None, container_name=None):
    """The owner dict from what was read (pure; every argument may be None).

    Markers in the environment make a worker, else homegpu labels on its container do; any other
    process in a container is that container's; the rest are their user's.
    """
    markers, labels = markers or {}, labels or {}
    owner = {"kind": "process"}
    if uid is not None:
        owner["uid"] = uid
        owner["user"] = user if user else str(uid)
    if markers.get(MARKER_RUN):
        owner.update(kind="worker", run_id=markers[MARKER_RUN], job=markers.get(MARKER_JOB, ""),
                     index=_index(markers.get(MARKER_INDEX)))
        _budget(owner, markers.get(MARKER_BUDGET))
    elif labels.get(LABEL_RUN):
        owner.update(kind="worker", run_id=labels[LABEL_RUN], job=labels.get(LABEL_JOB, ""),
                     index=_index(labels.get(LABEL_INDEX)))
        _budget(owner, labels.get(LABEL_BUDGET))
    elif container:
        owner["kind"] = "container"
    if container:
        owner["container"] = container[:12]
        if container_name:
            owner["container_name"] = container_name
    return owner


def parse_container_reply(raw):
    """(name, labels) from a raw HTTP reply to Docker's ``GET /containers/ID/json``; None if not 200."""
    head, _, body = raw.partition(b"\r\n\r\n")
    status = head.split(b"\r\n", 1)[0].split()
    if len(status) < 2 or status[1] != b"200":
        return None
    data = json.loads(body.decode("utf-8", "replace"))
    labels = (data.get("Config") or {}).get("Labels") or {}
    return str(data.get("Name") or "").lstrip("/"), dict(labels)


# --- reading the node ----------------------------------------------------------------------------

def _read(path, limit=65536):
    with open(path, "rb") as handle:
        return handle.read(limit)


def user_name(uid):
    """The login name of ``uid``, or None where the password database has none."""
    try:
        import pwd

        return pwd.getpwuid(uid).pw_name
    except (ImportError, KeyError):
        return None


def docker_container(container, socket_path=DOCKER_SOCKET, timeout=DOCKER_TIMEOUT_S):
    """(name, labels) of a container from the Docker engine's socket; None when it cannot say.

    HTTP/1.0 so the engine closes the connection after its reply: no chunking, no keep-alive.
    """
    if not os.access(socket_path, os.R_OK | os.W_OK):
        return None
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.settimeout(timeout)
    try:
        conn.connect(socket_path)
        conn.sendall(b"GET /containers/%s/json HTTP/1.0\r\nHost: docker\r\n\r\n" % container.encode("ascii"))
        chunks = []
        while True:
            chunk = conn.recv(65536)
            if not chunk:
                break
            chunks.append(chunk)
        return parse_container_reply(b"".join(chunks))
    except (OSError, ValueError):
        return None
    finally:
        conn.close()


class ProcessOwners:
    """Owners of the node's GPU processes, each looked up once and kept while its pid is listed.

    Args:
        proc_root: where /proc is (tests point it elsewhere).
        docker_socket: the Docker engine's socket; labels are asked for only where it is usable.
    """

    def __init__(self, proc_root="/proc", docker_socket=DOCKER_SOCKET):
        self.proc_root = proc_root
        self.docker_socket = docker_socket
        self.by_pid = {}
        self.users = {}
        self.containers = {}  # id -> (name, labels) or None, asked for once per container

    def annotate(self, process_lists):
        """Give every process dict in ``process_lists`` its ``owner``; forget pids no longer listed
        (a pid that ends is free for reuse, so it is looked up again if it comes back)."""
        seen = set()
        for processes in process_lists:
            for process in processes:
                pid = process.get("pid")
                if isinstance(pid, int):
                    seen.add(pid)
                    if pid not in self.by_pid:
                        self.by_pid[pid] = self.owner(pid)
                    process["owner"] = self.by_pid[pid]
        for pid in set(self.by_pid) - seen:
            del self.by_pid[pid]

    def owner(self, pid):
        """Look up one pid now; ``{"kind": "unknown"}`` where /proc has no such process (it ended,
        or it lives in another pid namespace than the agent)."""
        base = os.path.join(self.proc_root, str(pid))
        try:
            uid = parse_status_uid(_read(os.path.join(base, "status")).decode("ascii", "replace"))
        except OSError:
            return {"kind": "unknown"}
        markers = self._optional(lambda: parse_markers(_read(os.path.join(base, "environ"), ENVIRON_MAX_BYTES)))
        container = self._optional(lambda: parse_cgroup_container(
            _read(os.path.join(base, "cgroup")).decode("ascii", "replace")))
        name, labels = None, None
        if container and not (markers or {}).get(MARKER_RUN):
            name, labels = self._container(container) or (None, None)
        return classify(uid, self._user(uid), markers, container, labels, name)

    @staticmethod
    def _optional(read):
        try:
            return read()
        except OSError:  # EACCES: another user's environ; the process may also have just ended
            return None

    def _user(self, uid):
        if uid is None:
            return None
        if uid not in self.users:
            self.users[uid] = user_name(uid)
        return self.users[uid]

    def _container(self, container):
        if container not in self.containers:
            self.containers[container] = docker_container(container, self.docker_socket)
        return self.containers[container]

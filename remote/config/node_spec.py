"""`[[nodes]]` tables: the machines of the cluster, as frozen NodeSpecs.

Validated with checks.py's Validator, like the rest of cluster.toml.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

from homegpu.remote.config.checks import NAME_RE, Validator, show
from homegpu.remote.config.key_tables import NODES
from homegpu.remote.config.node_sleep_wake import NodeSleepWake, check_wake_via, parse_sleep_wake

LOCAL_HOST = "local"
RUNTIMES = ("docker", "process")

MAX_WATTS = 10_000.0  # a machine's draw besides its GPUs: a home or lab box, not a rack


@dataclass(frozen=True)
class NodeSpec:
    """One machine of the cluster."""

    name: str
    host: str
    port: int | None = None
    user: str | None = None
    identity_file: str | None = None
    address: str = ""
    runtime: str = "docker"
    python: str = "python3"
    tags: tuple[str, ...] = ()
    work_dir: str = ""
    docker_socket: str = "/var/run/docker.sock"
    idle_watts: float | None = None  # the machine's draw besides its GPUs, idle and with every CPU busy:
    busy_watts: float | None = None  # where RAPL cannot be read, the rest of the machine is estimated from them
    sleep_wake: NodeSleepWake = NodeSleepWake()  # how it is woken and put to sleep (node_sleep_wake.py)

    def host_watts(self, cpu_percent: float) -> float | None:
        """The machine's draw besides its GPUs at `cpu_percent` busy, by idle_watts and busy_watts (linear
        between them, as the estimates of codecarbon and Scaphandre's are); None without idle_watts."""
        if self.idle_watts is None:
            return None
        busy = self.idle_watts if self.busy_watts is None else self.busy_watts
        return self.idle_watts + (busy - self.idle_watts) * min(max(cpu_percent, 0.0), 100.0) / 100

    @classmethod
    def this_machine(cls, name: str = "local") -> NodeSpec:
        """This machine as a node: workers run as processes of the interpreter homegpu itself runs
        under, which has the framework extras it was installed with (`python3` on PATH may have none)."""
        return cls(name=name, host=LOCAL_HOST, runtime="process", python=sys.executable)

    @property
    def is_local(self) -> bool:
        return self.host == LOCAL_HOST

    @property
    def cluster_address(self) -> str:
        """Where TensorFlow and iperf3 traffic goes: `address`, else the host."""
        if self.address:
            return self.address
        return "127.0.0.1" if self.is_local else self.host


def parse_nodes(v: Validator, data: dict) -> tuple[NodeSpec, ...]:
    """The `[[nodes]]` array of the parsed file, validated. Raises ConfigError."""
    raw = data.get("nodes")
    if raw is None:
        raise v.fail(("nodes",), "no nodes are defined",
                     'add a [[nodes]] table with name and host (host = "local" for this machine)')
    if not isinstance(raw, list) or not all(isinstance(item, dict) for item in raw):
        raise v.fail(("nodes",), "must be an array of tables", "write each node as a [[nodes]] table")
    if not raw:
        raise v.fail(("nodes",), "no nodes are defined", "add at least one [[nodes]] table")
    nodes = tuple(_parse_node(v, item, index) for index, item in enumerate(raw))
    _check_unique(v, nodes)
    check_wake_via(v, [node.name for node in nodes], [node.sleep_wake for node in nodes])
    return nodes


def _parse_node(v: Validator, item: dict, index: int) -> NodeSpec:
    path = ("nodes", index)
    v.unknown_keys(item, path, NODES.names, NODES.hint)
    get = v.getter(item, path)
    name = get("name", str, None, v.check_name)
    if name is None:
        raise v.fail(path, "node has no name", 'add name = "..." (letters, digits, - _ .)')
    host = get("host", str, None, v.check_host)
    if host is None:
        raise v.fail(path, f"node {name!r} has no host",
                     'add host = "ADDRESS", an ~/.ssh/config alias, or "local" for this machine')
    return NodeSpec(
        name=name,
        host=host,
        port=get("port", int, None, v.check_port),
        user=get("user", str, None, v.check_name_like),
        identity_file=get("identity_file", str, None, v.check_path),
        address=get("address", str, "", v.check_host),
        runtime=get("runtime", str, "docker", v.choice(
            RUNTIMES, 'use "docker" (containers) or "process" (plain python on the node)', "runtime")),
        python=get("python", str, "python3", v.check_path),
        tags=tuple(get("tags", list, [], _check_tags(v))),
        work_dir=get("work_dir", str, "", v.check_path),
        docker_socket=get("docker_socket", str, NodeSpec.docker_socket, v.check_path),
        **_host_watts(v, item, path),
        sleep_wake=parse_sleep_wake(v, item, path, name),
    )


def _host_watts(v: Validator, item: dict, path: tuple) -> dict[str, float | None]:
    """idle_watts and busy_watts, validated: busy needs idle, and is not below it."""
    limits = {key: (0.0, MAX_WATTS, " W") for key in ("idle_watts", "busy_watts")}
    get = v.getter(item, path, limits)
    idle, busy = get("idle_watts", float, None), get("busy_watts", float, None)
    if busy is not None and idle is None:
        raise v.fail(path + ("busy_watts",), "busy_watts without idle_watts",
                     "set idle_watts too: what the machine draws, GPUs aside, doing nothing")
    if busy is not None and busy < idle:
        raise v.fail(path + ("busy_watts",), f"busy_watts {busy:g} is below idle_watts {idle:g}",
                     "give the draw with every CPU busy, at least the idle one")
    return {"idle_watts": idle, "busy_watts": busy}


def _check_tags(v: Validator):
    def check(path: tuple, value: list) -> None:
        for tag in value:
            if not isinstance(tag, str) or not NAME_RE.fullmatch(tag):
                raise v.fail(path, f"invalid tag {show(tag)}", 'use short words such as tags = ["gpu", "rtx4090"]')
    return check


def _check_unique(v: Validator, nodes: tuple[NodeSpec, ...]) -> None:
    """Each node its own name, and each remote node its own host:port."""
    names: dict[str, int] = {}
    endpoints: dict[tuple[str, int], int] = {}
    for index, node in enumerate(nodes):
        if node.name in names:
            raise v.fail(("nodes", index, "name"), f"duplicate node name {node.name!r}",
                         f"give each node its own name (also used by node #{names[node.name] + 1})")
        names[node.name] = index
        if node.is_local:
            continue
        endpoint = (node.host, node.port or 22)
        if endpoint in endpoints:
            raise v.fail(("nodes", index, "host"), f"duplicate address:port {node.host}:{node.port or 22}",
                         f"node {nodes[endpoints[endpoint]].name!r} already uses it; "
                         "give each node its own host or port")
        endpoints[endpoint] = index

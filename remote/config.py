"""cluster.toml: read, validate and turn into frozen, typed specs.

Every mistake becomes one :class:`ConfigError` whose message names the file, the line, the key and
what to do, so the CLI can print it on one line and exit 2 without a traceback.
"""

from __future__ import annotations

import re
import sys
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, Callable, Mapping

from homegpu.remote.job_config import JobSpec, parse_job
from homegpu.remote.toml_lines import LineIndex

DEFAULT_CONFIG_NAME = "cluster.toml"
EMBEDDED_DEFAULT = "<embedded default>"
LOCAL_HOST = "local"
RUNTIMES = ("docker", "process")

# Hosts and paths end up in argv lists sent to remote shells; shlex.join quotes them, and refusing
# anything unusual up front means a typo can never become an option or a second command.
_HOST_RE = re.compile(r"^[A-Za-z0-9_.:%\[\]-]+$")
_PATH_RE = re.compile(r"^[A-Za-z0-9_./~+@=,:-]+$")
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
_SHELL_META = set(";&|`$<>()\\\"' \t\n*?!{}#")


class ConfigError(Exception):
    """A mistake in cluster.toml, located and explained in one line."""

    def __init__(self, file: str, line: int | None, key: str, problem: str, hint: str) -> None:
        self.file, self.line, self.key, self.problem, self.hint = file, line, key, problem, hint
        where = f"{file}:{line}" if line else file
        super().__init__(f"{where}: {key}: {problem}; {hint}")


@dataclass(frozen=True)
class SshDefaults:
    """SSH settings every node inherits unless it sets its own."""

    user: str | None = None
    identity_file: str | None = None
    known_hosts: str = "~/.ssh/known_hosts"
    connect_timeout: float = 10.0
    keepalive_interval: float = 5.0
    keepalive_count_max: int = 3


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

    @property
    def is_local(self) -> bool:
        return self.host == LOCAL_HOST

    @property
    def cluster_address(self) -> str:
        """Where TensorFlow and iperf3 traffic goes: `address`, else the host."""
        if self.address:
            return self.address
        return "127.0.0.1" if self.is_local else self.host


@dataclass(frozen=True)
class ClusterSpec:
    """The whole cluster.toml, validated."""

    name: str
    nodes: tuple[NodeSpec, ...]
    ssh: SshDefaults = field(default_factory=SshDefaults)
    stats_interval: float = 1.0
    work_dir: str = "~/.homegpu"
    jobs: Mapping[str, JobSpec] = field(default_factory=lambda: MappingProxyType({}))
    source: str = EMBEDDED_DEFAULT

    def work_dir_of(self, node: NodeSpec) -> str:
        """The node's own work dir, else the cluster's."""
        return node.work_dir or self.work_dir

    def node(self, name: str) -> NodeSpec:
        for node in self.nodes:
            if node.name == name:
                return node
        raise KeyError(name)


DEMO_JOB = "demo"


def embedded_default() -> ClusterSpec:
    """This machine as the only node, run through local processes: needs no SSH and no Docker.

    Its `demo` job runs two workers here, so MultiWorkerMirroredStrategy really synchronises.
    """
    return ClusterSpec(
        name="this-machine",
        # this very interpreter: it has homegpu (and TensorFlow, with the [tensorflow] extra)
        nodes=(NodeSpec(name="local", host=LOCAL_HOST, runtime="process", python=sys.executable),),
        jobs=MappingProxyType({DEMO_JOB: JobSpec(name=DEMO_JOB, workers_per_node=2, epochs=2)}),
    )


def find_config(explicit: str | None, cwd: Path | None = None) -> Path | None:
    """The file to use: `--config`, else ./cluster.toml, else None (the embedded default)."""
    if explicit:
        return Path(explicit)
    candidate = (cwd or Path.cwd()) / DEFAULT_CONFIG_NAME
    return candidate if candidate.is_file() else None


def load_cluster(path: str | Path | None) -> ClusterSpec:
    """Read and validate a cluster file; None gives the embedded default.

    Raises:
        ConfigError: for any mistake, a missing or unreadable file included.
    """
    if path is None:
        return embedded_default()
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(str(path), None, "file", "not found",
                          "check the path, or run `homegpu init` to write one") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(str(path), None, "file", f"cannot be read ({exc})",
                          "make it a readable UTF-8 text file") from None
    return parse_cluster(text, str(path))


def parse_cluster(text: str, file: str = DEFAULT_CONFIG_NAME) -> ClusterSpec:
    """Validate TOML text into a ClusterSpec. Raises ConfigError."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        line = _decode_error_line(str(exc))
        problem = re.sub(r"\s*\(at (line \d+, column \d+|end of document)\)", "", str(exc))
        raise ConfigError(file, line, "syntax", f"invalid TOML: {problem}",
                          "fix the TOML syntax (quotes around strings, one [table] header per table)") from None
    return _Validator(file, LineIndex(text)).cluster(data)


def _decode_error_line(message: str) -> int | None:
    match = re.search(r"at line (\d+)", message)
    return int(match.group(1)) if match else None


_CLUSTER_KEYS = {
    "name", "user", "identity_file", "known_hosts", "connect_timeout", "keepalive_interval",
    "keepalive_count_max", "stats_interval", "work_dir",
}
_NODE_KEYS = {
    "name", "host", "port", "user", "identity_file", "address", "runtime", "python", "tags", "work_dir",
    "docker_socket",
}
_TOP_KEYS = {"cluster", "nodes", "jobs"}


class _Validator:
    """Walks the parsed TOML once, raising the first mistake with its location."""

    def __init__(self, file: str, lines: LineIndex) -> None:
        self.file = file
        self.lines = lines

    def fail(self, path: tuple, problem: str, hint: str) -> ConfigError:
        return ConfigError(self.file, self.lines.find(path), _display(path), problem, hint)

    def cluster(self, data: dict) -> ClusterSpec:
        self.unknown_keys(data, (), _TOP_KEYS, "use only [cluster], [[nodes]] and [jobs.NAME] tables")
        table = self.table(data, ("cluster",))
        self.unknown_keys(table, ("cluster",), _CLUSTER_KEYS, "see the cluster.toml reference in README.md")
        get = self.getter(table, ("cluster",))
        ssh = SshDefaults(
            user=get("user", str, None, self.check_name_like),
            identity_file=get("identity_file", str, None, self.check_path),
            known_hosts=get("known_hosts", str, SshDefaults.known_hosts, self.check_path),
            connect_timeout=get("connect_timeout", float, SshDefaults.connect_timeout, self.check_positive),
            keepalive_interval=get("keepalive_interval", float, SshDefaults.keepalive_interval,
                                   self.check_positive),
            keepalive_count_max=get("keepalive_count_max", int, SshDefaults.keepalive_count_max,
                                    self.check_positive),
        )
        nodes = self.nodes(data)
        return ClusterSpec(
            name=get("name", str, "homegpu", self.check_name),
            nodes=nodes,
            ssh=ssh,
            stats_interval=get("stats_interval", float, 1.0, self.check_positive),
            work_dir=get("work_dir", str, "~/.homegpu", self.check_path),
            jobs=self.jobs(data, tuple(node.name for node in nodes)),
            source=self.file,
        )

    def nodes(self, data: dict) -> tuple[NodeSpec, ...]:
        raw = data.get("nodes")
        if raw is None:
            raise self.fail(("nodes",), "no nodes are defined",
                            'add a [[nodes]] table with name and host (host = "local" for this machine)')
        if not isinstance(raw, list) or not all(isinstance(item, dict) for item in raw):
            raise self.fail(("nodes",), "must be an array of tables", "write each node as a [[nodes]] table")
        if not raw:
            raise self.fail(("nodes",), "no nodes are defined", "add at least one [[nodes]] table")
        nodes = tuple(self.node(item, index) for index, item in enumerate(raw))
        self.check_unique(nodes)
        return nodes

    def node(self, item: dict, index: int) -> NodeSpec:
        path = ("nodes", index)
        self.unknown_keys(item, path, _NODE_KEYS, "see the [[nodes]] reference in README.md")
        get = self.getter(item, path)
        name = get("name", str, None, self.check_name)
        if name is None:
            raise self.fail(path, "node has no name", 'add name = "..." (letters, digits, - _ .)')
        host = get("host", str, None, self.check_host)
        if host is None:
            raise self.fail(path, f"node {name!r} has no host",
                            'add host = "ADDRESS", an ~/.ssh/config alias, or "local" for this machine')
        runtime = get("runtime", str, "docker", self.check_runtime)
        return NodeSpec(
            name=name,
            host=host,
            port=get("port", int, None, self.check_port),
            user=get("user", str, None, self.check_name_like),
            identity_file=get("identity_file", str, None, self.check_path),
            address=get("address", str, "", self.check_host),
            runtime=runtime,
            python=get("python", str, "python3", self.check_path),
            tags=tuple(get("tags", list, [], self.check_tags)),
            work_dir=get("work_dir", str, "", self.check_path),
            docker_socket=get("docker_socket", str, NodeSpec.docker_socket, self.check_path),
        )

    def check_unique(self, nodes: tuple[NodeSpec, ...]) -> None:
        names: dict[str, int] = {}
        endpoints: dict[tuple[str, int], int] = {}
        for index, node in enumerate(nodes):
            if node.name in names:
                raise self.fail(("nodes", index, "name"), f"duplicate node name {node.name!r}",
                                f"give each node its own name (also used by node #{names[node.name] + 1})")
            names[node.name] = index
            if node.is_local:
                continue
            endpoint = (node.host, node.port or 22)
            if endpoint in endpoints:
                raise self.fail(("nodes", index, "host"),
                                f"duplicate address:port {node.host}:{node.port or 22}",
                                f"node {nodes[endpoints[endpoint]].name!r} already uses it; "
                                "give each node its own host or port")
            endpoints[endpoint] = index

    def jobs(self, data: dict, node_names: tuple[str, ...]) -> Mapping[str, JobSpec]:
        raw = self.table(data, ("jobs",))
        jobs = {}
        for name, table in raw.items():
            if not isinstance(table, dict):
                raise self.fail(("jobs", name), "must be a table", f"write it as a [jobs.{name}] table")
            if not _NAME_RE.match(name):
                raise self.fail(("jobs", name), f"invalid job name {name!r}", "use letters, digits, - _ .")
            jobs[name] = parse_job(self, name, table, node_names)
        return MappingProxyType(jobs)

    # -- helpers --------------------------------------------------------------------------------

    def table(self, data: dict, path: tuple) -> dict:
        value = data.get(path[-1], {})
        if not isinstance(value, dict):
            raise self.fail(path, f"must be a table, not {_type_name(value)}",
                            f"write it as a {_display(path)} table")
        return value

    def unknown_keys(self, table: dict, path: tuple, allowed: set[str], hint: str) -> None:
        for key in table:
            if key not in allowed:
                close = _closest(key, allowed)
                suggestion = f"did you mean {close!r}? " if close else ""
                raise self.fail(path + (key,), f"unknown key {key!r}", f"{suggestion}{hint}")

    def getter(self, table: dict, path: tuple) -> Callable[..., Any]:
        def get(key: str, kind: type, default: Any, check: Callable[[tuple, Any], None]) -> Any:
            if key not in table:
                return default
            value = table[key]
            value = self.check_type(path + (key,), value, kind)
            check(path + (key,), value)
            return value

        return get

    def check_type(self, path: tuple, value: Any, kind: type) -> Any:
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, kind) and not (kind is int and isinstance(value, bool)):
            return value
        example = {str: '"text"', int: "22", float: "1.5", list: '["a", "b"]', dict: '{ KEY = "value" }'}[kind]
        raise self.fail(path, f"expected {_KIND_NAMES[kind]}, got {_type_name(value)} {value!r}",
                        f"write it like {path[-1]} = {example}")

    def check_positive(self, path: tuple, value: float) -> None:
        if value <= 0:
            raise self.fail(path, f"must be greater than 0, got {value}", "use a positive number")

    def check_port(self, path: tuple, value: int) -> None:
        if not 1 <= value <= 65535:
            raise self.fail(path, f"port {value} is out of range", "use a port between 1 and 65535")

    def check_runtime(self, path: tuple, value: str) -> None:
        if value not in RUNTIMES:
            raise self.fail(path, f"unknown runtime {value!r}",
                            'use "docker" (containers) or "process" (plain python on the node)')

    def check_name(self, path: tuple, value: str) -> None:
        if not _NAME_RE.match(value):
            raise self.fail(path, f"invalid name {value!r}",
                            "use letters, digits, - _ and . (starting with a letter or digit)")

    def check_name_like(self, path: tuple, value: str) -> None:
        self.check_safe(path, value, "a user name")
        if not _NAME_RE.match(value):
            raise self.fail(path, f"invalid user name {value!r}", "use a plain login name such as alice")

    def check_host(self, path: tuple, value: str) -> None:
        self.check_safe(path, value, "a host name")
        if not value or not _HOST_RE.match(value):
            raise self.fail(path, f"invalid host {value!r}",
                            "use a host name, an IP address or an ~/.ssh/config alias")

    def check_path(self, path: tuple, value: str) -> None:
        self.check_safe(path, value, "a path")
        if not value or not _PATH_RE.match(value):
            raise self.fail(path, f"invalid path {value!r}", "use a plain path of letters, digits and / . _ - ~")

    def check_safe(self, path: tuple, value: str, what: str) -> None:
        if value.startswith("-"):
            raise self.fail(path, f"{value!r} starts with '-' and would be read as an option",
                            f"write {what} without the leading '-'")
        bad = sorted(set(value) & _SHELL_META)
        if bad:
            raise self.fail(path, f"{value!r} contains shell metacharacters {''.join(bad)!r}",
                            f"write {what} without them")

    def check_tags(self, path: tuple, value: list) -> None:
        for tag in value:
            if not isinstance(tag, str) or not _NAME_RE.match(tag):
                raise self.fail(path, f"invalid tag {tag!r}", 'use short words such as tags = ["gpu", "rtx4090"]')


_KIND_NAMES = {str: "a string", int: "an integer", float: "a number", list: "a list", dict: "a table"}


def _type_name(value: Any) -> str:
    return {bool: "a boolean", int: "an integer", float: "a number", str: "a string", list: "a list",
            dict: "a table"}.get(type(value), type(value).__name__)


def _display(path: tuple) -> str:
    """A TOML-like name for a key: `[cluster].work_dir`, `[[nodes]] #2 .port`, `[jobs.train]`."""
    if not path:
        return "(top level)"
    head, rest = path[0], path[1:]
    if head == "nodes" and rest and isinstance(rest[0], int):
        label = f"[[nodes]] #{rest[0] + 1}"
        rest = rest[1:]
    elif head == "jobs" and rest:
        label, rest = f"[jobs.{rest[0]}]", rest[1:]
    elif head in _TOP_KEYS:
        label = f"[[nodes]]" if head == "nodes" else f"[{head}]"
    else:
        return str(head)
    return label + "".join(f".{key}" for key in rest)


def _closest(key: str, allowed: set[str]) -> str | None:
    import difflib

    matches = difflib.get_close_matches(key, sorted(allowed), n=1, cutoff=0.6)
    return matches[0] if matches else None

"""cluster.toml: read, validate and turn into frozen, typed specs.

Every mistake becomes one :class:`ConfigError` whose message names the file, the line, the key and
what to do, so the CLI can print it on one line and exit 2 without a traceback, whatever the file
holds. This module reads the file and the [cluster] table; node_spec.py and job_spec.py the
[[nodes]] and [jobs.NAME] tables, all with checks.py's Validator.
"""

from __future__ import annotations

import re
import sys
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Mapping

from homegpu.remote.config.alert_rules import BUDGETS, AlertRules, parse_alerts
from homegpu.remote.config.checks import TOP_KEYS, ConfigError, Limits, Validator, display, show
from homegpu.remote.config.durations import Duration
from homegpu.remote.config.job_spec import JobSpec, parse_jobs
from homegpu.remote.config.node_spec import LOCAL_HOST, RUNTIMES, NodeSpec, parse_nodes
from homegpu.remote.config.key_tables import CLUSTER
from homegpu.remote.config.slurm_keys import HOMEGPU, check_scheduler
from homegpu.remote.config.tariff import Tariff, parse_tariff
from homegpu.remote.config.toml_lines import LineIndex

__all__ = [
    "DEFAULT_CLUSTER_NAME", "DEFAULT_CONFIG_NAME", "EMBEDDED_DEFAULT", "LOCAL_HOST", "RUNTIMES", "AlertRules",
    "ClusterSpec", "ConfigError", "NodeSpec", "SshDefaults", "embedded_default", "find_config", "load_cluster",
    "parse_cluster",
]

DEFAULT_CONFIG_NAME = "cluster.toml"
DEFAULT_CLUSTER_NAME = "home"  # [cluster].name when the file has none, `homegpu init`, the embedded default
EMBEDDED_DEFAULT = "<embedded default>"
MAX_FILE_BYTES = 1 << 20  # a cluster file is a few kilobytes; anything past a megabyte is not one
MAX_DEPTH = 8  # [jobs.NAME].env.KEY is the deepest a value sits (4); arrays and tables nest no further
_BIG_INT_DIGITS = sys.get_int_max_str_digits() or 4300  # tomllib cannot read a longer decimal integer

# (lowest, highest, unit) of each [cluster] number: far beyond what a real cluster needs.
LIMITS: Limits = {
    "connect_timeout": (0.1, 3600.0, " seconds"),
    "keepalive_interval": (0.1, 3600.0, " seconds"),
    "keepalive_count_max": (1, 1000, ""),
    "stats_interval": (0.1, 3600.0, " seconds"),
}


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
class ClusterSpec:
    """The whole cluster.toml, validated."""

    name: str
    nodes: tuple[NodeSpec, ...]
    ssh: SshDefaults = field(default_factory=SshDefaults)
    stats_interval: float = 1.0
    work_dir: str = "~/.homegpu"
    jobs: Mapping[str, JobSpec] = field(default_factory=lambda: MappingProxyType({}))
    source: str = EMBEDDED_DEFAULT
    alerts: AlertRules = field(default_factory=AlertRules)
    tariff: Tariff = field(default_factory=Tariff)  # what a kWh costs (no price: energy only)
    scheduler: str = HOMEGPU  # or SLURM: each run is one Slurm job, submitted on slurm_login
    slurm_login: str = ""  # where sbatch runs: a node's name or an ssh alias

    @property
    def login_only(self) -> str:
        """The node that is a session for the placement's commands but runs no worker ("": none). It is slurm_login,
        which config/slurm_keys.py accepts only where Slurm places the runs."""
        return self.slurm_login

    def slurm_login_node(self) -> NodeSpec | None:
        """The node slurm_login names, or None where it is an ssh alias or host of its own."""
        return next((node for node in self.nodes if node.name == self.slurm_login), None)

    def slurm_login_spec(self) -> NodeSpec:
        """Where Slurm's commands run: the node slurm_login names, else its ssh alias or host as a node of its own."""
        return self.slurm_login_node() or NodeSpec(self.slurm_login, self.slurm_login)

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
        name=DEFAULT_CLUSTER_NAME,
        nodes=(NodeSpec.this_machine(),),
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
        ConfigError: for any mistake, a missing, unreadable, huge or non-UTF-8 file included.
    """
    if path is None:
        return embedded_default()
    path = Path(path)
    try:
        with path.open("rb") as file:
            raw = file.read(MAX_FILE_BYTES + 1)
    except FileNotFoundError:
        raise ConfigError(str(path), None, "file", "not found",
                          "check the path, or run `homegpu init` to write one") from None
    except OSError as exc:
        raise ConfigError(str(path), None, "file", f"cannot be read ({exc.strerror or exc})",
                          "make it a readable text file") from None
    if len(raw) > MAX_FILE_BYTES:
        raise ConfigError(str(path), None, "file", f"is larger than {MAX_FILE_BYTES >> 20} MiB",
                          "point --config at a cluster.toml (a few kilobytes)")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(str(path), raw.count(b"\n", 0, exc.start) + 1, "file",
                          f"not UTF-8 text (byte {raw[exc.start]:#04x})",
                          "save it as UTF-8 text, the only encoding TOML allows") from None
    return parse_cluster(text, str(path))


def parse_cluster(text: str, file: str = DEFAULT_CONFIG_NAME) -> ClusterSpec:
    """Validate TOML text into a ClusterSpec; a leading byte-order mark is allowed.

    Raises:
        ConfigError: for any mistake, syntax, nesting deeper than MAX_DEPTH and huge integers included.
    """
    text = text.removeprefix("\ufeff")
    lines = LineIndex(text)
    parts, line = lines.longest_key
    if parts > MAX_DEPTH:  # before tomllib, which takes quadratic time over a long dotted key
        raise ConfigError(file, line, display(lines.path_at(line)), f"a key of {parts} dotted parts",
                          f"cluster.toml needs at most {MAX_DEPTH}; remove the extra parts")
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        line = _decode_error_line(str(exc))
        problem = re.sub(r"\s*\(at (line \d+, column \d+|end of document)\)", "", str(exc))
        raise ConfigError(file, line, "syntax", f"invalid TOML: {problem}",
                          "fix the TOML syntax (quotes around strings, one [table] header per table)") from None
    except RecursionError:  # tomllib reads nested arrays and inline tables recursively
        raise _unreadable(file, lines, _deepest_line(text), "arrays or tables nested too deeply to read",
                          f"cluster.toml needs at most {MAX_DEPTH} levels; remove the extra brackets") from None
    except ValueError:  # tomllib's only other ValueError: int() of a decimal over the digit limit
        raise _unreadable(file, lines, _big_int_line(text), f"an integer of more than {_BIG_INT_DIGITS} digits",
                          "write an ordinary number") from None
    validator = Validator(file, lines)
    _check_top_keys(validator, data)
    _check_depth(validator, data)
    return _cluster(validator, data)


def _decode_error_line(message: str) -> int | None:
    match = re.search(r"at line (\d+)", message)
    return int(match.group(1)) if match else None


def _unreadable(file: str, lines: LineIndex, line: int | None, problem: str, hint: str) -> ConfigError:
    """A value tomllib could not read, named by the key written on its line when there is one."""
    path = lines.path_at(line)
    return ConfigError(file, line, display(path) if path else "syntax", problem, hint)


def _deepest_line(text: str) -> int | None:
    """The line with the most opening brackets: where a too-deep value most likely starts."""
    counts = [line.count("[") + line.count("{") for line in text.split("\n")]
    return counts.index(max(counts)) + 1 if counts and max(counts) else None


def _big_int_line(text: str) -> int | None:
    match = re.search(rf"\d(?:_?\d){{{_BIG_INT_DIGITS},}}", text)
    return text.count("\n", 0, match.start()) + 1 if match else None


def _check_depth(v: Validator, data: dict) -> None:
    """Refuse values nested deeper than MAX_DEPTH, without recursion (however deep they are)."""
    stack: list[tuple[tuple, object]] = [((), data)]
    while stack:
        path, value = stack.pop()
        if len(path) > MAX_DEPTH:
            raise v.fail(path, f"nested more than {MAX_DEPTH} levels deep",
                         "cluster.toml needs no deeper arrays or tables; remove the extra brackets")
        if isinstance(value, dict):
            stack.extend((path + (key,), item) for key, item in value.items())
        elif isinstance(value, list):
            stack.extend((path + (index,), item) for index, item in enumerate(value))


def _check_top_keys(v: Validator, data: dict) -> None:
    for key in data:
        if key not in TOP_KEYS:
            raise v.fail((key,), f"unknown key {show(key)}",
                         "use only [cluster], [[nodes]], [jobs.NAME] and [alerts] tables")


def _cluster(v: Validator, data: dict) -> ClusterSpec:
    """The whole file: [cluster], then [[nodes]], then [jobs.NAME], then [alerts]. Raises ConfigError."""
    table = v.table(data, ("cluster",))
    v.unknown_keys(table, ("cluster",), CLUSTER.names, CLUSTER.hint)
    get = v.getter(table, ("cluster",), LIMITS)
    ssh = SshDefaults(
        user=get("user", str, None, v.check_name_like),
        identity_file=get("identity_file", str, None, v.check_path),
        known_hosts=get("known_hosts", str, SshDefaults.known_hosts, v.check_path),
        connect_timeout=get("connect_timeout", Duration, SshDefaults.connect_timeout),
        keepalive_interval=get("keepalive_interval", Duration, SshDefaults.keepalive_interval),
        keepalive_count_max=get("keepalive_count_max", int, SshDefaults.keepalive_count_max),
    )
    nodes = parse_nodes(v, data)
    name = get("name", str, DEFAULT_CLUSTER_NAME, v.check_name)
    stats_interval = get("stats_interval", Duration, ClusterSpec.stats_interval)
    work_dir = get("work_dir", str, ClusterSpec.work_dir, v.check_path)
    scheduler, slurm_login = check_scheduler(v, table)
    jobs = parse_jobs(v, data, tuple(node.name for node in nodes), scheduler)
    alerts, tariff = parse_alerts(v, data), parse_tariff(v, table)
    _check_budgets(v, alerts, tariff)
    return ClusterSpec(name=name, nodes=nodes, ssh=ssh, stats_interval=stats_interval, work_dir=work_dir, jobs=jobs,
                       source=v.file, alerts=alerts, tariff=tariff, scheduler=scheduler, slurm_login=slurm_login)


def _check_budgets(v: Validator, alerts: AlertRules, tariff: Tariff) -> None:
    """A budget is money: it needs the price of a kWh."""
    for key in BUDGETS:
        if getattr(alerts, key) is not None and not tariff.priced:
            raise v.fail(("alerts", key), f"{key} without a price", "set price_per_kwh (and currency) in [cluster]")

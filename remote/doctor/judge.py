"""Pure judgements of one online node for `homegpu doctor`: its facts (:class:`NodeFacts`) -> :class:`Check` rows.

remote/doctor/probe.py probes the node and gathers the facts; every judgement here (versions, Docker and its
NVIDIA runtime, iperf3, disk, clock skew, the job port, whether the address is public) is a function
of them alone, so each is table-tested without a node. The GPU rows are remote/doctor/gpus.py's, the
PCIe link under load remote/doctor/link.py's.
"""

from __future__ import annotations

import ipaddress
import json
from dataclasses import dataclass

from homegpu.remote.doctor.check import Check
from homegpu.remote.doctor.gpus import container_runtime_check, gpu_check
from homegpu.remote.doctor.link import LoadFacts, link_check
from homegpu.remote.doctor.sleep_wake import SleepWakeFacts, sleep_wake_check
from homegpu.remote.events import NodeStats
from homegpu.remote.net import parse_probe
from homegpu.remote.nodes import (
    MIB_PER_GIB, SHELL_FIX, CommandResult, LoginTiming, StatsParseError, gib, login_problem, login_words,
    parse_agent_line, talking_shell,
)

MIN_PYTHON = (3, 8)
MIN_FREE_DISK_MIB = 5 * MIB_PER_GIB
MAX_CLOCK_SKEW_S = 2.0
NOT_FOUND = 127
NO_ANSWER = -2  # pseudo exit statuses for a command that timed out / could not be sent
NOT_SENT = -3

CHECK_NAMES = ("ssh", "host key", "login shell", "login time", "python3", "tensorflow", "docker", "nvidia container runtime",
               "gpus", "pcie link", "iperf3", "disk", "clock", "job port", "address", "wake and sleep", "reachable")
TF_INSTALL = "'tensorflow==2.21.*' 'tf-keras==2.21.*'"


@dataclass(frozen=True)
class NodeFacts:
    """Everything the probes learned about one online node; the checks are pure functions of it."""

    name: str
    runtime: str
    python: str
    work_dir: str
    address: str
    port: int
    python_version: CommandResult
    docker_info: CommandResult | None
    nvml: CommandResult
    smi: CommandResult
    iperf3: CommandResult
    clock: tuple[float, CommandResult, float]
    port_probe: CommandResult
    tensorflow: CommandResult | None = None  # process nodes only: docker workers use the job's image
    load: LoadFacts | None = None  # GPU nodes only: the links read under a load of doctor's own
    sleep_wake: SleepWakeFacts | None = None  # nodes with a mac: their NICs, and whether sudo allows their sleep


def node_checks(facts: NodeFacts, alone: bool = False) -> list[Check]:
    """All rows after ssh and host key, in CHECK_NAMES order; `alone`: the cluster has this node only."""
    python = python_check(facts)
    python_ok = python.ok is True
    gpus = gpu_check(facts.name, _agent_stats(facts.nvml), _agent_stats(facts.smi), python_ok,
                     containers=facts.runtime == "docker")
    return [
        python,
        tensorflow_check(facts, python_ok),
        docker_check(facts),
        container_runtime_check(facts.name, facts.runtime, _docker_info(facts), gpu_count(facts)),
        gpus,
        link_check(facts.name, gpu_count(facts), facts.load, _load_reading(facts), python_ok),
        iperf3_check(facts, alone),
        disk_check(facts, python_ok),
        clock_check(facts, python_ok),
        port_check(facts, python_ok),
        address_check(facts),
        sleep_wake_check(facts.name, facts.sleep_wake),
    ]


def shell_check(node: str, banner: str, sftp_trouble: str, failure: str = "") -> Check:
    """The login shell row: silent, or what it prints and the fix; and how files move (SFTP or commands).
    `failure`: why even the commands' way to the home directory failed ("" when it worked)."""
    if failure:
        return Check(node, "login shell", False, f"cannot read the node's files: {failure}",
                     "Check that the node's user can run sh, mkdir, find and tar, or that its sshd offers SFTP")
    files = f"; no SFTP ({sftp_trouble}), so homegpu moves files with commands" if sftp_trouble else ""
    if banner.strip():
        return Check(node, "login shell", False, talking_shell(banner) + files, SHELL_FIX)
    return Check(node, "login shell", True, "prints nothing for non-interactive commands" + files)


def login_time_check(node: str, timing: LoginTiming | None) -> Check:
    """The login time row: how long the node's login shell takes before a command, and when it is slow or stuck,
    which file or lock and the fix. `timing` None: commands start without a login shell (this machine)."""
    if timing is None:
        return Check(node, "login time", None, "this machine: commands start without a login shell")
    problem = login_problem(timing)
    if problem:
        return Check(node, "login time", False, *problem)
    return Check(node, "login time", True, login_words(timing))


def _needs_python(facts: NodeFacts, name: str) -> Check:
    return Check(facts.name, name, None, f"skipped: needs a working {facts.python}")


def _timeout_fix(argv: str) -> str:
    return f"Log in to the node and run `{argv}` by hand to see why it hangs."


def python_check(facts: NodeFacts) -> Check:
    result, name = facts.python_version, "python3"
    fix = (f"Install Python {MIN_PYTHON[0]}.{MIN_PYTHON[1]} or newer on the node, "
           f'or set python = "/path/to/python3" for {facts.name} in cluster.toml.')
    if result.exit_status == NOT_FOUND:
        return Check(facts.name, name, False, f"{facts.python} not found on the node", fix)
    if result.exit_status == NO_ANSWER:
        return Check(facts.name, name, False, result.telling_line, _timeout_fix(f"{facts.python} --version"))
    version = parse_version(result.stdout) if result.ok else None
    if version is None:
        return Check(facts.name, name, False, f"{facts.python} failed: {result.telling_line}", fix)
    text = ".".join(map(str, version))
    if version[:2] < MIN_PYTHON:
        return Check(facts.name, name, False, f"{facts.python} is Python {text}, too old", fix)
    return Check(facts.name, name, True, f"Python {text} ({facts.python})")


def tensorflow_check(facts: NodeFacts, python_ok: bool) -> Check:
    name = "tensorflow"
    if facts.runtime != "process":
        return Check(facts.name, name, None, "not needed here: workers run in the job's image")
    if not python_ok:
        return _needs_python(facts, name)
    try:
        found = json.loads(facts.tensorflow.stdout)
    except (AttributeError, ValueError):
        return Check(facts.name, name, False, f"cannot ask {facts.python}: {facts.tensorflow.telling_line}",
                     _timeout_fix(f"{facts.python} -m pip show tensorflow"))
    missing = [label for key, label in (("tensorflow", "TensorFlow"), ("tf_keras", "tf-keras")) if not found.get(key)]
    if missing:
        return Check(facts.name, name, False, f"{' and '.join(missing)} not installed for {facts.python}",
                     f"Run `{facts.python} -m pip install {TF_INSTALL}` on the node, or set python = "
                     f'"/path/to/python" with TensorFlow for {facts.name} (or the job) in cluster.toml.')
    return Check(facts.name, name, True, f"TensorFlow {found['tensorflow']}, tf-keras {found['tf_keras']}")


def parse_version(text: str) -> tuple[int, ...] | None:
    """"3.11.2" -> (3, 11, 2); None for anything else."""
    parts = text.strip().split(".")
    return tuple(int(p) for p in parts) if parts and all(p.isdigit() for p in parts) else None


def _docker_info(facts: NodeFacts) -> dict | None:
    result = facts.docker_info
    if result is None or not result.ok:
        return None
    for line in result.stdout.splitlines():
        if line.startswith("{"):
            try:
                info = json.loads(line)
            except ValueError:
                return None
            return info if isinstance(info, dict) and info.get("ServerVersion") else None
    return None


def docker_check(facts: NodeFacts) -> Check:
    name = "docker"
    if facts.runtime != "docker":
        return Check(facts.name, name, None, f'not needed (runtime "{facts.runtime}")')
    info = _docker_info(facts)
    if info is not None:
        return Check(facts.name, name, True, f"Docker Engine {info['ServerVersion']}")
    result = facts.docker_info
    if result.exit_status == NOT_FOUND:
        return Check(facts.name, name, False, "docker is not installed",
                     "Install Docker Engine (https://docs.docker.com/engine/install/), "
                     f'or set runtime = "process" for {facts.name} in cluster.toml.')
    if result.exit_status == NO_ANSWER:
        return Check(facts.name, name, False, f"docker info: {result.telling_line}", _timeout_fix("docker info"))
    problem = result.telling_line
    if "permission denied" in problem.lower():
        fix = "Add the SSH user to the docker group (sudo usermod -aG docker $USER) and log in again."
    else:
        fix = "Start the Docker engine on the node (sudo systemctl enable --now docker)."
    return Check(facts.name, name, False, f"the Docker engine does not answer: {problem}", fix)


def _agent_stats(result: CommandResult) -> NodeStats | str:
    """The agent's one line as NodeStats, or why there is none."""
    for line in reversed(result.stdout.splitlines()):
        try:
            return parse_agent_line(line)
        except StatsParseError:
            continue
    return result.telling_line


def gpu_count(facts: NodeFacts) -> int:
    """The GPUs the stats agent saw, by whichever source saw more."""
    counts = [len(s.gpus) for s in map(_agent_stats, (facts.nvml, facts.smi)) if isinstance(s, NodeStats)]
    return max(counts, default=0)


def _load_reading(facts: NodeFacts) -> NodeStats | str | None:
    """The agent's reading taken under the load, as stats or why there is none; None without one."""
    return None if facts.load is None or facts.load.reading is None else _agent_stats(facts.load.reading)


# -- tools, disk, clock, port, address ------------------------------------------------------------------


def iperf3_check(facts: NodeFacts, alone: bool = False) -> Check:
    """iperf3 measures the links between nodes; on a one-node cluster (`alone`) there is no link,
    so its absence is a note, not a problem."""
    result, name = facts.iperf3, "iperf3"
    first = (result.stdout.strip().splitlines() or [""])[0]
    if first.startswith("iperf 3"):  # some builds exit 1 after printing the version
        return Check(facts.name, name, True, first.split(" (")[0])
    if result.exit_status == NO_ANSWER:
        return Check(facts.name, name, False, result.telling_line, _timeout_fix("iperf3 --version"))
    detail = "iperf3 not found on the node" if result.exit_status == NOT_FOUND else f"iperf3: {result.telling_line}"
    if alone:
        return Check(facts.name, name, None, f"{detail}; not needed on a one-node cluster (no link to measure): "
                     "install it (sudo apt install iperf3) before adding nodes")
    return Check(facts.name, name, False, detail,
                 "Install iperf3 on the node (sudo apt install iperf3); homegpu measures bandwidth with it.")


def disk_check(facts: NodeFacts, python_ok: bool) -> Check:
    stats = next((s for s in map(_agent_stats, (facts.nvml, facts.smi)) if isinstance(s, NodeStats)), None)
    if stats is None or not isinstance(stats.disk_free, (int, float)):
        if not python_ok:
            return _needs_python(facts, "disk")
        return Check(facts.name, "disk", None, f"free space in {facts.work_dir} could not be measured")
    free = f"{gib(stats.disk_free)} GiB free in {facts.work_dir}"
    if stats.disk_free < MIN_FREE_DISK_MIB:
        return Check(facts.name, "disk", False, f"only {free}, under {MIN_FREE_DISK_MIB // MIB_PER_GIB} GiB",
                     f"Free space on that disk, or set work_dir for {facts.name} to a larger disk in cluster.toml.")
    return Check(facts.name, "disk", True, free)


def clock_skew(sent: float, remote: float, received: float) -> tuple[float, float]:
    """(node clock − ours, uncertainty): the node read its clock somewhere in our round trip, so it
    is compared with the midpoint, and can be off by at most half the round trip."""
    return remote - (sent + received) / 2, (received - sent) / 2


def _seconds(value: float, sign: bool = False) -> str:
    text = f"{value * 1000:{'+' if sign else ''}.1f} ms" if abs(value) < 1 else f"{value:{'+' if sign else ''}.2f} s"
    return text.replace("-0.0 ms", "+0.0 ms")


def clock_check(facts: NodeFacts, python_ok: bool) -> Check:
    sent, result, received = facts.clock
    try:
        remote = float(result.stdout.strip())
    except ValueError:
        if not python_ok:
            return _needs_python(facts, "clock")
        return Check(facts.name, "clock", False, f"could not read the node's clock: {result.telling_line}",
                     _timeout_fix(f"{facts.python} -c 'import time; print(time.time())'"))
    skew, error = clock_skew(sent, remote, received)
    # ✗ only when the node is surely more than the limit off, however the round trip split.
    detail = f"{_seconds(skew, sign=True)} against this machine (±{_seconds(error)})"
    if abs(skew) - error > MAX_CLOCK_SKEW_S:
        return Check(facts.name, "clock", False, detail,
                     "Enable time sync on the node (sudo timedatectl set-ntp true, or install chrony).")
    return Check(facts.name, "clock", True, detail)


def _port_result(facts: NodeFacts) -> dict:
    binds = parse_probe(facts.port_probe.stdout)
    return binds[-1] if binds else {}


def port_check(facts: NodeFacts, python_ok: bool) -> Check:
    where, out = f"{facts.address}:{facts.port}", _port_result(facts)
    status, error = out.get("status"), out.get("error", "")
    if status == "free":
        return Check(facts.name, "job port", True, f"{where} is free")
    if status == "in use":
        return Check(facts.name, "job port", False, f"something listens on {where}",
                     f"Stop what listens on {where}, or set port in the job to a free one.")
    if status in ("not local", "unresolved"):
        return Check(facts.name, "job port", False, f"{facts.address} is not an address of this node ({error})",
                     f"Set address for {facts.name} in cluster.toml to the node's LAN IP.")
    if not python_ok:
        return _needs_python(facts, "job port")
    problem = error or facts.port_probe.telling_line
    return Check(facts.name, "job port", False, f"cannot bind {where}: {problem}",
                 "Use a job port above 1024 that no firewall or other program holds.")


def address_kind(text: str) -> str | None:
    """"loopback", "link-local", "private" or "public" for an IP; None for a host name.

    Shared (CGNAT, 100.64/10, e.g. Tailscale) and other reserved ranges are not reachable from the
    internet, so only globally routable addresses count as public.
    """
    try:
        ip = ipaddress.ip_address(text.strip("[]").split("%")[0])
    except ValueError:
        return None
    if ip.is_loopback:
        return "loopback"
    if ip.is_link_local:
        return "link-local"
    return "public" if ip.is_global else "private"


def is_public_address(text: str) -> bool:
    return address_kind(text) == "public"


def address_check(facts: NodeFacts) -> Check:
    ip = _port_result(facts).get("ip") or facts.address
    kind = address_kind(ip)
    shown = facts.address if ip == facts.address else f"{facts.address} ({ip})"
    if kind is None:
        return Check(facts.name, "address", None, f"cannot tell whether {facts.address} is public "
                     "(it did not resolve on the node)")
    if kind == "public":
        return Check(facts.name, "address", False,
                     f"WARNING: {shown} is a public IP; TensorFlow's worker port has no authentication; "
                     "keep jobs on a trusted LAN",
                     f"Set address for {facts.name} in cluster.toml to its LAN IP, "
                     f"or firewall port {facts.port} to the cluster's machines.")
    return Check(facts.name, "address", True, f"{shown} is {kind}")

"""`homegpu doctor`: check every node for what a training job will need, and say how to fix each gap.

Each node is probed on its own task (all nodes at once, `asyncio.gather(return_exceptions=True)`), so
a slow node costs only its own timeouts. Per node the probes run concurrently too; they only gather
facts (:class:`NodeFacts`), and pure functions turn the facts into :class:`Check` rows in a fixed order.
That split keeps every judgement (versions, GPU agreement, disk, skew, exposure) testable without a node.

GPUs are read twice with the stats agent, once through NVML and once through `nvidia-smi`, and the two
must agree on the GPUs and their memory sizes; memory used may differ only by what a moment apart
explains (a steady gap is the driver's reservation, which NVML without version-2 memory info counts). When `nvidia-smi` lists GPUs but NVML does not load in the node's Python, that is a ✗,
not a footnote: `nvidia-smi` is itself an NVML client, so the node has a driver whose library its
Python cannot load (a half-finished install or upgrade, a library outside the loader path, or tools
from another driver on PATH). Stats then come from the slower `nvidia-smi` fallback, and the NVIDIA
container toolkit (which loads the same libnvidia-ml) will not give containers the GPUs either.

Every command is an argv list; the transport quotes it with shlex.join, so config values never reach
a shell unquoted.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import time
from dataclasses import dataclass
from typing import Sequence

from homegpu.remote.check import Check
from homegpu.remote.cluster import Cluster
from homegpu.remote.config import NodeSpec
from homegpu.remote.connect import connect_wait
from homegpu.remote.doctor_network import reach_checks
from homegpu.remote.events import NodeState
from homegpu.remote.job_config import DEFAULT_JOB_PORT
from homegpu.remote.node import NodeOffline, NodeSession
from homegpu.remote.port_probe import parse_probe, probe_argv
from homegpu.remote.stats import NodeStats, StatsParseError, describe_gpus, parse_agent_line
from homegpu.remote.stats_agent_bundle import agent_command, agent_payload
from homegpu.remote.transport import CommandResult, TransportError

MIN_PYTHON = (3, 8)
MIN_FREE_DISK_MIB = 5 * 1024
MAX_CLOCK_SKEW_S = 2.0
COMMAND_TIMEOUT_S = 15.0
MEMORY_SLACK_MIB = 64  # NVML and nvidia-smi memory used may differ this much (read a moment apart)
AGENT_TIMEOUT_S = 45.0  # nvidia-smi may take up to 10 s per call on a busy or wedged driver
NOT_FOUND = 127
NO_ANSWER = -2  # pseudo exit statuses for a command that timed out / could not be sent
NOT_SENT = -3

CHECK_NAMES = ("ssh", "host key", "python3", "tensorflow", "docker", "nvidia container runtime", "gpus",
               "iperf3", "disk", "clock", "job port", "address", "reachable")
NOT_REACHABLE = "node not reachable"

PYTHON_VERSION_SCRIPT = "import sys; print('%d.%d.%d' % tuple(sys.version_info[:3]))"
# The installed versions, not an import: importing TensorFlow costs seconds of CPU per node.
TF_VERSIONS_SCRIPT = """\
import json
from importlib import metadata
def version(*names):
    for name in names:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
print(json.dumps({"tensorflow": version("tensorflow", "tensorflow-cpu"), "tf_keras": version("tf-keras")}))
"""
TF_INSTALL = "'tensorflow==2.21.*' 'tf-keras==2.21.*'"
CLOCK_PINGS = 3
# Answers each line on stdin with its clock: started first and pinged once ready, so neither SSH
# channel setup nor Python's start-up (half a second behind pyenv shims) lands in a round trip.
CLOCK_SCRIPT = """\
import sys, time
sys.stdout.write("ready\\n"); sys.stdout.flush()
while sys.stdin.readline():
    sys.stdout.write(repr(time.time()) + "\\n"); sys.stdout.flush()
"""
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


# -- running ------------------------------------------------------------------------------------


async def diagnose(cluster: Cluster, job_port: int = DEFAULT_JOB_PORT, *,
                   settle_timeout: float | None = None) -> list[Check]:
    """Check every node of an open :class:`~homegpu.remote.cluster.Cluster`, all at once.

    Each node is probed as soon as its own connection settles (waiting at most `settle_timeout`,
    default the SSH connect timeout + 2 s), so a node that is slow to answer delays only itself.
    Returns the checks grouped by node in config order, each node's in :data:`CHECK_NAMES` order; a
    node whose probing crashed gets one ✗ row saying so instead of taking the report down.
    """
    if settle_timeout is None:
        settle_timeout = connect_wait(cluster.spec, 2)
    sessions = list(cluster.nodes.values())

    async def one(session: NodeSession) -> list[Check]:
        await cluster.wait_settled(settle_timeout, [session.name])
        return await _diagnose_node(session, job_port)

    results = await asyncio.gather(*(one(session) for session in sessions), return_exceptions=True)
    ready = [session for session, result in zip(sessions, results) if _port_free(result)]
    reach = await reach_checks(ready, job_port)
    checks: list[Check] = []
    for session, result in zip(sessions, results):
        if isinstance(result, BaseException):
            checks.append(Check(session.name, "doctor", False, f"checking failed: {result!r}",
                                "Run `homegpu doctor` again, and report a bug if this repeats."))
        elif session.name in reach:
            checks.extend(result + [reach[session.name]])
        else:
            skipped = NOT_REACHABLE if result[-1].detail == NOT_REACHABLE else "skipped: see job port"
            checks.extend(result + [Check(session.name, "reachable", None, skipped)])
    return checks


def _port_free(result: list[Check] | BaseException) -> bool:
    """Whether the node's own checks leave its job port free for the reach test's listener."""
    return not isinstance(result, BaseException) and any(c.name == "job port" and c.ok for c in result)


async def _diagnose_node(session: NodeSession, job_port: int) -> list[Check]:
    state, reason = session.state, session.reason  # snapshot: a retry would reset it to CONNECTING
    head = connection_checks(session.name, session.spec, session.cluster.ssh.known_hosts, state, reason)
    if state is not NodeState.ONLINE:
        rest = [Check(session.name, name, None, NOT_REACHABLE) for name in CHECK_NAMES[2:-1]]
        return head + rest
    facts = await gather_facts(session, job_port)
    return await _sftp_check(session, head) + node_checks(facts, alone=len(session.cluster.nodes) == 1)


async def _sftp_check(session: NodeSession, head: list[Check]) -> list[Check]:
    """`head` with the ssh row failed if the node's SSH server cannot do SFTP (homegpu's file transfers)."""
    try:
        await session.home_dir()
    except TransportError as exc:
        detail, _, fix = str(exc).partition("; ")
        return [Check(session.name, "ssh", False, f"connected, but {detail}", fix[:1].upper() + fix[1:]), *head[1:]]
    except NodeOffline:
        pass  # the other probes say so
    return head


async def _run(session: NodeSession, argv: Sequence[str], *, input: bytes | None = None,
               timeout: float = COMMAND_TIMEOUT_S) -> CommandResult:
    """Run argv on the node; a timeout or a dropped connection becomes a result, not an exception."""
    try:
        return await session.run(list(argv), input=input, timeout=timeout)
    except asyncio.TimeoutError:
        return CommandResult(NO_ANSWER, "", f"no answer within {timeout:g} s")
    except Exception as exc:  # noqa: BLE001 - NodeOffline, asyncssh errors: the link is gone
        return CommandResult(NOT_SENT, "", str(exc) or type(exc).__name__)


async def probe_clock(session: NodeSession, python: str) -> tuple[float, CommandResult, float]:
    """(sent, the node's clock as a result, received) for the tightest of CLOCK_PINGS round trips."""
    try:
        return await asyncio.wait_for(_ping_clock(session, python), COMMAND_TIMEOUT_S)
    except asyncio.TimeoutError:
        return 0.0, CommandResult(NO_ANSWER, "", f"no answer within {COMMAND_TIMEOUT_S:g} s"), 0.0
    except Exception as exc:  # noqa: BLE001 - the link went away: same as in _run
        return 0.0, CommandResult(NOT_SENT, "", str(exc) or type(exc).__name__), 0.0


async def _ping_clock(session: NodeSession, python: str) -> tuple[float, CommandResult, float]:
    process = await session.spawn([python, "-c", CLOCK_SCRIPT])
    try:
        lines = process.lines()
        while (line := await anext(lines, None)) not in ("ready", None):
            pass  # a login banner, say
        best: tuple[float, CommandResult, float] | None = None
        for _ in range(CLOCK_PINGS if line else 0):
            sent = time.time()
            process.write(b"\n")
            reply = await anext(lines, None)
            received = time.time()
            if reply is None:
                break
            if best is None or received - sent < best[2] - best[0]:
                best = (sent, CommandResult(0, reply, ""), received)
        if best is not None:
            return best
        process.close_stdin()
        status = await process.wait()
        return 0.0, CommandResult(NOT_SENT if status is None else status, "", await process.stderr_text()), 0.0
    finally:
        process.terminate()


async def gather_facts(session: NodeSession, job_port: int) -> NodeFacts:
    """Probe one online node. The clock goes first, alone, so the other probes cannot load its round trips."""
    spec, cluster = session.spec, session.cluster
    python, work_dir = spec.python, cluster.work_dir_of(spec)
    clock = await probe_clock(session, python)

    def agent(source: str):
        argv = agent_command(python=python, interval=0.1, work_dir=work_dir, source=source) + ["--once"]
        return _run(session, argv, input=agent_payload(), timeout=AGENT_TIMEOUT_S)

    docker_argv = ["docker", "info", "--format", "{{json .}}"]
    docker = _run(session, docker_argv) if spec.runtime == "docker" else _none()
    tensorflow = _run(session, [python, "-c", TF_VERSIONS_SCRIPT]) if spec.runtime == "process" else _none()
    version, tf_versions, nvml, smi, iperf3, port, docker_info = await asyncio.gather(
        _run(session, [python, "-c", PYTHON_VERSION_SCRIPT]),
        tensorflow,
        agent("nvml"),
        agent("nvidia-smi"),
        _run(session, ["iperf3", "--version"]),
        _run(session, probe_argv(python, session.address, [job_port])),
        docker,
    )
    return NodeFacts(spec.name, spec.runtime, python, work_dir, session.address, job_port,
                     version, docker_info, nvml, smi, iperf3, clock, port, tf_versions)


async def _none() -> None:
    return None


# -- connection -----------------------------------------------------------------------------------

_OFFLINE_FIX = "Check that the machine is on and sshd runs, and that {node}'s host and port in cluster.toml are right."
_AUTH_FIX = ("Install your public key on the node (ssh-copy-id USER@{host}), "
             "or point identity_file in cluster.toml at the key it accepts.")


def split_reason(reason: str) -> tuple[str, str]:
    """A session's reason is "what happened; what to do": split it at the last "; " (or ". ")."""
    for separator in ("; ", ". "):
        at = reason.rfind(separator)
        if at > 0:
            fix = reason[at + len(separator):]
            return reason[:at], fix[:1].upper() + fix[1:]
    return reason, ""


def connection_checks(node: str, spec: NodeSpec, known_hosts: str, state: NodeState, reason: str) -> list[Check]:
    """The ssh and host key rows, from the session's state alone (no command needed)."""
    if spec.is_local:
        return [Check(node, "ssh", True, "this machine (no SSH needed)"),
                Check(node, "host key", None, "not needed for this machine")]
    where = spec.host if spec.port is None else f"{spec.host}:{spec.port}"
    if state is NodeState.ONLINE:
        return [Check(node, "ssh", True, f"connected to {where}"),
                Check(node, "host key", True, f"verified against {known_hosts}")]
    if state in (NodeState.HOST_KEY_UNKNOWN, NodeState.HOST_KEY_CHANGED):
        detail, fix = split_reason(reason)
        return [Check(node, "ssh", True, f"sshd answers at {where}"), Check(node, "host key", False, detail, fix)]
    if state is NodeState.AUTH_FAILED:
        return [Check(node, "ssh", False, reason, _AUTH_FIX.format(host=spec.host)),
                Check(node, "host key", True, f"verified against {known_hosts}")]
    detail = reason or f"still connecting to {where}"
    return [Check(node, "ssh", False, detail, _OFFLINE_FIX.format(node=node)),
            Check(node, "host key", None, NOT_REACHABLE)]


# -- the checks of an online node -------------------------------------------------------------------


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
        container_runtime_check(facts, _gpu_count(facts)),
        gpus,
        iperf3_check(facts, alone),
        disk_check(facts, python_ok),
        clock_check(facts, python_ok),
        port_check(facts, python_ok),
        address_check(facts),
    ]


def _needs_python(facts: NodeFacts, name: str) -> Check:
    return Check(facts.name, name, None, f"skipped: needs a working {facts.python}")


def _failure(result: CommandResult) -> str:
    """The most telling line of a failed command."""
    lines = (result.stderr.strip() or result.stdout.strip()).splitlines()
    return lines[-1] if lines else f"exit status {result.exit_status}"


def _timeout_fix(argv: str) -> str:
    return f"Log in to the node and run `{argv}` by hand to see why it hangs."


def python_check(facts: NodeFacts) -> Check:
    result, name = facts.python_version, "python3"
    fix = (f"Install Python {MIN_PYTHON[0]}.{MIN_PYTHON[1]} or newer on the node, "
           f'or set python = "/path/to/python3" for {facts.name} in cluster.toml.')
    if result.exit_status == NOT_FOUND:
        return Check(facts.name, name, False, f"{facts.python} not found on the node", fix)
    if result.exit_status == NO_ANSWER:
        return Check(facts.name, name, False, _failure(result), _timeout_fix(f"{facts.python} --version"))
    version = parse_version(result.stdout) if result.ok else None
    if version is None:
        return Check(facts.name, name, False, f"{facts.python} failed: {_failure(result)}", fix)
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
        return Check(facts.name, name, False, f"cannot ask {facts.python}: {_failure(facts.tensorflow)}",
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
        return Check(facts.name, name, False, f"docker info: {_failure(result)}", _timeout_fix("docker info"))
    problem = _failure(result)
    if "permission denied" in problem.lower():
        fix = "Add the SSH user to the docker group (sudo usermod -aG docker $USER) and log in again."
    else:
        fix = "Start the Docker engine on the node (sudo systemctl enable --now docker)."
    return Check(facts.name, name, False, f"the Docker engine does not answer: {problem}", fix)


def container_runtime_check(facts: NodeFacts, gpu_count: int) -> Check:
    """Docker nodes with GPUs need the NVIDIA runtime registered, or NVIDIA CDI devices."""
    name = "nvidia container runtime"
    if facts.runtime != "docker":
        return Check(facts.name, name, None, f'not needed (runtime "{facts.runtime}")')
    if gpu_count == 0:
        return Check(facts.name, name, None, "not needed (no GPU)")
    info = _docker_info(facts)
    if info is None:
        return Check(facts.name, name, None, "skipped: needs a working Docker engine")
    if "nvidia" in (info.get("Runtimes") or {}):
        return Check(facts.name, name, True, "nvidia runtime registered with Docker")
    cdi = [d.get("ID", "") for d in info.get("DiscoveredDevices") or [] if isinstance(d, dict)]
    cdi = [device for device in cdi if device.startswith("nvidia.com/gpu")]
    if cdi:
        return Check(facts.name, name, True, f"CDI devices {', '.join(cdi)}")
    return Check(facts.name, name, False, "Docker has no nvidia runtime and no NVIDIA CDI devices, "
                 "so containers cannot use the GPUs",
                 "Install the NVIDIA Container Toolkit, then run "
                 "`sudo nvidia-ctk runtime configure --runtime=docker && sudo systemctl restart docker`.")


# -- GPUs ---------------------------------------------------------------------------------------------


def _agent_stats(result: CommandResult) -> NodeStats | str:
    """The agent's one line as NodeStats, or why there is none."""
    for line in reversed(result.stdout.splitlines()):
        try:
            return parse_agent_line(line)
        except StatsParseError:
            continue
    return _failure(result)


def _gpu_count(facts: NodeFacts) -> int:
    counts = [len(s.gpus) for s in map(_agent_stats, (facts.nvml, facts.smi)) if isinstance(s, NodeStats)]
    return max(counts, default=0)


def _source_note(stats: NodeStats, prefix: str) -> str:
    notes = [e[len(prefix):].lstrip(": ") for e in stats.errors if e.startswith(prefix)]
    return notes[0] if notes else "unknown reason"


_MISMATCH_FIX = "Driver/library mismatch: reboot, or reinstall the NVIDIA driver if that does not help."
_NO_NVML_FIX = ("Make the driver's libnvidia-ml.so.1 loadable for the node's python "
                "(`ldconfig -p | grep nvidia-ml` shows it), or reinstall the NVIDIA driver.")
_NO_PYNVML_FIX = "Install nvidia-ml-py where homegpu runs (pip install nvidia-ml-py); homegpu ships it to the nodes."


def gpu_check(node: str, nvml: NodeStats | str, smi: NodeStats | str, python_ok: bool = True,
              containers: bool = False) -> Check:
    """Compare the GPUs NVML sees with those nvidia-smi sees (see the module docstring for why a
    one-sided view is ✗). Each side is the agent's stats with that source, or why the agent failed;
    `containers` says the node runs jobs in Docker, whose GPU hand-out needs NVML too."""
    name = "gpus"
    if isinstance(nvml, str) or isinstance(smi, str):
        if not python_ok:
            return Check(node, name, None, "skipped: needs a working python3")
        return Check(node, name, False, f"the stats agent failed: {nvml if isinstance(nvml, str) else smi}",
                     "Run `homegpu status` to see the agent's error, and report a bug if it persists.")
    nvml_up, smi_up = nvml.source == "nvml", smi.source == "nvidia-smi"
    if nvml_up and smi_up:
        return _compare_gpu_lists(node, nvml, smi)
    if nvml_up:
        if not nvml.gpus:
            return Check(node, name, True, "no GPU (CPU-only node: trains on CPU)")
        return Check(node, name, True, f"{describe_gpus(nvml)} (NVML; nvidia-smi is not on PATH)")
    if smi_up and smi.gpus:
        why = _source_note(nvml, "nvml")
        fix = _NO_PYNVML_FIX if "pynvml is not importable" in why else _NO_NVML_FIX
        effect = "stats fall back to nvidia-smi" + (" and Docker cannot hand these GPUs to containers"
                                                    if containers else "")
        return Check(node, name, False, f"nvidia-smi sees {describe_gpus(smi)}, but NVML does not load "
                     f"({why}); {effect}", fix)
    if smi_up and smi.errors:
        return Check(node, name, False, f"nvidia-smi cannot reach the driver: {smi.errors[0]}",
                     "Load the driver: reboot, or reinstall the NVIDIA driver for the running kernel.")
    return Check(node, name, True, "no GPU (CPU-only node: trains on CPU)")


def _compare_gpu_lists(node: str, nvml: NodeStats, smi: NodeStats) -> Check:
    """The same GPUs (by UUID), the same memory sizes, and memory used within MEMORY_SLACK_MIB:
    the two readings are taken a moment apart, so a working GPU's usage may move in between."""
    nvml_ids, smi_ids = sorted(map(str, (g.uuid for g in nvml.gpus))), sorted(map(str, (g.uuid for g in smi.gpus)))
    if nvml_ids != smi_ids:
        return Check(node, "gpus", False, f"NVML sees {len(nvml_ids)} GPUs {nvml_ids}, "
                     f"nvidia-smi sees {len(smi_ids)} {smi_ids}", _MISMATCH_FIX)
    if not nvml.gpus:
        return Check(node, "gpus", True, "no GPU (CPU-only node: trains on CPU)")
    totals, used = _memory_differences(nvml, smi)
    if totals:
        return Check(node, "gpus", False, f"NVML and nvidia-smi disagree on memory size: {'; '.join(totals)}",
                     _MISMATCH_FIX)
    if used:
        return Check(node, "gpus", True, f"{describe_gpus(nvml)}; memory used differs: {'; '.join(used)} "
                     "(a steady gap is the driver's reservation, which NVML without version-2 memory info "
                     "counts as used: a newer NVIDIA driver shows nvidia-smi's figure)")
    return Check(node, "gpus", True, f"{describe_gpus(nvml)} (NVML and nvidia-smi agree)")


def _memory_differences(nvml: NodeStats, smi: NodeStats) -> tuple[list[str], list[str]]:
    """Per GPU, where the two disagree on total memory, and where on memory used beyond the slack."""
    theirs = {str(gpu.uuid): gpu for gpu in smi.gpus}
    totals, used = [], []
    for gpu in nvml.gpus:
        other = theirs[str(gpu.uuid)]
        if _numbers(gpu.mem_total, other.mem_total) and gpu.mem_total != other.mem_total:
            totals.append(f"GPU {gpu.index} {gpu.mem_total} MiB (NVML), {other.mem_total} MiB (nvidia-smi)")
        if _numbers(gpu.mem_used, other.mem_used) and abs(gpu.mem_used - other.mem_used) > MEMORY_SLACK_MIB:
            used.append(f"GPU {gpu.index} {gpu.mem_used} MiB (NVML), {other.mem_used} MiB (nvidia-smi)")
    return totals, used


def _numbers(*values: object) -> bool:
    return all(isinstance(v, (int, float)) for v in values)


# -- tools, disk, clock, port, address ------------------------------------------------------------------


def iperf3_check(facts: NodeFacts, alone: bool = False) -> Check:
    """iperf3 measures the links between nodes; on a one-node cluster (`alone`) there is no link,
    so its absence is a note, not a problem."""
    result, name = facts.iperf3, "iperf3"
    first = (result.stdout.strip().splitlines() or [""])[0]
    if first.startswith("iperf 3"):  # some builds exit 1 after printing the version
        return Check(facts.name, name, True, first.split(" (")[0])
    if result.exit_status == NO_ANSWER:
        return Check(facts.name, name, False, _failure(result), _timeout_fix("iperf3 --version"))
    detail = "iperf3 not found on the node" if result.exit_status == NOT_FOUND else f"iperf3: {_failure(result)}"
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
    free = f"{stats.disk_free / 1024:.1f} GiB free in {facts.work_dir}"
    if stats.disk_free < MIN_FREE_DISK_MIB:
        return Check(facts.name, "disk", False, f"only {free}, under {MIN_FREE_DISK_MIB // 1024} GiB",
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
        return Check(facts.name, "clock", False, f"could not read the node's clock: {_failure(result)}",
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
    problem = error or _failure(facts.port_probe)
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

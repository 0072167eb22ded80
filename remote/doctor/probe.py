"""`homegpu doctor`: probe every node for what a training job will need, and say how to fix each gap.

Each node is probed on its own task (all nodes at once, `asyncio.gather(return_exceptions=True)`), so
a slow node costs only its own timeouts. Per node the probes run concurrently too; they only gather
facts (:class:`~homegpu.remote.doctor.judge.NodeFacts`), and the pure functions of
remote/doctor/judge.py turn them into :class:`Check` rows in a fixed order; the ssh and host key rows
come from the session's state (here), the reachable row from remote/doctor/network.py. GPUs are read
twice with the stats agent, once through NVML and once through `nvidia-smi` (see remote/doctor/gpus.py),
and on a node with GPUs a third time once the other probes are done, under a load of doctor's own
(node_side/scripts/gpu_load.py: an idle link is never judged, see remote/doctor/link.py).

Every command is an argv list; the transport quotes it with shlex.join, so config values never reach
a shell unquoted.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace
from typing import Sequence

from homegpu.remote.config import DEFAULT_JOB_PORT, NodeSpec
from homegpu.remote.doctor.check import Check
from homegpu.remote.doctor.judge import (
    CHECK_NAMES, NO_ANSWER, NOT_SENT, NodeFacts, gpu_count, login_time_check, node_checks, shell_check,
)
from homegpu.remote.doctor.link_probe import probe_under_load
from homegpu.remote.doctor.network import reach_checks
from homegpu.remote.doctor.sleep_wake import sleep_wake_facts
from homegpu.remote.events import NodeState
from homegpu.remote.net import probe_argv
from homegpu.remote.node_side import script
from homegpu.remote.nodes import (
    LOGIN_TIMEOUT_S, NODE_GONE, Cluster, CommandResult, CommandTimeout, NodeOffline, NodeSession, TransportError,
    agent_command, agent_payload, cause, connect_wait, ssh_target,
)

COMMAND_TIMEOUT_S = 15.0
AGENT_TIMEOUT_S = 45.0  # nvidia-smi may take up to 10 s per call on a busy or wedged driver
NOT_REACHABLE = "node not reachable"

PYTHON_VERSION_SCRIPT = "import sys; print('%d.%d.%d' % tuple(sys.version_info[:3]))"
TF_VERSIONS_SCRIPT = script("tf_versions")
CLOCK_PINGS = 3
CLOCK_SCRIPT = script("clock_echo")


# -- running ------------------------------------------------------------------------------------


async def diagnose(cluster: Cluster, job_port: int = DEFAULT_JOB_PORT, *,
                   settle_timeout: float | None = None) -> list[Check]:
    """Check every node of an open :class:`~homegpu.remote.nodes.cluster.Cluster`, all at once.

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
    state, reason = session.state, session.reason  # snapshot: a reconnect would reset it to CONNECTING
    head = connection_checks(session.name, session.spec, session.cluster.ssh.known_hosts, state, reason)
    if state is not NodeState.ONLINE:
        rest = [Check(session.name, name, None, NOT_REACHABLE) for name in CHECK_NAMES[2:-1]]
        return head + rest
    facts, login_time = await asyncio.gather(gather_facts(session, job_port), _login_time_check(session))
    return (head + [await _login_shell_check(session), login_time]
            + node_checks(facts, alone=len(session.cluster.nodes) == 1))


async def _login_time_check(session: NodeSession) -> Check:
    """The login time row: one login timed beside the other probes, waited for past pyenv's 60 s rehash timeout
    (LOGIN_TIMEOUT_S), so that a stale lock is named by its path and a stuck login never holds doctor longer."""
    try:
        timing = await session.time_login(LOGIN_TIMEOUT_S)
    except NODE_GONE as exc:
        return Check(session.name, "login time", None, f"not timed: {cause(exc)}")
    return login_time_check(session.name, timing)


async def _login_shell_check(session: NodeSession) -> Check:
    """The login shell row, once the probes' commands have run; one SFTP request finds out whether
    files can go by SFTP (homegpu falls back to commands where they cannot)."""
    if session.spec.is_local:
        return Check(session.name, "login shell", None, "this machine: commands start without a login shell")
    try:
        await session.home_dir()
        failure = ""
    except (TransportError, NodeOffline) as exc:
        failure = str(exc)
    return shell_check(session.name, session.shell_banner, session.sftp_trouble, failure)


async def _run(session: NodeSession, argv: Sequence[str], *, input: bytes | None = None,
               timeout: float = COMMAND_TIMEOUT_S) -> CommandResult:
    """Run argv on the node; a timeout or a dropped connection becomes a result, not an exception."""
    try:
        return await session.run(list(argv), input=input, timeout=timeout)
    except CommandTimeout:
        return CommandResult(NO_ANSWER, "", f"no answer within {timeout:g} s")
    except Exception as exc:  # noqa: BLE001 - NodeOffline, asyncssh errors: the link is gone
        return CommandResult(NOT_SENT, "", cause(exc))


async def probe_clock(session: NodeSession, python: str) -> tuple[float, CommandResult, float]:
    """(sent, the node's clock as a result, received) for the tightest of CLOCK_PINGS round trips."""
    try:
        return await asyncio.wait_for(_ping_clock(session, python), COMMAND_TIMEOUT_S)
    except asyncio.TimeoutError:
        return 0.0, CommandResult(NO_ANSWER, "", f"no answer within {COMMAND_TIMEOUT_S:g} s"), 0.0
    except Exception as exc:  # noqa: BLE001 - the link went away: same as in _run
        return 0.0, CommandResult(NOT_SENT, "", cause(exc)), 0.0


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
    """Probe one online node. The clock goes first, alone, so the other probes cannot load its round trips;
    the GPUs' load goes last, alone too, on a node where the agent saw GPUs."""
    spec, cluster = session.spec, session.cluster
    python, work_dir = spec.python, cluster.work_dir_of(spec)
    clock = await probe_clock(session, python)

    docker_argv = ["docker", "info", "--format", "{{json .}}"]
    docker = _run(session, docker_argv) if spec.runtime == "docker" else _none()
    tensorflow = _run(session, [python, "-c", TF_VERSIONS_SCRIPT]) if spec.runtime == "process" else _none()
    version, tf_versions, nvml, smi, iperf3, port, docker_info = await asyncio.gather(
        _run(session, [python, "-c", PYTHON_VERSION_SCRIPT]),
        tensorflow,
        _agent(session, python, work_dir, "nvml"),
        _agent(session, python, work_dir, "nvidia-smi"),
        _run(session, ["iperf3", "--version"]),
        _run(session, probe_argv(python, session.address, [job_port])),
        docker,
    )
    sleep_wake = await sleep_wake_facts(spec, ssh_target(cluster, spec).user, python, lambda argv: _run(session, argv))
    facts = NodeFacts(spec.name, spec.runtime, python, work_dir, session.address, job_port,
                      version, docker_info, nvml, smi, iperf3, clock, port, tf_versions, sleep_wake=sleep_wake)
    if gpu_count(facts) == 0:
        return facts
    load = await probe_under_load(session, python, lambda: _agent(session, python, work_dir, "auto"))
    return replace(facts, load=load)


def _agent(session: NodeSession, python: str, work_dir: str, source: str):
    """The stats agent's one reading of the node with `source`, as a result."""
    argv = agent_command(python=python, interval=0.1, work_dir=work_dir, source=source) + ["--once"]
    return _run(session, argv, input=agent_payload(), timeout=AGENT_TIMEOUT_S)


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
    if state is NodeState.ASLEEP:
        return [Check(node, "ssh", None, f"asleep ({reason}): `homegpu wake {node}`, then doctor again"),
                Check(node, "host key", None, NOT_REACHABLE)]
    detail = reason or f"still connecting to {where}"
    return [Check(node, "ssh", False, detail, _OFFLINE_FIX.format(node=node)),
            Check(node, "host key", None, NOT_REACHABLE)]


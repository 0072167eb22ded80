"""Can every node of a job reach every worker's address:port? Proven before anything starts.

A port that binds (port_probe) says nothing about the network: a firewall on the worker's machine,
an address that is another machine's, or a name only the controller resolves all leave TensorFlow
waiting at "Started server" until its timeout. So each node of the job listens once on its job
ports, on every interface as TensorFlow's server does, answering each connection with a secret of
its own, and every other node connects to every worker's address:port within a bound. Only the
secret coming back proves the connection reached that node's listener; each failure is named by
its real cause (a name that does not resolve, refused, no answer, no route, another program).

Both scripts use only the standard library of the node's python. The listener ends when its stdin
closes (our channel), or at its deadline if we vanish.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
from dataclasses import dataclass
from typing import Sequence

from homegpu.remote.net.port_probe import bind_problem, json_object
from homegpu.remote.node_side import script
from homegpu.remote.nodes import NODE_GONE, NodeSession, RemoteProcess, cause

CONNECT_TIMEOUT_S = 5.0
LISTENER_LIFETIME_S = 60.0
_START_TIMEOUT_S = 20.0

LISTEN_SCRIPT = script("port_listen")

CONNECT_SCRIPT = script("port_connect")


@dataclass(frozen=True)
class Endpoint:
    """One node of the job as its peers must reach it: its cluster address and its workers' ports."""

    node: NodeSession
    address: str
    ports: tuple[int, ...]


@dataclass(frozen=True)
class ReachProblem:
    """Something that keeps `sources` from reaching `node`'s `address`:`port`, with the fix."""

    node: str
    text: str


async def reach_problems(endpoints: Sequence[Endpoint],
                         timeout: float = CONNECT_TIMEOUT_S) -> list[ReachProblem]:
    """Everything that keeps a node of `endpoints` from reaching another's job ports.

    Endpoints at one address are one machine: its first node listens on all their ports. With fewer
    than two machines there is no network to cross.
    """
    machines: dict[str, Endpoint] = {}
    for end in endpoints:
        first = machines.setdefault(end.address, end)
        if first is not end:
            ports = first.ports + tuple(port for port in end.ports if port not in first.ports)
            machines[end.address] = Endpoint(first.node, first.address, ports)
    endpoints = list(machines.values())
    if len(endpoints) < 2:
        return []
    secrets_by_node = {end.node.name: secrets.token_hex(16) for end in endpoints}
    async with contextlib.AsyncExitStack() as stack:
        started = await asyncio.gather(*(_listen(stack, end, secrets_by_node[end.node.name]) for end in endpoints))
        problems = [problem for found in started for problem in found]
        listening = [end for end, found in zip(endpoints, started) if not found]
        results = await asyncio.gather(*(_connect(end, listening, secrets_by_node, timeout) for end in endpoints))
    return problems + _grouped([item for found in results for item in found], listening, timeout)


async def _listen(stack: contextlib.AsyncExitStack, end: Endpoint, secret: str) -> list[ReachProblem]:
    """Start the node's listener; the problems that kept it from listening on every port."""
    node = end.node
    argv = [node.spec.python, "-c", LISTEN_SCRIPT, secret, str(LISTENER_LIFETIME_S), *map(str, end.ports)]
    try:
        process = await node.spawn(argv)
    except NODE_GONE as exc:
        return [ReachProblem(node.name, f"{node.name}: cannot start a test listener: {exc}")]
    stack.push_async_callback(_stop, process)
    problems = []
    try:
        async with asyncio.timeout(_START_TIMEOUT_S):
            async for line in process.lines():
                said = json_object(line) or {}
                if said.get("ready"):
                    return problems
                if said.get("status") not in (None, "listening"):
                    problems.append(ReachProblem(node.name, bind_problem(node.name, said)))
    except TimeoutError:
        return [ReachProblem(node.name, f"{node.name}: its test listener did not start within "
                                        f"{_START_TIMEOUT_S:.0f} s; run `homegpu doctor`")]
    stderr = (await process.stderr_text()).strip().splitlines()
    why = stderr[-1] if stderr else "it ended without a word"
    return [ReachProblem(node.name, f"{node.name}: cannot run a test listener with {node.spec.python}: {why}")]


async def _stop(process: RemoteProcess) -> None:
    process.close_stdin()
    with contextlib.suppress(asyncio.TimeoutError, *NODE_GONE):
        await asyncio.wait_for(process.wait(), 5)
    process.terminate()


async def _connect(source: Endpoint, listening: Sequence[Endpoint], secrets_by_node: dict[str, str],
                   timeout: float) -> list[tuple[str, str, dict]]:
    """(source, target node, result) for each port of every other listening node."""
    owner, targets = {}, []
    for end in listening:
        if end.node.name == source.node.name:
            continue
        for port in end.ports:
            targets.append({"host": end.address, "port": port, "secret": secrets_by_node[end.node.name]})
            owner[(end.address, port)] = end.node.name
    if not targets:
        return []
    node = source.node
    argv = [node.spec.python, "-c", CONNECT_SCRIPT, str(timeout), json.dumps(targets)]
    try:
        result = await node.run(argv, timeout=timeout + _START_TIMEOUT_S)
    except NODE_GONE as exc:  # a command past its timeout is one too (CommandTimeout)
        return _none_tested(node.name, targets, owner, f"the test could not run on {node.name}: {cause(exc)}")
    found = (json_object(line) or {} for line in result.stdout.splitlines())
    answered = [said for said in found if (said.get("host"), said.get("port")) in owner]
    if not answered:
        why = (result.stderr.strip().splitlines() or [f"exit status {result.exit_status}"])[-1]
        return _none_tested(node.name, targets, owner, f"the test could not run with {node.spec.python}: {why}")
    return [(node.name, owner[(said["host"], said["port"])], said) for said in answered]


def _none_tested(source: str, targets: list[dict], owner: dict, why: str) -> list[tuple[str, str, dict]]:
    """An error result from `source` for every target, when its connect test did not run."""
    return [(source, owner[(t["host"], t["port"])], {"host": t["host"], "port": t["port"], "status": "error",
                                                      "strerror": why}) for t in targets]


def _grouped(results: list[tuple[str, str, dict]], listening: Sequence[Endpoint],
             timeout: float) -> list[ReachProblem]:
    """One problem per target port and cause, naming every node that met it."""
    groups: dict[tuple[str, str, int, str, str], list[str]] = {}
    for source, target, said in results:
        if said["status"] != "ok":
            key = (target, said["host"], said["port"], said["status"], said.get("strerror", ""))
            groups.setdefault(key, []).append(source)
    order = {end.node.name: i for i, end in enumerate(listening)}
    by_node_and_port = sorted(groups, key=lambda key: (order[key[0]], key[2]))
    return [ReachProblem(key[0], describe(", ".join(sorted(groups[key])), *key, timeout)) for key in by_node_and_port]


# What each connect result means and how to fix it; {where} and {allow} are filled in by describe().
_CAUSES = {
    "unresolved": "{sources} cannot resolve {target}'s address {host!r} ({strerror}); set address = "
                  "\"<its LAN IP>\" for {target} in cluster.toml, or make the name resolvable on {sources}",
    "timed out": "{sources} cannot reach {where}: no answer within {timeout:.0f} s, so a firewall on {target} or "
                 "on the way drops it; {allow}, or set {target}'s address in cluster.toml to one {sources} can reach",
    "refused": "{sources} cannot reach {where}: connection refused, so a firewall on {target} rejects it or "
               "{host} is another machine; {allow}, or fix {target}'s address in cluster.toml",
    "unreachable": "{sources} has no route to {target}'s address {host} ({strerror}); set {target}'s address in "
                   "cluster.toml to one on {sources}'s network",
    "other": "{sources} reached {host}:{port} but another program answered, not {target}: {host} is not "
             "{target}'s address as {sources} sees it; set {target}'s address in cluster.toml",
}


def describe(sources: str, target: str, host: str, port: int, status: str, strerror: str = "",
             timeout: float = CONNECT_TIMEOUT_S) -> str:
    """One line: who cannot reach which worker port, the real cause, and the fix."""
    where = f"{target}'s job port {host}:{port}"
    allow = f"open it on {target} (e.g. `sudo ufw allow {port}/tcp`)"
    template = _CAUSES.get(status, "{sources} cannot reach {where}: {reason}")
    return template.format(sources=sources, target=target, host=host, port=port, strerror=strerror,
                           timeout=timeout, where=where, allow=allow, reason=strerror or status)

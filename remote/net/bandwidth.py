"""Bandwidth between nodes with iperf3, and whether the network or the GPUs will set the pace.

The pure half (parsing iperf3's JSON, choosing pairs, the ring all-reduce estimate and the advice)
is table-tested. `measure` runs one iperf3 test per ordered pair of nodes, one pair at a time:
tests run in parallel would share links and under-report each other.

Closing an SSH channel does not stop a remote process that is not writing (a server waiting for
its client, a client with `-J` before its report), so every iperf3 started on a node has its life
bounded on the node itself (`timeout -s KILL`) and is killed by pid on every failure path. A
one-shot server (`-s -1`) also ends by itself after its test.
"""

from __future__ import annotations

import asyncio
import json
import math
import random
from typing import TYPE_CHECKING, AsyncIterator, Callable, Sequence

from homegpu.remote.events import BandwidthMatrix, BandwidthMeasured, LinkResult
from homegpu.remote.net.port_probe import parse_probe, probe_argv
from homegpu.remote.nodes import (
    NODE_GONE, NodeError, NodeOffline, NodeSession, RemoteProcess, TransportError, format_bytes,
)

if TYPE_CHECKING:
    from homegpu.remote.nodes import Cluster

BYTES_PER_PARAM = 4  # float32 gradients
RESNET50_PARAMS = 25_600_000
INSTALL_HINT = "install it (sudo apt install iperf3)"

# sh prints its own pid, then becomes iperf3 (same pid) with the remaining arguments, which are
# passed as separate argv elements: no value is ever interpolated into this script.
_PID_THEN_EXEC = 'echo $$; exec "$@"'
_PORT_ATTEMPTS = 3
_GUESSED_PORTS = (20000, 60000)  # when the node has no python to ask
LINK_TIMEOUT_MARGIN = 10.0  # per link, on top of the test itself
_SERVER_EXIT_GRACE = 2.0  # a one-shot server ends by itself right after its test


class BandwidthError(Exception):
    """One link could not be measured; the message says why, in iperf3's own words when it gave any."""


# -- pure: parsing and results ------------------------------------------------------------------


def parse_iperf3_json(text: str) -> float:
    """Bits per second from `iperf3 -J` output: what the receiver counted, else what was sent.

    iperf3 3.12 exits with status 0 even when the test failed, so its `"error"` field is the
    only reliable sign of failure.

    Raises:
        BandwidthError: with iperf3's own error message, or saying what was wrong with the output.
    """
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        first = text.strip().splitlines()[0] if text.strip() else "nothing"
        raise BandwidthError(f"iperf3 did not print JSON (it printed {first!r})") from None
    if not isinstance(data, dict):
        raise BandwidthError("iperf3 printed JSON that is not an object")
    if data.get("error"):
        raise BandwidthError(str(data["error"]))
    end = data.get("end") if isinstance(data.get("end"), dict) else {}
    for key in ("sum_received", "sum_sent"):
        summary = end.get(key)
        bits = summary.get("bits_per_second") if isinstance(summary, dict) else None
        if isinstance(bits, (int, float)) and not isinstance(bits, bool):
            return float(bits)
    raise BandwidthError("iperf3 reported no throughput (no end.sum_received or end.sum_sent)")


def pairs(names: Sequence[str], star: str | None = None) -> list[tuple[str, str]]:
    """Ordered (src, dst) pairs to test: every one, or with `star` only those to and from that node.

    Both directions are tested because home links are often asymmetric (Wi-Fi, USB adapters).

    Raises:
        ValueError: `star` is not one of `names`.
    """
    if star is None:
        return [(src, dst) for src in names for dst in names if src != dst]
    if star not in names:
        raise ValueError(f"no node named {star!r} (nodes: {', '.join(names)})")
    others = [name for name in names if name != star]
    return [pair for other in others for pair in ((star, other), (other, star))]


def allreduce_seconds(params: int, n_workers: int, gbits: float) -> float:
    """Seconds one ring all-reduce of float32 gradients takes at `gbits`.

    Each worker sends and receives 2·(n−1)/n of the gradient bytes, so the slowest link in the
    ring sets the time. One worker needs no network: 0.
    """
    if n_workers < 2:
        return 0.0
    if gbits <= 0:
        return math.inf
    gradient_bytes = BYTES_PER_PARAM * params
    return 2 * (n_workers - 1) / n_workers * gradient_bytes / (gbits * 1e9 / 8)


def advice(params: int, matrix: BandwidthMatrix, step_compute_seconds: float | None = None) -> str:
    """Plain words on the slowest link, the all-reduce time per step, and who sets the pace.

    The estimate assumes the ring runs over the slowest measured link, which is pessimistic when
    a ring could avoid it but right for the common home case of one slow machine. Nodes none of
    whose links could be measured (offline, say) are not counted as workers.
    """
    slow = matrix.slowest()
    if len(matrix.nodes) < 2:
        return "Fewer than two nodes: no gradients cross the network, so the GPUs set the pace."
    if slow is None:
        return "No link could be measured, so there is no estimate: fix the errors above and measure again."
    n = len(matrix.reachable)
    seconds = allreduce_seconds(params, n, slow.gbits)
    lines = [
        f"Slowest link: {slow.src} → {slow.dst} at {format_gbits(slow.gbits)}.",
        f"A ring all-reduce of {params:,} parameters ({format_bytes(BYTES_PER_PARAM * params)} of "
        f"float32 gradients) across {n} workers takes about {format_duration(seconds)} per step over it.",
        _pace(seconds, step_compute_seconds),
    ]
    return "\n".join(lines)


def _pace(allreduce: float, compute: float | None) -> str:
    if compute is None:
        return (f"If your GPUs compute a step in less than {format_duration(allreduce)}, the network sets "
                "the pace; if they take longer, the GPUs do.")
    if allreduce > compute:
        return (f"Your GPUs compute a step in {format_duration(compute)}, less than that: the network sets "
                f"the pace (steps take up to {(allreduce + compute) / compute:.1f}× the compute time). "
                "A faster link, a larger batch per step or fewer nodes would help.")
    return (f"Your GPUs take {format_duration(compute)} per step, longer than that: the GPUs set the pace; "
            f"the network adds at most {allreduce / compute:.0%} where it cannot overlap the compute.")


def format_gbits(gbits: float, unit: bool = True) -> str:
    """`9.41 Gbit/s`: three significant digits, whole numbers from 100 up."""
    number = f"{gbits:.0f}" if gbits >= 100 else f"{gbits:.3g}"
    return f"{number} Gbit/s" if unit else number


def format_duration(seconds: float) -> str:
    """`4.1 ms`, `109 ms`, `1.79 s`: enough digits to compare with a step time."""
    if math.isinf(seconds):
        return "forever"
    if seconds < 0.01:
        return f"{seconds * 1000:.1f} ms"
    return f"{seconds * 1000:.0f} ms" if seconds < 1 else f"{seconds:.2f} s"


def iperf3_seconds(seconds: float) -> int:
    """The `-t` value: iperf3 reads it as a whole number, and 0 (what "0.5" becomes) means forever."""
    return max(1, math.ceil(seconds))


def link_timeout(seconds: float) -> float:
    """How long one link's test may take: the test itself plus SSH round trips and the server's start."""
    return iperf3_seconds(seconds) + LINK_TIMEOUT_MARGIN


# -- I/O: running the tests on the nodes ----------------------------------------------------------


# Called with (src, dst, None) before a link is measured and (src, dst, result) after it.
LinkCallback = Callable[[str, str, "LinkResult | None"], None]


async def measure(cluster: Cluster, star: str | None = None, seconds: float = 1.0, timeout: float = 15.0,
                  on_link: LinkCallback | None = None) -> BandwidthMatrix:
    """Measure every ordered pair (or, with `star`, the pairs to and from that node), one at a time.

    Args:
        cluster: an entered `Cluster`; nodes that are not online give per-link errors.
        seconds: length of each iperf3 test (whole seconds, at least 1).
        timeout: limit for one link, server start and client included.
    Returns:
        The matrix, also published on `cluster.hub` as `BandwidthMeasured`.
    Raises:
        ValueError: `star` is not a node of the cluster, or `seconds`/`timeout` is not positive.
    """
    if seconds <= 0 or timeout <= 0:
        raise ValueError("seconds and timeout must be greater than 0")
    results = []
    for src, dst in pairs(list(cluster.nodes), star):
        if on_link:
            on_link(src, dst, None)
        result = await measure_link(cluster.nodes[src], cluster.nodes[dst], seconds, timeout)
        results.append(result)
        if on_link:
            on_link(src, dst, result)
    matrix = BandwidthMatrix(tuple(results))
    cluster.hub.publish(BandwidthMeasured(matrix))
    return matrix


async def measure_link(src: NodeSession, dst: NodeSession, seconds: float, timeout: float) -> LinkResult:
    """One iperf3 test from `src` to `dst`; every failure becomes the result's error."""
    started: list[_Iperf3] = []
    gbits = None
    try:
        _require_online(src)
        _require_online(dst)
        async with asyncio.timeout(timeout):
            port = await _start_server(dst, timeout, started)
            bits = await _run_client(src, dst.address, port, seconds, timeout, started)
            gbits = bits / 1e9
        return LinkResult(src.name, dst.name, gbits)
    except TimeoutError:
        error = f"timed out after {timeout:g} s"
    except (BandwidthError, NodeError) as exc:
        error = str(exc)
    except TransportError as exc:
        error = f"connection lost during the test: {exc}"
    finally:
        grace = _SERVER_EXIT_GRACE if gbits is not None else 0.0
        await asyncio.gather(*(process.stop(grace) for process in reversed(started)))
    return LinkResult(src.name, dst.name, None, error)


def _require_online(session: NodeSession) -> None:
    if session.transport is None:
        reason = f": {session.reason}" if session.reason else ""
        raise NodeOffline(session.name, f"{session.name} is {session.state.value}{reason}")


async def _start_server(dst: NodeSession, lifetime: float, started: list[_Iperf3]) -> int:
    """Start a one-shot server on a free port of `dst` and return the port once it listens."""
    address = dst.address
    for _ in range(_PORT_ATTEMPTS):
        port = await _free_port(dst, address, lifetime)
        server = _Iperf3(dst)
        started.append(server)
        await server.start(["-s", "-1", "--forceflush", "-B", address, "-p", str(port)], lifetime)
        async for line in server.lines():
            if "Server listening" in line:
                return port
        error = await server.failure()
        if "Address already in use" not in str(error):
            raise error
    raise BandwidthError(f"no free port for the iperf3 server on {dst.name} after {_PORT_ATTEMPTS} tries")


async def _free_port(session: NodeSession, address: str, timeout: float) -> int:
    """A port free on `address`, asked of the node's python (within the link's `timeout`: on a busy node its
    start may be most of it); a guess when it has none."""
    try:
        result = await session.run(probe_argv(session.spec.python, address, [0]), timeout=timeout)
    except NODE_GONE as exc:
        raise BandwidthError(f"lost {session.name} while choosing a port: {exc}") from None
    for bind in parse_probe(result.stdout):
        if bind.get("status") == "free":
            return int(bind["port"])
        if bind.get("status") == "not local":
            raise BandwidthError(f"{address} is not an address of {session.name}: "
                                 f"fix `address` for {session.name} in cluster.toml")
    return random.randint(*_GUESSED_PORTS)  # a taken port is retried by the caller


async def _run_client(src: NodeSession, server_address: str, port: int, seconds: float, lifetime: float,
                      started: list[_Iperf3]) -> float:
    client = _Iperf3(src)
    started.append(client)
    await client.start(["-c", server_address, "-p", str(port), "-B", src.address,
                        "-J", "-t", str(iperf3_seconds(seconds))], lifetime)
    text = "\n".join([line async for line in client.lines()])
    if not text.strip():
        raise await client.failure()
    return parse_iperf3_json(text)


class _Iperf3:
    """One iperf3 on a node, started so that it can always be stopped, and by nothing else.

    argv: `timeout -s KILL N sh -c 'echo $$; exec "$@"' sh iperf3 ARGS...`. The node's own
    `timeout` ends it even if we vanish; the first stdout line is iperf3's pid, for `kill`.
    """

    def __init__(self, session: NodeSession) -> None:
        self.session = session
        self.process: RemoteProcess | None = None
        self.pid: int | None = None
        self._lines: AsyncIterator[str] | None = None
        self._exited = False

    async def start(self, args: Sequence[str], lifetime: float) -> None:
        """Start iperf3 with `args`; raises BandwidthError when it cannot run at all."""
        _require_online(self.session)
        argv = ["timeout", "-s", "KILL", str(math.ceil(lifetime) + 2),
                "sh", "-c", _PID_THEN_EXEC, "sh", "iperf3", *args]
        try:
            self.process = await self.session.spawn(argv)
        except NODE_GONE as exc:
            raise BandwidthError(f"cannot start iperf3 on {self.session.name}: {exc}") from None
        self._lines = self.process.lines().__aiter__()
        first = await anext(self._lines, None)
        if first is None or not first.strip().isdigit():
            raise await self.failure()
        self.pid = int(first)

    async def lines(self) -> AsyncIterator[str]:
        """The rest of its stdout, until it ends."""
        async for line in self._lines:
            yield line

    async def failure(self) -> BandwidthError:
        """Why it ended without doing its job, from its exit status and stderr."""
        # stderr first: asyncssh's wait() drains what is left of stderr into a result we never see
        stderr = (await self.process.stderr_text()).strip()
        status = await self.process.wait()
        self._exited = True
        return describe_failure(self.session.name, status, stderr)

    async def stop(self, grace: float) -> None:
        """Let it end by itself within `grace` s, else kill it by pid; then drop the channel."""
        if self.process is None:
            return
        try:
            if not self._exited and not await self._ends_within(grace) and self.pid is not None:
                await self.session.run(["kill", "-s", "KILL", str(self.pid)], timeout=5)
                await self._ends_within(5)
        except (*NODE_GONE, asyncio.TimeoutError):
            pass  # the node's own `timeout -s KILL` still ends it
        finally:
            self.process.terminate()

    async def _ends_within(self, seconds: float) -> bool:
        try:
            await asyncio.wait_for(self.process.wait(), seconds)
        except asyncio.TimeoutError:
            return False
        self._exited = True
        return True


def describe_failure(node: str, status: int | None, stderr: str) -> BandwidthError:
    """A one-line reason for an iperf3 (or its `timeout` wrapper) that ended early on `node`.

    127 is "command not found" both from the shell (no `timeout`) and from `exec` (no iperf3).
    """
    if status == 127 and "timeout" in stderr and "iperf3" not in stderr:
        return BandwidthError(f"`timeout` (GNU coreutils) is not installed on {node}: install coreutils")
    if status == 127:
        return BandwidthError(f"iperf3 is not installed on {node}: {INSTALL_HINT}")
    said = [line for line in stderr.splitlines() if line.strip() and line.strip() != "iperf3: exiting"]
    if said:
        reason = said[-1].strip().removeprefix("iperf3: error - ")
    elif status is not None:
        reason = f"exit status {status}"
    else:
        reason = "the connection ended without an exit status"
    return BandwidthError(f"iperf3 on {node} failed: {reason}")

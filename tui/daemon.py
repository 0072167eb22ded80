"""serve's wiring: homegpu that stays on, one process with a session to every node and the services on it.

`serve()` starts them in order, each entered on one AsyncExitStack, so whatever fails to start (a port in
use, the queue's socket) closes every one started before it, in reverse order, and Ctrl-C or SIGTERM closes
them all the same way. First of all it claims its cluster (remote/queue/claim.py), so a second serve of the
same cluster file is refused before it opens the history, the queue or any SSH session; the metrics port is
bound before the nodes are reached, for the same reason. The command line (`homegpu serve`) is
tui/cli/serve.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, TextIO

from homegpu.remote.alerts import AlertWatcher
from homegpu.remote.config import ClusterSpec
from homegpu.remote.history import DEFAULT_MAX_BYTES, HistoryError, HistoryRecorder, history_path
from homegpu.remote.nodes import Cluster
from homegpu.remote.plan import job_node_specs
from homegpu.remote.sleep_wake import IdleSleeper
from homegpu.remote.queue import (
    EntryState, QueueError, QueueRunner, QueueServer, QueueStore, ServeClaim, queue_path, socket_path,
)
from homegpu.remote.serve import ClusterCollector, JobBoard, MetricsEndpoint, RunFollower
from homegpu.tui.errors import UserError

if TYPE_CHECKING:
    from homegpu.tui.web.server import Listen


@dataclass(frozen=True)
class WebOptions:
    """What the web view needs: the cluster options its apps get, where it listens, its token."""

    cluster_options: list[str]
    listen: Listen
    token: str


@dataclass(frozen=True)
class ServeOptions:
    """Where serve listens and keeps what it records."""

    host: str
    metrics_port: int
    experiments: Path
    web: WebOptions | None = None
    history_bytes: int | None = None


async def serve(spec: ClusterSpec, options: ServeOptions, out: TextIO | None = None) -> int:
    """Serve until SIGINT or SIGTERM; the process's exit status. Raises UserError when a service cannot
    start, after closing every one started before it."""
    out = out or sys.stdout

    def say(line: str) -> None:  # what goes wrong while serve runs (a full disk), and when it is right again
        print(f"homegpu serve: {line}", file=out, flush=True)

    async with contextlib.AsyncExitStack() as services:
        _claim(services, spec)
        stop = _stop_on_signals(services)
        recorder = _open_history(spec, options.history_bytes, say)
        services.callback(recorder.close)
        store = _open_queue_store(spec)
        services.callback(store.close)
        cluster, board = Cluster(spec), JobBoard()
        endpoint = MetricsEndpoint(ClusterCollector(cluster, board, recorder.energy_totals), options.host,
                                   options.metrics_port)
        services.push_async_callback(endpoint.close)
        metrics_url = await _start_metrics(endpoint, options.host, options.metrics_port)
        alerts = AlertWatcher(spec, cluster.hub, say=say)
        services.push_async_callback(alerts.close)
        alerts.start()  # before the nodes start: no event goes unwatched
        await services.enter_async_context(cluster)
        services.push_async_callback(alerts.close)  # again, so that it ends before the nodes' sessions
        recorder.follow(cluster)  # subscribed before the first event, so the history misses none
        services.push_async_callback(recorder.stop)  # before the sessions close: their end is no offline spell
        events = services.enter_context(cluster.subscribe())
        services.callback(asyncio.create_task(_feed(events, board), name="job board").cancel)
        runner = QueueRunner(cluster, store, options.experiments, say=say)
        services.push_async_callback(runner.close)
        runner.start()  # before the follower: a run of the queue's is resumed, never followed as a stranger's
        sleeper = IdleSleeper(cluster, lambda: nodes_in_use(spec, board, store), say)
        services.push_async_callback(sleeper.close)
        sleeper.start()
        follower = RunFollower(cluster, ours=runner.owns)  # the jobs of the cluster file as it is at each look
        services.push_async_callback(follower.close)
        follower.start()
        queue = QueueServer(socket_path(spec), runner.desk)
        services.push_async_callback(queue.close)
        await _listen(queue)
        web_url = await _start_web(services, spec, options.web)
        print(f"homegpu serve: {spec.name}, {len(spec.nodes)} node(s); Ctrl-C or SIGTERM stops it", file=out)
        print(f"metrics: {metrics_url}", file=out)
        if web_url:
            print(f"web: {web_url}", file=out)
        print(f"history: {recorder.path} (homegpu history reads it)", file=out)
        print(f"queue: {queue.path} (homegpu submit, queue and cancel reach it; entries kept in {store.path})",
              file=out, flush=True)
        await stop.wait()
    return 0


def _stop_on_signals(services: contextlib.AsyncExitStack) -> asyncio.Event:
    """An event set by SIGINT or SIGTERM (a systemd stop), while serve runs."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
        services.callback(loop.remove_signal_handler, sig)
    return stop


def _claim(services: contextlib.AsyncExitStack, spec: ClusterSpec) -> None:
    """Hold the cluster's claim while serve runs (one serve per cluster file)."""
    try:
        services.enter_context(ServeClaim(socket_path(spec).parent))
    except QueueError as exc:
        raise UserError(str(exc)) from None


def _open_history(spec: ClusterSpec, max_bytes: int | None, say: Callable[[str], None]) -> HistoryRecorder:
    # a sample stands for at most 3 stats intervals of GPU time (an agent that stalled)
    try:
        return HistoryRecorder(history_path(spec), max_bytes or DEFAULT_MAX_BYTES,
                               max_gap=max(10.0, 3 * spec.stats_interval), say=say)
    except HistoryError as exc:  # damaged (it says how to move it aside), or not writable
        raise UserError(str(exc)) from None


def _open_queue_store(spec: ClusterSpec) -> QueueStore:
    try:
        return QueueStore(queue_path(spec))
    except QueueError as exc:
        raise UserError(str(exc)) from None


async def _start_metrics(endpoint: MetricsEndpoint, host: str, port: int) -> str:
    try:
        return await endpoint.start()
    except OSError as exc:
        raise UserError(f"cannot serve metrics on {host}:{port}: {exc.strerror or exc}; pick another with "
                        "--metrics-port (0: any free port) or stop what holds it") from None


async def _listen(queue: QueueServer) -> None:
    try:
        await queue.start()
    except QueueError as exc:
        raise UserError(str(exc)) from None


async def _start_web(services: contextlib.AsyncExitStack, spec: ClusterSpec, web: WebOptions | None) -> str:
    """The web view's address, or "" without --web."""
    if web is None:
        return ""
    from homegpu.tui.web.server import start_web  # aiohttp's app and textual-serve load only for --web

    view = await start_web(web.cluster_options, web.listen, web.token, f"homegpu · cluster {spec.name}")
    services.push_async_callback(view.stop)
    return view.url


async def _feed(events, board: JobBoard) -> None:
    with contextlib.suppress(asyncio.CancelledError):
        async for event in events:
            board.handle(event)


def nodes_in_use(spec: ClusterSpec, board: JobBoard, store: QueueStore) -> dict[str, str]:
    """node -> why work still needs it: a run that is on (it may restart there) or a queue entry not ended."""
    needed: dict[str, str] = {}
    jobs = spec.jobs
    uses = [(run.job, f"run {run.run_id} of {run.job} is on") for run in board.runs.values()]
    uses += [(entry.job, f"{entry.id} ({entry.job}) is {entry.state.value}")
             for entry in store.entries((EntryState.WAITING, EntryState.STARTING, EntryState.RUNNING))]
    for job_name, why in uses:
        job = jobs.get(job_name)
        # a job gone from the file: every node, to be safe
        for node in job_node_specs(spec, job) if job else spec.nodes:
            needed.setdefault(node.name, why)
    return needed

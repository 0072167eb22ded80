"""`homegpu serve`: homegpu that stays on. One process keeps a session to every node, answers Prometheus
at /metrics, follows the runs of the cluster's jobs wherever they were started, raises the [alerts], runs
the queue (`homegpu submit`), and (with --web) shows the terminal UI in a browser. It prints one line per URL it serves, then runs until
Ctrl-C or SIGTERM (a systemd unit: README.md, "Always on").
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ipaddress
import os
import signal
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from typing import TYPE_CHECKING

from homegpu.remote.config import ClusterSpec
from homegpu.tui.cli_common import EXPERIMENTS, WEB_TOKEN_ENV, UserError, load_spec

if TYPE_CHECKING:
    from homegpu.tui.web import Listen

DEFAULT_METRICS_PORT = 9469  # beside node_exporter's 9100 and dcgm-exporter's 9400, and free of both
DEFAULT_WEB_PORT = 8765
LOOPBACK = "127.0.0.1"


def register(commands: argparse._SubParsersAction) -> None:
    serve = commands.add_parser(
        "serve", help="stay on: Prometheus metrics, runs followed, alerts, the queue (and the UI in a browser)",
        description="Keep a session to every node and serve what it sees: Prometheus metrics at /metrics "
                    "(every GPU's utilisation, memory, temperature and power, every node's state, CPU and "
                    "memory, and each running job's epoch, rate, loss and restarts, wherever it was started), and "
                    "run the queue: the runs `homegpu submit` adds start when their nodes' GPUs are free. "
                    "Runs until Ctrl-C or SIGTERM; made to run under systemd (README.md, \"Always on\").",
    )
    serve.add_argument("--metrics-port", type=_port, default=DEFAULT_METRICS_PORT, metavar="PORT",
                       help=f"port of /metrics (default {DEFAULT_METRICS_PORT}; 0: any free port)")
    serve.add_argument("--listen", default=LOOPBACK, metavar="ADDRESS",
                       help="address to serve on (default 127.0.0.1, this machine only; 0.0.0.0: every "
                            f"interface, for a Prometheus on another machine; the web view then needs ${WEB_TOKEN_ENV})")
    serve.add_argument("--history-mib", type=_mib, default=None, metavar="MIB",
                       help="the most the history file may take on disk, in MiB (default 256; the oldest goes first)")
    serve.add_argument("--experiments", type=Path, default=EXPERIMENTS, metavar="DIR",
                       help="where the queue's runs are recorded (default: ./experiments)")
    serve.add_argument("--web", action="store_true",
                       help="also serve the terminal UI to browsers, behind a token (README.md, \"In a browser\")")
    serve.add_argument("--web-port", type=_port, default=DEFAULT_WEB_PORT, metavar="PORT",
                       help=f"port of the web view (default {DEFAULT_WEB_PORT}; 0: any free port)")
    serve.set_defaults(handler=run_serve)


def _port(text: str) -> int:
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number") from None
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{port} is not a port: use 1-65535, or 0 for any free one")
    return port


def _mib(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of MiB") from None
    if value < 1:
        raise argparse.ArgumentTypeError("the history needs at least 1 MiB")
    return value


def run_serve(args: argparse.Namespace) -> int:
    from homegpu.tui.web import Listen, check_token, cluster_args  # aiohttp and textual-serve load only for serve

    spec = load_spec(args)  # a broken cluster file fails here, once, not in every browser session
    _check_address(args.listen)
    web = None
    if args.web:
        listen = Listen(args.listen, args.web_port)
        token = check_token(listen, os.environ.pop(WEB_TOKEN_ENV, None))  # popped: no child inherits it
        web = WebOptions(cluster_args(args), listen, token)
    history_bytes = args.history_mib * 1024 * 1024 if args.history_mib else None
    return asyncio.run(serve(spec, args.listen, args.metrics_port, web, history_bytes, experiments=args.experiments))


@dataclass(frozen=True)
class WebOptions:
    """What the web view needs: the cluster options its apps get, where it listens, its token."""

    cluster_options: list[str]
    listen: Listen
    token: str


def _check_address(address: str) -> None:
    try:
        ipaddress.ip_address(address)
    except ValueError:
        raise UserError(f"--listen {address!r} is not an IP address of this machine; use one such as "
                        "127.0.0.1 or 0.0.0.0") from None


async def serve(spec: ClusterSpec, host: str, metrics_port: int, web: WebOptions | None = None,
                history_bytes: int | None = None, out: TextIO | None = None,
                experiments: Path = EXPERIMENTS) -> int:
    """Serve until SIGINT or SIGTERM; the process's exit status."""
    from homegpu.remote.alerts import AlertWatcher
    from homegpu.remote.history import DEFAULT_MAX_BYTES, HistoryError, HistoryRecorder, history_path
    from homegpu.remote.nodes import Cluster
    from homegpu.remote.queue import QueueError, QueueRunner, QueueServer, QueueStore, queue_path, socket_path
    from homegpu.remote.serve import ClusterCollector, JobBoard, MetricsEndpoint, RunFollower
    from homegpu.tui.web import start_web

    out = out or sys.stdout
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    path = history_path(spec)
    try:  # a sample stands for at most 3 stats intervals of GPU time (an agent that stalled)
        recorder = HistoryRecorder(path, history_bytes or DEFAULT_MAX_BYTES, max_gap=max(10.0, 3 * spec.stats_interval))
    except HistoryError as exc:  # damaged (it says how to move it aside), or not writable
        raise UserError(str(exc)) from None
    try:
        store = QueueStore(queue_path(spec))
    except QueueError as exc:
        recorder.close()
        raise UserError(str(exc)) from None
    cluster, board = Cluster(spec), JobBoard()
    runner = QueueRunner(cluster, store, experiments)
    endpoint = MetricsEndpoint(ClusterCollector(cluster, board), host, metrics_port)
    alerts = AlertWatcher(spec, cluster.hub).start()
    view = None
    async with cluster:
        recorder.follow(cluster)  # subscribed before the first event, so the history misses none
        with cluster.subscribe() as events:
            feeding = asyncio.create_task(_feed(events, board))
            runner.start()  # before the follower: a run of the queue's is resumed, never followed as a stranger's
            follower = RunFollower(cluster, spec.jobs.values(), ours=runner.owns).start()
            queue = QueueServer(socket_path(spec), runner.desk)
            try:
                url = await _start(endpoint, host, metrics_port)
                await _listen(queue)
                if web is not None:
                    view = await start_web(web.cluster_options, web.listen, web.token, f"homegpu · cluster {spec.name}")
                print(f"homegpu serve: {spec.name}, {len(spec.nodes)} node(s); Ctrl-C or SIGTERM stops it", file=out)
                print(f"metrics: {url}", file=out)
                if view is not None:
                    print(f"web: {view.url}", file=out)
                print(f"history: {path} (homegpu history reads it)", file=out)
                print(f"queue: {queue.path} (homegpu submit, queue and cancel reach it; entries kept in "
                      f"{store.path})", file=out, flush=True)
                await stop.wait()
            finally:
                await queue.close()
                await runner.close()
                store.close()
                if view is not None:
                    await view.stop()
                await endpoint.close()
                await follower.close()
                feeding.cancel()
                await recorder.stop()
                await alerts.close()
    return 0


async def _start(endpoint, host: str, port: int) -> str:
    try:
        return await endpoint.start()
    except OSError as exc:
        raise UserError(f"cannot serve metrics on {host}:{port}: {exc.strerror or exc}; pick another with "
                        "--metrics-port (0: any free port) or stop what holds it") from None


async def _listen(queue) -> None:
    from homegpu.remote.queue import QueueError

    try:
        await queue.start()
    except QueueError as exc:
        raise UserError(str(exc)) from None


async def _feed(events, board) -> None:
    with contextlib.suppress(asyncio.CancelledError):
        async for event in events:
            board.handle(event)

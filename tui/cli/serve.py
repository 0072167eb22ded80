"""`homegpu serve`: homegpu that stays on. One process keeps a session to every node, answers Prometheus
at /metrics, follows the runs of the cluster's jobs wherever they were started, raises the [alerts], runs
the queue (`homegpu submit`), and (with --web) shows the terminal UI in a browser. It prints one line per
URL it serves, then runs until Ctrl-C or SIGTERM (a systemd unit: docs/always-on.md).

This module is the command's options; the services and their wiring are tui/daemon.py.
"""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import os
from pathlib import Path

from homegpu.tui.cli.common import EXPERIMENTS, UserError, load_spec
from homegpu.tui.web import WEB_TOKEN_ENV

DEFAULT_METRICS_PORT = 9469  # beside node_exporter's 9100 and dcgm-exporter's 9400, and free of both
DEFAULT_WEB_PORT = 8765
LOOPBACK = "127.0.0.1"


def register(commands: argparse._SubParsersAction) -> None:
    serve = commands.add_parser(
        "serve", help="stay on: metrics, alerts, the queue, the UI in a browser",
        description="Keep a session to every node and serve what it sees: Prometheus metrics at /metrics "
                    "(every GPU's utilisation, memory, temperature and power, every node's state, CPU and "
                    "memory, and each running job's epoch, rate, loss and restarts, wherever it was started), and "
                    "run the queue: the runs `homegpu submit` adds start when their nodes' GPUs are free. "
                    "Runs until Ctrl-C or SIGTERM; made to run under systemd (docs/always-on.md).",
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
                       help="also serve the terminal UI to browsers, behind a token (docs/tui.md, \"In a browser\")")
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
    # serve's services, aiohttp and textual-serve load only for serve
    from homegpu.tui.daemon import ServeOptions, WebOptions, serve
    from homegpu.tui.web.server import Listen, check_token, cluster_args

    spec = load_spec(args)  # a broken cluster file fails here, once, not in every browser session
    _check_address(args.listen)
    web = None
    if args.web:
        listen = Listen(args.listen, args.web_port)
        token = check_token(listen, os.environ.pop(WEB_TOKEN_ENV, None))  # popped: no child inherits it
        web = WebOptions(cluster_args(args), listen, token)
    history_bytes = args.history_mib * 1024 * 1024 if args.history_mib else None
    options = ServeOptions(args.listen, args.metrics_port, args.experiments, web, history_bytes)
    return asyncio.run(serve(spec, options))


def _check_address(address: str) -> None:
    try:
        ipaddress.ip_address(address)
    except ValueError:
        raise UserError(f"--listen {address!r} is not an IP address of this machine; use one such as "
                        "127.0.0.1 or 0.0.0.0") from None

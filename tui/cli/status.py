"""`homegpu status`: each node's state, GPUs, CPU and memory, and the runs recorded here now, once, as JSON, or
watched."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

from homegpu.remote.events import NodeState
from homegpu.remote.nodes import Cluster, NodeSession, connect_wait
from homegpu.remote.record import LiveRun, LiveRuns
from homegpu.tui.cli.common import EXPERIMENTS, load_spec
from homegpu.tui.cli.terminal import unfiltered
from homegpu.tui.view.text import format_status, status_json

CLEAR_SCREEN = "\x1b[H\x1b[2J"

JSON_HELP = """\
--json prints one JSON object (with --watch: one per line, every interval):
  {"cluster": NAME, "at": UNIX_TIME,
   "nodes": [{"name", "host", "state", "reason", "fingerprint",
              "stats": null | {"source": "nvml"|"nvidia-smi"|"none", "driver", "cuda",
                               "cpu": %, "load": [1m, 5m, 15m], "mem_used": MiB, "mem_total": MiB,
                               "disk_free": MiB,
                               "gpus": [{"index", "name", "uuid", "util": %, "mem_used": MiB,
                                         "mem_total": MiB, "temp": C, "power": W,
                                         "power_limit": W, "sm_clock": MHz,
                                         "throttle": null | [REASON, ...],
                                         "clocks": {"sm", "sm_max", "mem", "mem_max"}: MHz,
                                         "pcie": {"gen", "width", "max_gen", "max_width",
                                                  "gpu_max_gen", "gpu_max_width", "tx_mbs", "rx_mbs"},
                                         "xid": null | {"count", "last", "last_at"},
                                         "bus_id",
                                         "held_back": [SENTENCE, ...],
                                         "processes": [{"pid", "name", "mem": MiB,
                                                        "owner": null | OWNER}]}]}}],
   "runs": [{"run_id", "workers": [{"worker": LABEL, "rank", "epoch", "epochs", "examples_per_sec",
                                    "share", "global_batch", "step_seconds", "compute_seconds",
                                    "overhead_seconds", "wait_seconds"}]}]}
REASON is an active clock event reason: gpu_idle, applications_clocks, sw_power_cap, hw_slowdown,
sync_boost, sw_thermal, hw_thermal, hw_power_brake, display_clocks, board_limit, reliability
(throttle null: not known; [] none). pcie's max_gen and max_width are what the card and its slot
can do together, gpu_max_gen and gpu_max_width the card alone, tx_mbs and rx_mbs the MB/s the GPU
sends and receives over it (NVML only). xid is the XID errors the NVIDIA driver logged for the GPU
since boot, the last one's code and unix time (null where the node's user cannot read the kernel
log). held_back says, under load, what slows the GPU down and the fix, and names an XID logged in
the last hour whatever the load (empty when nothing does): once, every clock event reason active in
the one reading; with --watch, a reason held a few seconds, with since when (as the TUI says it).
With --watch a node's first object may carry "health_pending": true in its stats: its GPUs' throttle,
clocks, pcie and xid come with the next one, an interval later (the first screen waits for no slow query).
OWNER is who the process belongs to, as the node's agent found out:
  {"kind": "worker", "run_id", "job", "index", "user", "uid"}     a homegpu worker (or its child)
  {"kind": "container", "container", "container_name", "user", "uid"}  another container
  {"kind": "process", "user", "uid"}                               any other user's process
  {"kind": "unknown"}                                              not visible to the agent
(keys it could not find are null). A value the node cannot report is null. state is one of:
connecting, online, offline, auth failed, host key unknown, host key changed, asleep (homegpu put it
to sleep: `homegpu wake NODE`, or work that needs it, wakes it).
runs are the runs a homegpu on this machine records now under --experiments (`homegpu run`, the TUI or
serve in this folder: their metrics.jsonl, read as it grows; one taken up again after it was left shows
within 10 s), each worker (LABEL as in the run's logs) with its latest epoch line. In a balanced run
(balance = "speed", one replica a worker) share is the worker's examples of a step of global_batch, and
its step_seconds is compute_seconds (its share at its speed) + overhead_seconds (its update and input)
+ wait_seconds (for the others, and the all-reduce over the link); otherwise they are null. workers is
[] until the first epoch ends; a run that ended is not listed."""


def register(commands: argparse._SubParsersAction) -> None:
    status = commands.add_parser(
        "status", help="show every node's state, GPUs, CPU and memory",
        description="Connect to every node in parallel and show its state, each GPU's utilisation, "
                    "memory, temperature and power, and CPU and memory; then the runs a homegpu on this "
                    "machine records now under --experiments (a `homegpu run` in this folder, say), each "
                    "worker's latest epoch with, in a balanced run, its share of a step and its step in parts "
                    "(compute, besides, waiting). Exit status 1 when a node is "
                    "not online (one homegpu put to sleep is no fault).",
        epilog=JSON_HELP,
    )
    status.add_argument("--json", action="store_true", help="print JSON for scripts (format below)")
    status.add_argument("--watch", action="store_true", help="keep updating until Ctrl-C")
    status.add_argument("--experiments", type=Path, default=EXPERIMENTS, metavar="DIR",
                        help="where the runs shown are recorded (default: ./experiments)")
    status.set_defaults(handler=run_status)


def run_status(args: argparse.Namespace) -> int:
    spec = load_spec(args)
    return asyncio.run(_status(spec, args.json, args.watch, LiveRuns(args.experiments)))


async def _status(spec, as_json: bool, watch: bool, runs: LiveRuns) -> int:
    async with Cluster(spec, light_first=watch) as cluster:  # one snapshot shows GPU health on the first line
        await cluster.wait_settled(timeout=connect_wait(spec, 3 * spec.stats_interval + 2))
        while True:
            nodes = list(cluster.nodes.values())
            _show(spec.name, nodes, runs.read(), as_json, watch)
            if not watch:
                return 0 if all(node.state in (NodeState.ONLINE, NodeState.ASLEEP) for node in nodes) else 1
            await asyncio.sleep(spec.stats_interval)


def _show(name: str, nodes: list[NodeSession], runs: list[LiveRun], as_json: bool, watch: bool) -> None:
    if as_json:
        print(json.dumps(status_json(name, nodes, time.time(), watch, runs)), flush=True)
        return
    screen = format_status(nodes, watch, runs)
    if watch and sys.stdout.isatty():
        unfiltered(sys.stdout).write(CLEAR_SCREEN)  # the one escape homegpu sends itself
        screen = time.strftime("%H:%M:%S  ") + f"cluster {name} (Ctrl-C to quit)\n\n" + screen
    print(screen, flush=True)

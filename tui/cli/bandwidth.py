"""`homegpu bandwidth`: iperf3 between the nodes, a matrix in Gbit/s, and what it means for training."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from typing import Sequence

from homegpu.remote.events import BandwidthMatrix, LinkResult
from homegpu.remote.net import RESNET50_PARAMS, advice, bandwidth_store, format_gbits, link_timeout, links_json, measure
from homegpu.remote.nodes import Cluster, connect_wait
from homegpu.tui.cli.common import UserError, load_spec
from homegpu.tui.view.text import format_matrix


JSON_HELP = """\
--json prints one JSON object and nothing else:
  {"at": UNIX_TIME, "links": [{"src", "dst", "gbits": number | null, "error": ""}], "advice": TEXT}
gbits is 10^9 bits per second as the receiver counted them; error is empty when the link was measured.
Exit status 1 when any link could not be measured."""


def register(commands: argparse._SubParsersAction) -> None:
    bandwidth = commands.add_parser(
        "bandwidth", help="measure the network between the nodes with iperf3",
        description="Run iperf3 between every ordered pair of nodes (one pair at a time, so tests do "
                    "not share links), over each node's cluster address. Print the matrix in Gbit/s "
                    "and estimate how long a ring all-reduce of the model's gradients takes per step, "
                    "to tell whether the network or the GPUs will set the pace. Needs iperf3 on "
                    "every node (sudo apt install iperf3).",
        epilog=JSON_HELP,
    )
    bandwidth.add_argument("--json", action="store_true", help="print JSON for scripts (format below)")
    bandwidth.add_argument("--star", metavar="NODE",
                           help="only measure to and from NODE (2·(n−1) tests instead of n·(n−1))")
    bandwidth.add_argument("--seconds", type=float, default=1.0, metavar="S",
                           help="length of each test; iperf3 takes whole seconds (default: 1)")
    bandwidth.add_argument("--params", type=int, default=RESNET50_PARAMS, metavar="N",
                           help=f"your model's parameter count, for the all-reduce estimate "
                                f"(default: {RESNET50_PARAMS:,}, ResNet-50's size)")
    bandwidth.add_argument("--step-seconds", type=float, metavar="S",
                           help="your GPUs' compute time per step, if you know it: the advice then "
                                "says which of the two sets the pace")
    bandwidth.set_defaults(handler=run_bandwidth)


def run_bandwidth(args: argparse.Namespace) -> int:
    spec = load_spec(args)
    names = [node.name for node in spec.nodes]
    _check_args(args, names)
    if len(names) < 2:
        print(f"{spec.source} has one node ({names[0]}): there is no link to measure.")
        return 0
    matrix = asyncio.run(_measure(spec, args))
    text = advice(args.params, matrix, args.step_seconds)
    if args.json:
        print(json.dumps(matrix_json(matrix, text)))
    else:
        print(format_matrix(matrix, names))
        print()
        print(text)
    return 1 if matrix.failed else 0


def _check_args(args: argparse.Namespace, names: Sequence[str]) -> None:
    if args.star is not None and args.star not in names:
        raise UserError(f"--star {args.star!r}: no such node (nodes: {', '.join(names)})")
    if args.seconds <= 0:
        raise UserError(f"--seconds {args.seconds:g}: must be greater than 0")
    if args.params <= 0:
        raise UserError(f"--params {args.params}: must be greater than 0")
    if args.step_seconds is not None and args.step_seconds <= 0:
        raise UserError(f"--step-seconds {args.step_seconds:g}: must be greater than 0")


async def _measure(spec, args: argparse.Namespace) -> BandwidthMatrix:
    progress = None if args.json else print_progress
    async with Cluster(spec, stream_stats=False) as cluster:
        await cluster.wait_settled(connect_wait(spec, 2))
        matrix = await measure(cluster, star=args.star, seconds=args.seconds,
                               timeout=link_timeout(args.seconds), on_link=progress)
    bandwidth_store.save(spec, matrix)  # the TUI opens with it
    return matrix


def print_progress(src: str, dst: str, result: LinkResult | None) -> None:
    """`desktop → laptop ... 9.41 Gbit/s` on stderr, the first half before the test starts."""
    if result is None:
        print(f"{src} → {dst} ... ", end="", file=sys.stderr, flush=True)
    else:
        print(format_gbits(result.gbits) if result.ok else f"error: {result.error}", file=sys.stderr, flush=True)


def matrix_json(matrix: BandwidthMatrix, advice_text: str) -> dict:
    """What `--json` prints (see JSON_HELP)."""
    return {"at": matrix.at, "links": links_json(matrix), "advice": advice_text}

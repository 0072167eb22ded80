"""`homegpu doctor`: check every node for what training needs and print how to fix each gap."""

from __future__ import annotations

import argparse
import asyncio
import json
import textwrap
from typing import Sequence

from homegpu.remote.config import DEFAULT_JOB_PORT, ClusterSpec
from homegpu.remote.doctor import CHECK_NAMES, Check, diagnose
from homegpu.remote.nodes import Cluster
from homegpu.tui.cli.common import load_spec
from homegpu.tui.view.text import format_report

JSON_HELP = f"""\
--json prints one JSON object:
  {{"cluster": NAME, "ok": true|false,
   "checks": [{{"node", "name", "ok": true|false|null, "detail", "fix"}}]}}
ok null means not applicable (or skipped because the node is not reachable).
{textwrap.fill(f"Checks per node, in order: {', '.join(CHECK_NAMES)}.", 100)}"""


def register(commands: argparse._SubParsersAction) -> None:
    doctor = commands.add_parser(
        "doctor", help="check every node for what training needs, with fixes",
        description="Connect to every node in parallel and check SSH, host key, Python, Docker and the "
                    "NVIDIA container runtime, GPUs (NVML against nvidia-smi), each GPU's PCIe link under a "
                    "short load of its own, iperf3, free disk, clock "
                    "skew, the job port and whether the node's address is public. Each problem comes with "
                    "one sentence saying how to fix it. Exit status 1 when any check fails.",
        epilog=JSON_HELP,
    )
    doctor.add_argument("--json", action="store_true", help="print JSON for scripts (format below)")
    doctor.add_argument("--port", type=int, metavar="N",
                        help="job port to test on each node's cluster address (default: the first job's "
                             f"port in cluster.toml, else {DEFAULT_JOB_PORT})")
    doctor.set_defaults(handler=run_doctor)


def run_doctor(args: argparse.Namespace) -> int:
    spec = load_spec(args)
    checks = asyncio.run(_doctor(spec, args.port or job_port(spec)))
    print(json.dumps(doctor_json(spec.name, checks)) if args.json else format_report(spec, checks), flush=True)
    return 1 if any(check.ok is False for check in checks) else 0


def job_port(spec: ClusterSpec) -> int:
    """The port a job would use: the first job's (by name), else TensorFlow's usual default."""
    return spec.jobs[min(spec.jobs)].port if spec.jobs else DEFAULT_JOB_PORT


async def _doctor(spec: ClusterSpec, port: int) -> list[Check]:
    async with Cluster(spec, stream_stats=False) as cluster:
        return await diagnose(cluster, port)


def doctor_json(cluster: str, checks: Sequence[Check]) -> dict:
    return {
        "cluster": cluster,
        "ok": not any(check.ok is False for check in checks),
        "checks": [{"node": c.node, "name": c.name, "ok": c.ok, "detail": c.detail, "fix": c.fix} for c in checks],
    }

"""Node layer benchmarks against real sshd nodes on 127.0.0.x. Prints ratios; asserts nothing.

Run as root (it starts sshd servers):  .venv/bin/python tests/benchmarks/bench_nodes.py

1. Time to the first full snapshot (every node online with stats) for N = 1, 4, 8, 16 nodes, against
   a sequential `ssh node <stats command>` loop over the same nodes (the same agent, run --once).
2. Steady state at 1 Hz over 16 nodes: CPU of this controller per node, and the whole machine's CPU
   (controller + sshd + agents: every node is on this machine), against polling by running
   `ssh node nvidia-smi ...` every second (a replaying nvidia-smi on the nodes' PATH, recorded on
   real GPUs, stands in for the driver's; a real one costs more CPU, so the baseline is flattering).
"""

from __future__ import annotations

import asyncio
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(TESTS))

from gpu_replay import APP_QUERY, FORMAT, GPU_QUERY, write_replay_nvidia_smi  # noqa: E402
from simcluster import SimCluster  # noqa: E402

from homegpu.remote import stats_agent  # noqa: E402
from homegpu.remote.cluster import Cluster  # noqa: E402
from homegpu.remote.config import load_cluster  # noqa: E402

FIXTURES = TESTS / "fixtures" / "gpu"
SIZES = (1, 4, 8, 16)
STEADY_SECONDS = 10.0


def machine_cpu_seconds() -> float:
    """Busy CPU seconds of the whole machine so far (all cores), from /proc/stat."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


async def first_snapshot_seconds(config: Path, nodes: int) -> float:
    spec = load_cluster(config)
    spec = type(spec)(**{**spec.__dict__, "nodes": spec.nodes[:nodes]})
    start = time.perf_counter()
    async with Cluster(spec) as cluster:
        await cluster.wait_settled(timeout=60)
        elapsed = time.perf_counter() - start
        assert all(n.latest is not None for n in cluster.nodes.values()), "a node did not report"
    return elapsed


def sequential_ssh_seconds(sim: SimCluster, nodes: int) -> float:
    agent = Path(stats_agent.__file__)
    start = time.perf_counter()
    for node in sim.nodes[:nodes]:
        subprocess.run(sim.ssh_argv(node, "python3", str(agent), "--once", "--work-dir", "/tmp"),
                       check=True, capture_output=True)
    return time.perf_counter() - start


async def steady_agents(config: Path) -> tuple[float, float]:
    """(controller CPU s, machine CPU s) over STEADY_SECONDS with every node streaming."""
    async with Cluster(load_cluster(config)) as cluster:
        await cluster.wait_settled(timeout=60)
        await asyncio.sleep(2)  # let start-up work settle
        own, machine = time.process_time(), machine_cpu_seconds()
        await asyncio.sleep(STEADY_SECONDS)
        return time.process_time() - own, machine_cpu_seconds() - machine


def steady_polling(sim: SimCluster) -> float:
    """Machine CPU s over STEADY_SECONDS polling every node with ssh + nvidia-smi once a second."""
    machine = machine_cpu_seconds()
    deadline = time.monotonic() + STEADY_SECONDS
    while time.monotonic() < deadline:
        tick = time.monotonic()
        procs = [subprocess.Popen(sim.ssh_argv(node, "nvidia-smi", GPU_QUERY, FORMAT),
                                  stdout=subprocess.DEVNULL) for node in sim.nodes]
        for proc in procs:
            proc.wait()
        time.sleep(max(0.0, 1.0 - (time.monotonic() - tick)))
    return machine_cpu_seconds() - machine


def main() -> None:
    biggest = max(SIZES)
    replay = [f"node{i}" for i in range(1, biggest + 1)]
    with SimCluster(biggest, first_host=100, extra_path_nodes=replay) as sim:
        for node in sim.nodes:
            write_replay_nvidia_smi(node.extra_path, FIXTURES / "gpus_2x_h100nvl_idle.csv",
                                    FIXTURES / "apps_none.csv")
        config = sim.write_cluster_toml(Path(tempfile.mkdtemp()) / "cluster.toml")
        print(f"homegpu node benchmarks, {platform.node()}, {os.cpu_count()} cores, "
              f"{time.strftime('%Y-%m-%d')}\n")
        print("time to first full snapshot (s)")
        print(f"  {'nodes':>5}  {'homegpu':>8}  {'ssh loop':>8}  {'loop/homegpu':>12}  {'vs 1 node':>9}")
        one = None
        for size in SIZES:
            ours = min(asyncio.run(first_snapshot_seconds(config, size)) for _ in range(3))
            loop = sequential_ssh_seconds(sim, size)
            one = one or ours
            print(f"  {size:>5}  {ours:8.3f}  {loop:8.3f}  {loop / ours:11.1f}x  {ours / one:8.2f}x")

        controller, machine_agents = asyncio.run(steady_agents(config))
        machine_polling = steady_polling(sim)
        n = len(sim.nodes)
        print(f"\nsteady state at 1 Hz, {n} nodes, {STEADY_SECONDS:g} s")
        print(f"  controller CPU per node:       {100 * controller / STEADY_SECONDS / n:6.3f} % of a core")
        print(f"  machine CPU, agents:           {100 * machine_agents / STEADY_SECONDS:6.2f} % of a core")
        print(f"  machine CPU, ssh+nvidia-smi:   {100 * machine_polling / STEADY_SECONDS:6.2f} % of a core")
        print(f"  agents / polling:              {machine_agents / machine_polling:6.3f}")


if __name__ == "__main__":
    main()

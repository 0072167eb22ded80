"""Node layer benchmarks on the simulated LAN (tests/simcluster.py: every node a network namespace
with its own sshd on 10.213.0.N:22, links shaped to 1 Gbit/s). Prints figures and ratios; asserts
nothing.

Run as root (it starts sshd servers):  .venv/bin/python tests/benchmarks/bench_nodes.py [PART ...]
with PART among bandwidth, snapshot, steady (default: all). The agent's own CPU per sample is
bench_agent.py's.

1. bandwidth: `homegpu bandwidth` over 4 nodes (iperf3 between every ordered pair), the matrix and
   the all-reduce advice for the demo's CNN and for ResNet-50.
2. snapshot: time from connecting to the first full snapshot (every node online with stats) for
   N = 1, 4, 8, 16 nodes, against a sequential `ssh ALIAS <stats command>` loop over the same nodes
   through their ssh config aliases (the same agent, run --once).
3. steady: steady state at 1 Hz over 16 nodes: CPU of this controller per node, and all the CPU of
   the controller and of the nodes' processes (sshd, agents, nvidia-smi; counted per process tree,
   so other work on this machine is left out), against polling by
   running `ssh ALIAS nvidia-smi ...` every second (a replaying nvidia-smi on the nodes' PATH,
   recorded on real GPUs, stands in for the driver's; a real one costs more CPU, so the baseline is
   flattering).
"""

from __future__ import annotations

import asyncio
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import tomli_w

TESTS = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(TESTS))

from gpu_replay import FORMAT, GPU_QUERY, write_replay_nvidia_smi  # noqa: E402
import simnet  # noqa: E402
from simcluster import SimCluster  # noqa: E402

from helpers import homegpu_argv  # noqa: E402

from homegpu.remote.node_side import stats_agent  # noqa: E402
from homegpu.remote.config.cluster_spec import load_cluster  # noqa: E402
from homegpu.remote.net.bandwidth import RESNET50_PARAMS, advice
from homegpu.remote.events import BandwidthMatrix, LinkResult  # noqa: E402
from homegpu.remote.nodes.cluster import Cluster  # noqa: E402
from homegpu.tui.cli.bandwidth import format_matrix  # noqa: E402

FIXTURES = TESTS / "fixtures" / "gpu"
SIZES = (1, 4, 8, 16)
STEADY_SECONDS = 10.0
BANDWIDTH_NODES = 4
DEMO_PARAMS = 545_098  # the built-in small_cnn on 32×32×3 images, 10 classes (trainer/models.py)

def cluster_cpu_seconds(sim: SimCluster) -> float:
    """CPU seconds so far of this controller (and the children it reaped: ssh clients) and of
    every process of every node (sshd, sessions, agents, nvidia-smi, and what they reaped).

    Only this run's processes count, so other work on the machine does not. A process that ends
    moves its time into its parent's reaped-children fields, so the sum carries across exits
    as long as the parent is a node process (the sshd listener is).
    """
    ticks = os.sysconf("SC_CLK_TCK")
    total = sum(os.times()[:4])
    for pid in sim.pids():
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # ended meanwhile: its parent's reaped-children time has it
        total += sum(int(value) for value in fields[11:15]) / ticks  # utime stime cutime cstime
    return total


async def first_snapshot_seconds(config: Path, nodes: int) -> float:
    spec = load_cluster(config)
    spec = type(spec)(**{**spec.__dict__, "nodes": spec.nodes[:nodes]})
    start = time.perf_counter()
    async with Cluster(spec) as cluster:
        await cluster.wait_settled(timeout=60)
        elapsed = time.perf_counter() - start
        assert all(n.latest is not None for n in cluster.nodes.values()), "a node did not report"
    return elapsed


def ssh_alias_argv(sim: SimCluster, node, *command: str) -> list[str]:
    """`ssh ALIAS command` through the cluster's ssh config, as a user reaches a machine by name."""
    return ["ssh", "-F", str(sim.ssh_config_path), "-o", "BatchMode=yes", node.alias, *command]


def sequential_ssh_seconds(sim: SimCluster, nodes: int) -> float:
    agent = Path(stats_agent.__file__)  # this machine's filesystem is the nodes' too (not ~/.homegpu)
    start = time.perf_counter()
    for node in sim.nodes[:nodes]:
        subprocess.run(ssh_alias_argv(sim, node, "python3", str(agent), "--once", "--work-dir", "/tmp"),
                       check=True, capture_output=True)
    return time.perf_counter() - start


async def steady_agents(sim: SimCluster, config: Path) -> tuple[float, float]:
    """(controller CPU s, cluster CPU s) over STEADY_SECONDS with every node streaming."""
    async with Cluster(load_cluster(config)) as cluster:
        await cluster.wait_settled(timeout=60)
        await asyncio.sleep(2)  # let start-up work settle
        own, machine = time.process_time(), cluster_cpu_seconds(sim)
        await asyncio.sleep(STEADY_SECONDS)
        return time.process_time() - own, cluster_cpu_seconds(sim) - machine


def steady_polling(sim: SimCluster) -> float:
    """Cluster CPU s over STEADY_SECONDS polling every node with ssh + nvidia-smi once a second."""
    machine = cluster_cpu_seconds(sim)
    deadline = time.monotonic() + STEADY_SECONDS
    while time.monotonic() < deadline:
        tick = time.monotonic()
        procs = [subprocess.Popen(ssh_alias_argv(sim, node, "nvidia-smi", GPU_QUERY, FORMAT),
                                  stdout=subprocess.DEVNULL) for node in sim.nodes]
        for proc in procs:
            proc.wait()
        time.sleep(max(0.0, 1.0 - (time.monotonic() - tick)))
    return cluster_cpu_seconds(sim) - machine


def bandwidth_benchmark(sim: SimCluster, root: Path) -> None:
    """`homegpu bandwidth --json` as a user runs it, on the first BANDWIDTH_NODES nodes."""
    data = sim.cluster_dict()
    data["nodes"] = data["nodes"][:BANDWIDTH_NODES]
    config = root / "cluster-bandwidth.toml"
    config.write_text(tomli_w.dumps(data))
    result = subprocess.run(homegpu_argv("--config", str(config), "bandwidth", "--json", "--params", str(DEMO_PARAMS)),
                            capture_output=True, text=True, timeout=600)
    matrix = BandwidthMatrix(tuple(LinkResult(link["src"], link["dst"], link["gbits"], link["error"])
                                   for link in json.loads(result.stdout)["links"]))
    print(f"`homegpu bandwidth` over {BANDWIDTH_NODES} nodes (iperf3, 1 s per ordered pair)")
    print(format_matrix(matrix, [node["name"] for node in data["nodes"]]))
    for label, params in (("demo CNN", DEMO_PARAMS), ("ResNet-50", RESNET50_PARAMS)):
        print(f"\n{label}:\n{advice(params, matrix)}")


def snapshot_benchmark(sim: SimCluster, config: Path) -> None:
    print("\ntime from connecting to the first full snapshot (s)")
    print(f"  {'nodes':>5}  {'homegpu':>8}  {'ssh loop':>8}  {'loop/homegpu':>12}  {'vs 1 node':>9}")
    one = None
    for size in SIZES:
        ours = min(asyncio.run(first_snapshot_seconds(config, size)) for _ in range(3))
        loop = sequential_ssh_seconds(sim, size)
        one = one or ours
        print(f"  {size:>5}  {ours:8.3f}  {loop:8.3f}  {loop / ours:11.1f}x  {ours / one:8.2f}x")


def steady_benchmark(sim: SimCluster, config: Path) -> None:
    controller, machine_agents = asyncio.run(steady_agents(sim, config))
    machine_polling = steady_polling(sim)
    n = len(sim.nodes)
    print(f"\nsteady state at 1 Hz, {n} nodes, {STEADY_SECONDS:g} s")
    print(f"  controller CPU per node:       {100 * controller / STEADY_SECONDS / n:6.3f} % of a core")
    print(f"  all CPU, agents:               {100 * machine_agents / STEADY_SECONDS:6.2f} % of a core")
    print(f"  all CPU, ssh+nvidia-smi:       {100 * machine_polling / STEADY_SECONDS:6.2f} % of a core")
    print(f"  agents / polling:              {machine_agents / machine_polling:6.3f}")


def main() -> None:
    parts = sys.argv[1:] or ["bandwidth", "snapshot", "steady"]
    print(f"homegpu node benchmarks, {platform.node()}, {os.cpu_count()} cores, {time.strftime('%Y-%m-%d')}, "
          f"namespaced nodes on a {simnet.DEFAULT_MBIT} Mbit/s shaped bridge\n")
    root = Path(tempfile.mkdtemp(prefix="homegpu-bench-nodes-"))
    biggest = max(SIZES)
    replay = [f"node{i}" for i in range(1, biggest + 1)]
    with SimCluster(biggest, first_host=160, extra_path_nodes=replay) as sim:
        for node in sim.nodes:
            write_replay_nvidia_smi(node.extra_path, FIXTURES / "gpus_2x_h100nvl_idle.csv",
                                    FIXTURES / "apps_none.csv")
        config = sim.write_cluster_toml(root / "cluster.toml")
        if "bandwidth" in parts:
            bandwidth_benchmark(sim, root)
        if "snapshot" in parts:
            snapshot_benchmark(sim, config)
        if "steady" in parts:
            steady_benchmark(sim, config)


if __name__ == "__main__":
    main()

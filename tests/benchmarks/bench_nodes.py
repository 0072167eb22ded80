"""Node layer benchmarks on the simulated LAN (tests/simcluster.py: every node a network namespace
with its own sshd on 10.213.0.N:22, links shaped to 1 Gbit/s). Prints figures and ratios; asserts
nothing.

Run as root (it starts sshd servers):
    .venv/bin/python tests/benchmarks/bench_nodes.py [PART ...] [--against CHECKOUT [--rounds N]]
with PART among bandwidth, snapshot, steady (default: all). The agent's own CPU per sample is
bench_agent.py's.

`--against CHECKOUT` measures snapshot and steady for this checkout and another one (e.g. `git worktree add
/tmp/before d048569`) on the same nodes, alternating N times (default 3), each in a Python of its own that
imports that checkout's homegpu (with this Python's packages), and prints each figure's runs, medians and
the ratio now / before. Without it, the figures are this checkout's alone, as before.

1. bandwidth: `homegpu bandwidth` over 4 nodes (iperf3 between every ordered pair), the matrix and
   the all-reduce advice for the demo's CNN and for ResNet-50.
2. snapshot: time from connecting to the first screen: every node's first line (a light one, its GPU health
   still to come on the next, counts: the TUI shows it) for N = 1, 4, 8, 16 nodes, against a sequential
   `ssh ALIAS <stats command>` loop over the same nodes through their ssh config aliases (the same agent, run --once).
3. steady: steady state at 1 Hz over 16 nodes: CPU of this controller per node, and all the CPU of
   the controller and of the nodes' processes (sshd, agents, nvidia-smi; counted per process tree,
   so other work on this machine is left out), against polling by
   running `ssh ALIAS nvidia-smi ...` every second (a replaying nvidia-smi on the nodes' PATH,
   recorded on real GPUs, stands in for the driver's; a real one costs more CPU, so the baseline is
   flattering).
"""

from __future__ import annotations

import asyncio
import contextlib
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
from bench_agent import CpuGroup  # noqa: E402

import statistics  # noqa: E402

from homegpu.remote.node_side.agent import stats_agent  # noqa: E402
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

def nodes_group(sim: SimCluster) -> CpuGroup:
    """A cgroup holding every process of the nodes, and so all they start (sessions, agents, nvidia-smi, the command
    relays' detached children): their CPU counted to the nanosecond, ended processes included whoever reaps them,
    where summing /proc's reaped-children fields loses a process whose parent is not a node's (the sums went
    negative once the relay's children were reparented)."""
    group = CpuGroup(f"homegpu-bench-nodes-{os.getpid()}")
    for pid in sim.pids():
        with contextlib.suppress(OSError):
            (group.path / "cgroup.procs").write_text(str(pid))
    return group


def cluster_cpu_seconds(nodes: CpuGroup) -> float:
    """CPU seconds so far of this controller (and the children it reaped: ssh clients) and of every process of
    every node (nodes_group). Only this run's processes count, so other work on the machine does not."""
    return sum(os.times()[:4]) + nodes.used_ns() / 1e9


async def first_snapshot_seconds(config: Path, nodes: int) -> float:
    spec = load_cluster(config)
    spec = type(spec)(**{**spec.__dict__, "nodes": spec.nodes[:nodes]})
    start = time.perf_counter()
    async with Cluster(spec) as cluster:
        await first_lines(cluster)
        return time.perf_counter() - start


async def first_lines(cluster: Cluster) -> None:
    """Until every node has its first line, as the TUI's first screen (not wait_settled: that waits for a line
    with GPU health, which one-shot commands show and the first screen does not wait for)."""
    await asyncio.wait_for(asyncio.gather(*(node.wait_for(lambda n: n.latest is not None)
                                            for node in cluster.nodes.values())), 60)


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


async def steady_agents(nodes: CpuGroup, config: Path) -> tuple[float, float]:
    """(controller CPU s, cluster CPU s) over STEADY_SECONDS with every node streaming."""
    async with Cluster(load_cluster(config)) as cluster:
        await cluster.wait_settled(timeout=60)
        await asyncio.sleep(2)  # let start-up work settle
        own, machine = time.process_time(), cluster_cpu_seconds(nodes)
        await asyncio.sleep(STEADY_SECONDS)
        return time.process_time() - own, cluster_cpu_seconds(nodes) - machine


def steady_polling(sim: SimCluster, nodes: CpuGroup) -> float:
    """Cluster CPU s over STEADY_SECONDS polling every node with ssh + nvidia-smi once a second."""
    machine = cluster_cpu_seconds(nodes)
    deadline = time.monotonic() + STEADY_SECONDS
    while time.monotonic() < deadline:
        tick = time.monotonic()
        procs = [subprocess.Popen(ssh_alias_argv(sim, node, "nvidia-smi", GPU_QUERY, FORMAT),
                                  stdout=subprocess.DEVNULL) for node in sim.nodes]
        for proc in procs:
            proc.wait()
        time.sleep(max(0.0, 1.0 - (time.monotonic() - tick)))
    return cluster_cpu_seconds(nodes) - machine


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
    print("\ntime from connecting to the first screen: every node's first line (s)")
    print(f"  {'nodes':>5}  {'homegpu':>8}  {'ssh loop':>8}  {'loop/homegpu':>12}  {'vs 1 node':>9}")
    one = None
    for size in SIZES:
        ours = min(asyncio.run(first_snapshot_seconds(config, size)) for _ in range(3))
        loop = sequential_ssh_seconds(sim, size)
        one = one or ours
        print(f"  {size:>5}  {ours:8.3f}  {loop:8.3f}  {loop / ours:11.1f}x  {ours / one:8.2f}x")


def steady_benchmark(sim: SimCluster, config: Path, nodes: CpuGroup) -> None:
    controller, machine_agents = asyncio.run(steady_agents(nodes, config))
    machine_polling = steady_polling(sim, nodes)
    n = len(sim.nodes)
    print(f"\nsteady state at 1 Hz, {n} nodes, {STEADY_SECONDS:g} s")
    print(f"  controller CPU per node:       {100 * controller / STEADY_SECONDS / n:6.3f} % of a core")
    print(f"  all CPU, agents:               {100 * machine_agents / STEADY_SECONDS:6.2f} % of a core")
    print(f"  all CPU, ssh+nvidia-smi:       {100 * machine_polling / STEADY_SECONDS:6.2f} % of a core")
    print(f"  agents / polling:              {machine_agents / machine_polling:6.3f}")


# --- side by side with another checkout (--against) ------------------------------------------------------

# Runs in a Python of its own whose `homegpu` is one checkout: `snapshot N` prints its first screen of N nodes (every
# node's first line; cold: nothing read yet) and the best of 2 more (warm: what the process keeps, kept); it uses
# only what every checkout has (NodeSession.wait_for, latest), as it runs against an older one too;
# `steady` connects every node, prints "go" once settled, its own CPU over STEADY_SECONDS, then "done".
CHILD = """
import asyncio, sys, time
from homegpu.remote.config.cluster_spec import load_cluster
from homegpu.remote.nodes.cluster import Cluster
config, part = sys.argv[1], sys.argv[2]
async def first(n):
    spec = load_cluster(config)
    spec = type(spec)(**{**spec.__dict__, "nodes": spec.nodes[:n]})
    start = time.perf_counter()
    async with Cluster(spec) as cluster:
        lines = [node.wait_for(lambda session: session.latest is not None) for node in cluster.nodes.values()]
        await asyncio.wait_for(asyncio.gather(*lines), 60)
        return time.perf_counter() - start
async def steady(seconds):
    async with Cluster(load_cluster(config)) as cluster:
        await cluster.wait_settled(timeout=60)
        await asyncio.sleep(2)
        own = time.process_time()
        print("go", flush=True)
        await asyncio.sleep(seconds)
        print(time.process_time() - own, flush=True)
        print("done", flush=True)
if part == "snapshot":
    cold, *warm = [asyncio.run(first(int(sys.argv[3]))) for _ in range(3)]
    print(cold, min(warm))
else:
    asyncio.run(steady(float(sys.argv[3])))
"""


def checkout_python(checkout: Path, root: Path) -> tuple[list[str], dict[str, str]]:
    """argv and environment of a Python whose `homegpu` is `checkout` (its source, this Python's packages)."""
    folder = root / f"pkg-{abs(hash(str(checkout.resolve())))}"
    if not folder.exists():
        folder.mkdir()
        (folder / "homegpu").symlink_to(checkout.resolve())
    return [sys.executable, "-c", CHILD], {**os.environ, "PYTHONPATH": str(folder)}


def child_snapshot_seconds(checkout: Path, root: Path, config: Path, nodes: int) -> tuple[float, float]:
    """(the cold first screen, the best warm one) of `nodes` nodes by `checkout`'s controller."""
    argv, env = checkout_python(checkout, root)
    done = subprocess.run([*argv, str(config), "snapshot", str(nodes)], env=env, capture_output=True, text=True,
                          timeout=600, check=True)
    cold, warm = done.stdout.split()[-2:]
    return float(cold), float(warm)


def process_tree_cpu(pid: int) -> float:
    """CPU seconds of `pid` and of the children it reaped (utime stime cutime cstime)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return sum(int(value) for value in fields[11:15]) / os.sysconf("SC_CLK_TCK")


def child_steady(checkout: Path, root: Path, config: Path, group: CpuGroup) -> tuple[float, float]:
    """(controller CPU s, all CPU s: the controller's and the nodes') over STEADY_SECONDS, the controller being
    `checkout`'s in a process of its own."""
    argv, env = checkout_python(checkout, root)
    child = subprocess.Popen([*argv, str(config), "steady", str(STEADY_SECONDS)], env=env, stdout=subprocess.PIPE,
                             text=True)
    try:
        assert child.stdout.readline().strip() == "go", "the controller did not settle"
        nodes, controller = group.used_ns() / 1e9, process_tree_cpu(child.pid)
        own = float(child.stdout.readline())
        nodes, controller = group.used_ns() / 1e9 - nodes, process_tree_cpu(child.pid) - controller
        assert child.stdout.readline().strip() == "done"
    finally:
        child.wait(timeout=60)
    return own, controller + nodes


def median_line(label: str, unit: str, runs: dict[str, list[float]]) -> str:
    now, before = (statistics.median(values) for values in runs.values())
    shown = "; ".join(f"{name} {statistics.median(v):.3f} ({', '.join(f'{x:.3f}' for x in v)})"
                      for name, v in runs.items())
    return f"  {label:<34} {shown} {unit}   now / before {now / before:.2f}x"


def side_by_side(sim: SimCluster, config: Path, root: Path, parts: list[str], against: Path, rounds: int,
                 group: CpuGroup) -> None:
    """Each figure for this checkout and `against`, alternating `rounds` times: runs, medians, ratios."""
    checkouts = {"now": TESTS.parent, "before": against}
    figures: dict[str, dict[str, list[float]]] = {}

    def note(figure: str, name: str, value: float) -> None:
        figures.setdefault(figure, {n: [] for n in checkouts})[name].append(value)
    alternate(sim, config, root, parts, checkouts, rounds, group, note)
    print(f"\nside by side: now = {TESTS.parent}, before = {against}; {rounds} alternations, median (runs)")
    for figure, runs in figures.items():
        print(median_line(figure, "s" if figure.startswith("first") else "% of a core", runs))


def alternate(sim: SimCluster, config: Path, root: Path, parts: list[str], checkouts: dict[str, Path], rounds: int,
              group: CpuGroup, note) -> None:
    """Each checkout in turn, `rounds` times: its first snapshots and its steady state, noted by figure."""
    for _ in range(rounds):
        for name, checkout in checkouts.items():
            if "snapshot" in parts:
                for size in SIZES:
                    cold, warm = child_snapshot_seconds(checkout, root, config, size)
                    note(f"first screen, {size} node(s), cold", name, cold)
                    note(f"first screen, {size} node(s), warm", name, warm)
            if "steady" in parts:
                own, everything = child_steady(checkout, root, config, group)
                n = len(sim.nodes)
                note("steady: controller per node", name, 100 * own / STEADY_SECONDS / n)
                note(f"steady: all CPU ({n} nodes, 1 Hz)", name, 100 * everything / STEADY_SECONDS)


def main() -> None:
    args = sys.argv[1:]
    against = Path(args.pop(args.index("--against") + 1)) if "--against" in args else None
    rounds = int(args.pop(args.index("--rounds") + 1)) if "--rounds" in args else 3
    parts = [arg for arg in args if arg not in ("--against", "--rounds")] or ["bandwidth", "snapshot", "steady"]
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
        nodes = nodes_group(sim)
        try:
            if "bandwidth" in parts:
                bandwidth_benchmark(sim, root)
            if against is not None:
                side_by_side(sim, config, root, parts, against, rounds, nodes)
                return
            if "snapshot" in parts:
                snapshot_benchmark(sim, config)
            if "steady" in parts:
                steady_benchmark(sim, config, nodes)
        finally:
            nodes.release()


if __name__ == "__main__":
    main()

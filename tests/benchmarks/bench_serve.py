"""`homegpu serve` at 16 nodes × 1 Hz on the simulated LAN, against `homegpu status --watch --json` on the
same nodes: the CPU of each process (its own, from /proc/PID/task/*/schedstat, ns), and serve's memory
(RSS) as it runs on, scraped every second as a Prometheus would. Prints figures and ratios; asserts nothing.

Run as root (it starts sshd servers):  .venv/bin/python tests/benchmarks/bench_serve.py [SECONDS [SERVE_SECONDS]]
(SECONDS: how long each is measured, default 60; SERVE_SECONDS: serve's own run, default SECONDS: longer
shows whether its memory stays flat, sampled every 10 s).

Every node's nvidia-smi replays two idle H100 NVLs recorded on real hardware (tests/fixtures/gpu), so
serve's per-GPU work (its metrics, its history) is that of a 32-GPU cluster.
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(TESTS))

import simnet  # noqa: E402
from gpu_replay import write_replay_nvidia_smi  # noqa: E402
from helpers import homegpu_argv  # noqa: E402
from simcluster import SimCluster  # noqa: E402

NODES = 16
SETTLE_SECONDS = 15.0  # every node connected and streaming before the clock starts
FIXTURES = TESTS / "fixtures" / "gpu"


def task_cpu_seconds(pid: int) -> float:
    """CPU time of every thread of `pid` so far (schedstat: exact, where /proc/PID/stat counts ticks)."""
    return sum(int((task / "schedstat").read_text().split()[0]) for task in Path(f"/proc/{pid}/task").iterdir()) / 1e9


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def measure(argv: list[str], cwd: Path, seconds: float, scrape: bool) -> tuple[float, list[float]]:
    """(CPU seconds over `seconds` after settling, RSS MiB each 10 s) of the process `argv` starts."""
    process = subprocess.Popen(argv, cwd=cwd, stdout=subprocess.PIPE if scrape else subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL, text=True)
    try:
        url = ""
        if scrape:  # its second line: "metrics: URL"
            process.stdout.readline()
            url = process.stdout.readline().split()[1]
        time.sleep(SETTLE_SECONDS)
        start, memory = task_cpu_seconds(process.pid), []
        began = time.monotonic()
        while (elapsed := time.monotonic() - began) < seconds:
            if scrape:
                with urllib.request.urlopen(url, timeout=5) as response:
                    response.read()
            if int(elapsed) % 10 == 0 and len(memory) <= int(elapsed) // 10:
                memory.append(rss_mib(process.pid))
            time.sleep(1.0)
        return task_cpu_seconds(process.pid) - start, memory
    finally:
        process.terminate()
        process.wait(timeout=30)


def main() -> None:
    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 60.0
    serve_seconds = float(sys.argv[2]) if len(sys.argv) > 2 else seconds
    print(f"homegpu serve benchmark, {platform.node()}, {os.cpu_count()} cores, {time.strftime('%Y-%m-%d')}, "
          f"{NODES} namespaced nodes on a {simnet.DEFAULT_MBIT} Mbit/s shaped bridge, 1 Hz stats\n")
    root = Path(tempfile.mkdtemp(prefix="homegpu-bench-serve-"))
    replay = [f"node{i}" for i in range(1, NODES + 1)]
    with SimCluster(NODES, first_host=160, extra_path_nodes=replay) as sim:
        for node in sim.nodes:
            write_replay_nvidia_smi(node.extra_path, FIXTURES / "gpus_2x_h100nvl_idle.csv", FIXTURES / "apps_none.csv")
        config = sim.write_cluster_toml(root / "cluster.toml")
        base = homegpu_argv("--config", str(config))
        watch_cpu, _ = measure([*base, "status", "--watch", "--json"], root, seconds, scrape=False)
        serve_cpu, memory = measure([*base, "serve", "--metrics-port", "0"], root, serve_seconds, scrape=True)
    watch, serve = watch_cpu / seconds, serve_cpu / serve_seconds  # cores
    print("CPU, % of one core (the process's own threads)")
    print(f"  homegpu status --watch --json, {seconds:g} s:                     {100 * watch:6.2f}")
    print(f"  homegpu serve (history, metrics scraped each second), {serve_seconds:g} s: {100 * serve:6.2f}")
    print(f"  serve / status --watch:                                    {serve / watch:6.2f}")
    print(f"serve's memory (RSS MiB) every 10 s: {' '.join(f'{m:.0f}' for m in memory)}")


if __name__ == "__main__":
    main()

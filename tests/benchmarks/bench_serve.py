"""`homegpu serve` at 16 nodes × 1 Hz on the simulated LAN, against `homegpu status --watch --json` on the
same nodes: the CPU of each process (its own, from /proc/PID/task/*/schedstat, ns), and serve's memory
(RSS) as it runs on, scraped every second as a Prometheus would. Prints figures and ratios; asserts nothing.

Run as root (it starts sshd servers):
    .venv/bin/python tests/benchmarks/bench_serve.py [SECONDS [SERVE_SECONDS]] [--against CHECKOUT]
(SECONDS: how long each is measured, default 60; SERVE_SECONDS: serve's own run, default SECONDS: longer
shows whether its memory stays flat, sampled every 10 s). `--against CHECKOUT` measures the serve of another
checkout of homegpu too (`git worktree add /tmp/before COMMIT`), on the same nodes, each with a history of its
own: e.g. the commit before energy was counted, for serve's CPU with energy on and off.

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


def measure(argv: list[str], cwd: Path, seconds: float, scrape: bool,
            env: dict[str, str] | None = None) -> tuple[float, list[float]]:
    """(CPU seconds over `seconds` after settling, RSS MiB each 10 s) of the process `argv` starts."""
    process = subprocess.Popen(argv, cwd=cwd, stdout=subprocess.PIPE if scrape else subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL, text=True, env={**os.environ, **(env or {})})
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


def checkout_argv(checkout: Path, root: Path) -> tuple[list[str], dict[str, str]]:
    """argv and environment that run the homegpu of `checkout` (its source, with this Python's packages)."""
    path = root / "against"
    path.mkdir()
    (path / "homegpu").symlink_to(checkout.resolve())
    code = "import sys; from homegpu.tui.cli.main import main; sys.exit(main())"
    return [sys.executable, "-c", code], {"PYTHONPATH": str(path)}


def main() -> None:
    args = sys.argv[1:]
    against = Path(args.pop(args.index("--against") + 1)) if "--against" in args else None
    args = [arg for arg in args if arg != "--against"]
    seconds = float(args[0]) if args else 60.0
    serve_seconds = float(args[1]) if len(args) > 1 else seconds
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
        serve_cpu, memory = measure([*base, "serve", "--metrics-port", "0"], root, serve_seconds, scrape=True,
                                    env={"XDG_DATA_HOME": str(root / "data-now")})
        if against is not None:
            argv, env = checkout_argv(against, root)
            other_cpu, other_memory = measure([*argv, "--config", str(config), "serve", "--metrics-port", "0"], root,
                                              serve_seconds, scrape=True,
                                              env={**env, "XDG_DATA_HOME": str(root / "data-against")})
    watch, serve = watch_cpu / seconds, serve_cpu / serve_seconds  # cores
    print("CPU, % of one core (the process's own threads)")
    print(f"  homegpu status --watch --json, {seconds:g} s:                     {100 * watch:6.2f}")
    print(f"  homegpu serve (history, metrics scraped each second), {serve_seconds:g} s: {100 * serve:6.2f}")
    print(f"  serve / status --watch:                                    {serve / watch:6.2f}")
    print(f"serve's memory (RSS MiB) every 10 s: {' '.join(f'{m:.0f}' for m in memory)}")
    if against is not None:
        other = other_cpu / serve_seconds
        print(f"  homegpu serve of {against}, {serve_seconds:g} s:  {100 * other:6.2f}")
        print(f"  serve now / serve of {against}:                            {serve / other:6.2f}")
        print(f"its memory (RSS MiB) every 10 s: {' '.join(f'{m:.0f}' for m in other_memory)}")


if __name__ == "__main__":
    main()

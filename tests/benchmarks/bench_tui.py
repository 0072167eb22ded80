"""TUI benchmarks on the simulated LAN (tests/simcluster.py: 16 namespaced nodes with their own sshd
on 10.213.0.N:22, links shaped to 1 Gbit/s, named by ssh config alias). Prints figures and ratios;
asserts nothing.

Run as root (it starts sshd servers):  .venv/bin/python tests/benchmarks/bench_tui.py [cpu|flood]

1. CPU at 1 Hz with 8 and 16 nodes: `homegpu` (the TUI) against `homegpu status --watch` (headless),
   each in its own 160×48 tmux terminal on the same nodes, for WINDOW seconds once every node
   reports. CPU is the process's own (/proc/PID/stat); the nodes' sshd and agents cost the same
   under both and are left out.
2. A log flood: a job prints 20,000 lines/s for 30 s on one node; the TUI (Textual's headless
   driver, the real Controller and SSH path) follows it. Every 0.25 s a key press (`f`) is posted
   and the time until its action runs is recorded; RSS is sampled every second. The baseline is
   the same key presses with no job running.
"""

from __future__ import annotations

import asyncio
import os
import platform
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import tomli_w

TESTS = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(TESTS))

from helpers import homegpu_argv  # noqa: E402
from simcluster import SimCluster, free_job_port  # noqa: E402

from homegpu.remote.config.cluster_spec import load_cluster  # noqa: E402
from homegpu.remote.events import JobState  # noqa: E402
from homegpu.tui.app.main import HomegpuApp  # noqa: E402
from homegpu.tui.app.controller import Controller  # noqa: E402
from textual import events  # noqa: E402

WINDOW = 20.0
FLOOD_RATE, FLOOD_SECONDS = 20_000, 30
KEY_EVERY = 0.25
TMUX = ["tmux", "-L", "homegpu-bench"]

FLOOD_SCRIPT = f"""\
import sys, time
rate, seconds = {FLOOD_RATE}, {FLOOD_SECONDS}
start, n = time.monotonic(), 0
while (elapsed := time.monotonic() - start) < seconds:
    target = int(elapsed * rate)
    sys.stdout.write("".join(f"flood line {{i:>9}} the quick brown fox jumps over the lazy dog\\n"
                             for i in range(n, target)))
    sys.stdout.flush()
    n = target
    time.sleep(0.005)
print(f"printed {{n}} lines", flush=True)
"""


# -- 1. CPU at 1 Hz --------------------------------------------------------------------------------


def process_cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def terminal_cpu(argv: list[str], nodes: int) -> float:
    """CPU seconds `argv` uses in WINDOW seconds in a 160×48 tmux terminal, once all nodes report."""
    subprocess.run([*TMUX, "kill-server"], capture_output=True)
    subprocess.run([*TMUX, "new-session", "-d", "-s", "b", "-x", "160", "-y", "48", "exec " + shlex.join(argv)],
                   check=True)
    subprocess.run([*TMUX, "resize-window", "-t", "b", "-x", "160", "-y", "48"], check=True)
    pid = int(subprocess.run([*TMUX, "list-panes", "-t", "b", "-F", "#{pane_pid}"], capture_output=True,
                             text=True, check=True).stdout)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            screen = subprocess.run([*TMUX, "capture-pane", "-p", "-t", "b"], capture_output=True, text=True).stdout
            if screen.count("●") >= nodes:  # every node online, in both programs
                break
            time.sleep(0.5)
        time.sleep(3)
        before = process_cpu_seconds(pid)
        time.sleep(WINDOW)
        return process_cpu_seconds(pid) - before
    finally:
        subprocess.run([*TMUX, "kill-server"], capture_output=True)


def cpu_benchmark(sim: SimCluster, root: Path) -> None:
    print(f"CPU at 1 Hz, {WINDOW:g} s window, % of one core")
    print(f"  {'nodes':>5}  {'TUI':>7}  {'status --watch':>14}  {'TUI / watch':>11}")
    for size in (8, 16):
        config = write_config(sim, root / f"cluster{size}.toml", size)
        tui = terminal_cpu(homegpu_argv("--config", str(config)), size)
        watch = terminal_cpu(homegpu_argv("--config", str(config), "status", "--watch"), size)
        print(f"  {size:>5}  {100 * tui / WINDOW:6.1f}%  {100 * watch / WINDOW:13.1f}%  {tui / watch:10.2f}x")


def write_config(sim: SimCluster, path: Path, nodes: int, **jobs: dict) -> Path:
    """A cluster.toml for the first `nodes` nodes of `sim`, with `jobs`."""
    data = sim.cluster_dict(jobs=jobs or None)
    data["nodes"] = data["nodes"][:nodes]
    path.write_text(tomli_w.dumps(data))
    return path


# -- 2. Log flood ----------------------------------------------------------------------------------


class TimedApp(HomegpuApp):
    """Records when each `f` press reaches its action."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.sent: list[float] = []
        self.latencies: list[float] = []

    def action_follow(self) -> None:
        self.latencies.append(time.perf_counter() - self.sent.pop(0))
        super().action_follow()


def rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


async def press_keys(app: TimedApp, seconds: float, rss: list[float]) -> None:
    end = time.monotonic() + seconds
    next_rss = 0.0
    while time.monotonic() < end:
        app.sent.append(time.perf_counter())
        app._driver.send_message(events.Key("f", "f"))
        if time.monotonic() >= next_rss:
            rss.append(rss_mib())
            next_rss = time.monotonic() + 1
        await asyncio.sleep(KEY_EVERY)
    await asyncio.sleep(1)


async def flood_run(config: Path, root: Path, flood: bool) -> tuple[list[float], list[float], int]:
    spec = load_cluster(config)
    app = TimedApp(spec, Controller(spec, root / "experiments"))
    rss: list[float] = []
    async with app.run_test(size=(160, 48)):
        while not app.view.nodes["node1"].stats:
            await asyncio.sleep(0.2)
        if flood:
            app._launch("flood")
            while not (app.view.job and app.view.job.state in (JobState.RUNNING, JobState.FAILED)):
                await asyncio.sleep(0.05)
            assert app.view.job.state is JobState.RUNNING, f"the flood job did not start: {app.view.job}"
        await press_keys(app, FLOOD_SECONDS + 2 if flood else 10, rss)
        lines = app.view.logs.version
        if flood:
            while app.controller.job_running:
                await asyncio.sleep(0.2)
        await app.controller.close(stop_job=True)
    return app.latencies, rss, lines


def flood_benchmark(sim: SimCluster, root: Path) -> None:
    (root / "flood.py").write_text(FLOOD_SCRIPT)
    job = {"script": "flood.py", "python": sys.executable, "nodes": ["node1"], "port": free_job_port(),
           "restart": "never"}
    config = write_config(sim, root / "cluster.toml", 2, flood=job)
    idle, idle_rss, _ = asyncio.run(flood_run(config, root, flood=False))
    busy, busy_rss, lines = asyncio.run(flood_run(config, root, flood=True))
    print(f"\nlog flood: {FLOOD_RATE:,} lines/s for {FLOOD_SECONDS} s on one node, a key every {KEY_EVERY} s")
    print(f"  {'':22}  {'p50 ms':>7}  {'p99 ms':>7}  {'max ms':>7}  {'keys':>5}")
    for label, values in (("no job (baseline)", idle), ("during the flood", busy)):
        ms = sorted(v * 1000 for v in values)
        p99 = ms[min(len(ms) - 1, int(0.99 * len(ms)))]
        print(f"  {label:22}  {statistics.median(ms):7.1f}  {p99:7.1f}  {ms[-1]:7.1f}  {len(ms):>5}")
    print(f"  flood / baseline (p50): {statistics.median(busy) / statistics.median(idle):.1f}x")
    print(f"  lines that reached the TUI: {lines:,} of {FLOOD_RATE * FLOOD_SECONDS:,}")
    print(f"  RSS MiB: baseline {max(idle_rss):.0f}; flood start {busy_rss[0]:.0f}, "
          f"peak {max(busy_rss):.0f}, end {busy_rss[-1]:.0f}")


def main() -> None:
    assert shutil.which("tmux"), "tmux is not installed"
    root = Path(tempfile.mkdtemp(prefix="homegpu-bench-tui-"))
    with SimCluster(16, first_host=180) as sim:
        print(f"homegpu TUI benchmarks, {platform.node()}, {os.cpu_count()} cores, {time.strftime('%Y-%m-%d')}\n")
        parts = sys.argv[1:] or ["cpu", "flood"]
        if "cpu" in parts:
            cpu_benchmark(sim, root)
        if "flood" in parts:
            flood_benchmark(sim, root)


if __name__ == "__main__":
    main()

"""The stats agent's own CPU per 1 s sample, for both GPU sources, against the agent of another checkout.

    .venv/bin/python tests/benchmarks/bench_agent.py [SECONDS [ROUNDS]] [--against CHECKOUT]

SECONDS: how long each agent is measured after its start-up (default 30); ROUNDS: how many times each
(default 2; the median is shown). `--against CHECKOUT` runs the agent of another checkout of homegpu the
same way, alternating with this one: e.g. the commit
before GPU health was sampled (`git worktree add /tmp/before c56dcb9^`), for the agent's cost with health on
and before it. Prints figures and ratios; asserts nothing.

Each agent runs in a cgroup of its own (cgroup v1's cpuacct, else v2's cpu.stat; so: run as root), whose
usage counts every process in it, the nvidia-smi children it started and reaped included, to the
nanosecond. Two sources:

- `nvidia-smi`: tests/gpu_replay.py's stand-in replays the H100 80GB HBM3 under load (recorded on real
  hardware) and answers the health query with a row of nvidia-smi's documented fields (no card that throttles
  was recorded). The stand-in is a small Python script, about 6 ms of CPU a start, where a real nvidia-smi
  loads NVML and costs more: one-shot queries weigh more on real nodes than here.
- `nvml`: tests/test_stats_agent.py's fake pynvml answering with the same card's recordings (and the health
  readings of a throttled card); its calls cost next to nothing, so this is the agent's Python alone.
"""

from __future__ import annotations

import contextlib
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(TESTS))

from gpu_replay import FIXTURES, HOT_ON_A_RISER, write_replay_nvidia_smi  # noqa: E402
from helpers import wait_for  # noqa: E402


H100 = FIXTURES / "h100-80gb-hbm3"

# The agent's own main() with the fake pynvml fed from the H100 recordings, from the package at argv[2].
NVML_RUNNER = """
import sys
from types import SimpleNamespace
sys.path[:0] = [sys.argv[2], sys.argv[1]]
try:
    from homegpu.remote.node_side.agent import gpu_nvml, stats_agent
except ImportError:  # a checkout from before node_side/agent/ (issue 45): its modules are at node_side/'s top
    import importlib
    import homegpu.remote.node_side as flat
    sys.modules["homegpu.remote.node_side.agent"] = flat
    for name in (*flat.AGENT_MODULES, "stats_agent"):  # the agent's alone: a one-shot script runs when imported
        module = importlib.import_module("homegpu.remote.node_side." + name)
        sys.modules["homegpu.remote.node_side.agent." + name] = module
    from homegpu.remote.node_side.agent import gpu_nvml, stats_agent
import test_stats_agent as t
gpu = t.recorded_gpu("status_load.json")
[process] = gpu["processes"]
handle = t.device(gpu["name"], gpu["uuid"], gpu["util"], gpu["mem_used"], gpu["mem_total"], gpu["temp"],
                  round(gpu["power"] * 1000), round(gpu["power_limit"] * 1000), gpu["sm_clock"],
                  procs=[(process["pid"], process["mem"])])
handle["memory_v2"] = SimpleNamespace(used=20085 * t.MIB, reserved=480 * t.MIB, total=81559 * t.MIB, free=0)
handle.update(reasons=0x40, mem_clock=2619, sm_max=1980, mem_max=2619, gen=3, width=1, max_gen=5, max_width=16,
              gpu_max_gen=5, pci=SimpleNamespace(busId=b"00000000:1B:00.0"))
nvml = t.FakeNvmlV2([handle], "580.159.04", 13000, names={process["pid"]: process["name"]})
gpu_nvml.load_pynvml = lambda shipped=b"": nvml
sys.argv = ["-c"]  # as under the bundle, whose stdin watch runs
stats_agent.main(["--interval", "1", "--source", "nvml", "--work-dir", "/tmp"])
"""


# --- a cgroup per agent -------------------------------------------------------------------------------

class CpuGroup:
    """A cgroup that one agent and its children run in; `used_ns()` is their CPU so far, the ended ones too."""

    V1 = Path("/sys/fs/cgroup/cpuacct")
    V2 = Path("/sys/fs/cgroup")

    def __init__(self, name: str) -> None:
        if (self.V1 / "cpuacct.usage").exists():
            self.path, self.v1 = self.V1 / name, True
        elif (self.V2 / "cgroup.controllers").exists():
            self.path, self.v1 = self.V2 / name, False
        else:
            sys.exit("bench_agent: no cgroup v1 cpuacct and no cgroup v2 at /sys/fs/cgroup; it needs one (run as root)")
        self.path.mkdir()

    def enter(self) -> None:
        """Move the calling process into the group (a preexec_fn: the agent is born in it)."""
        (self.path / "cgroup.procs").write_text(str(os.getpid()))

    def used_ns(self) -> int:
        if self.v1:
            return int((self.path / "cpuacct.usage").read_text())
        stat = dict(line.split() for line in (self.path / "cpu.stat").read_text().splitlines())
        return int(stat["usage_usec"]) * 1000

    def release(self) -> None:
        """Move what is left to the parent group (it goes on, measured no more), then remove the group."""
        for pid in (self.path / "cgroup.procs").read_text().split():
            with contextlib.suppress(OSError):
                (self.path.parent / "cgroup.procs").write_text(pid)
        with contextlib.suppress(OSError):
            self.path.rmdir()

    def remove(self) -> None:
        """Kill what is left in the group, then remove it."""
        for _ in range(50):
            pids = (self.path / "cgroup.procs").read_text().split()
            if not pids:
                break
            for pid in pids:
                with contextlib.suppress(OSError):
                    os.kill(int(pid), 9)
            time.sleep(0.1)
        self.path.rmdir()


# --- one agent ----------------------------------------------------------------------------------------

def package_dir(checkout: Path, root: Path) -> Path:
    """A folder whose `homegpu` is `checkout`, to put first on sys.path."""
    folder = root / f"pkg-{abs(hash(str(checkout)))}"
    if not folder.exists():
        folder.mkdir()
        (folder / "homegpu").symlink_to(checkout.resolve())
    return folder


def agent_argv(source: str, checkout: Path, root: Path) -> list[str]:
    if source == "nvml":
        return [sys.executable, "-c", NVML_RUNNER, str(TESTS), str(package_dir(checkout, root))]
    agent = checkout / "remote" / "node_side" / "agent" / "stats_agent.py"
    if not agent.exists():  # a checkout from before node_side/agent/ (issue 45)
        agent = checkout / "remote" / "node_side" / "stats_agent.py"
    return [sys.executable, str(agent), "--interval", "1", "--source", "nvidia-smi", "--work-dir", str(root)]


def measure(source: str, checkout: Path, root: Path, seconds: float, replay: Path) -> float:
    """CPU ms per sample of one agent over `seconds`, after its first two lines (its start-up)."""
    lines = root / f"lines-{time.monotonic_ns()}.jsonl"
    group = CpuGroup(f"homegpu-bench-agent-{os.getpid()}-{time.monotonic_ns()}")
    env = {**os.environ, "PATH": f"{replay}{os.pathsep}{os.environ['PATH']}"}
    try:
        with open(lines, "wb") as out:
            proc = subprocess.Popen(agent_argv(source, checkout, root), stdin=subprocess.PIPE, stdout=out, env=env,
                                    preexec_fn=group.enter)
            try:
                wait_for(lambda: lines.read_bytes().count(b"\n") >= 2, 60, f"the {source} agent's first two lines")
                before, first = group.used_ns(), lines.read_bytes().count(b"\n")
                time.sleep(seconds)
                spent, count = group.used_ns() - before, lines.read_bytes().count(b"\n") - first
            finally:
                proc.kill()
                proc.wait()
    finally:
        group.remove()
    return spent / count / 1e6


def main() -> None:
    args = sys.argv[1:]
    against = Path(args.pop(args.index("--against") + 1)) if "--against" in args else None
    args = [arg for arg in args if arg != "--against"]
    seconds = float(args[0]) if args else 30.0
    rounds = int(args[1]) if len(args) > 1 else 2
    here = TESTS.parent  # this checkout: the repository is the homegpu package
    print(f"stats agent CPU per 1 s sample, {platform.node()}, {os.cpu_count()} cores, {time.strftime('%Y-%m-%d')}, "
          f"{seconds:g} s each, {rounds} rounds, median\n")
    root = Path(tempfile.mkdtemp(prefix="homegpu-bench-agent-"))
    health = root / "health.csv"
    health.write_text(HOT_ON_A_RISER)
    replay = write_replay_nvidia_smi(root / "bin", H100 / "gpus_load.csv", H100 / "apps_load.csv",
                                     version_fixture=H100 / "smi_version.txt", health_fixture=health)
    checkouts = {"this checkout": here, **({str(against): against} if against else {})}
    for source in ("nvidia-smi", "nvml"):
        results: dict[str, list[float]] = {name: [] for name in checkouts}
        for _ in range(rounds):
            for name, checkout in checkouts.items():
                results[name].append(measure(source, checkout, root, seconds, replay))
        print(f"--source {source}")
        for name, values in results.items():
            print(f"  {name:<40} {statistics.median(values):7.3f} ms  ({', '.join(f'{v:.3f}' for v in values)})")
        if against:
            ratio = statistics.median(results["this checkout"]) / statistics.median(results[str(against)])
            print(f"  this / {against}: {ratio:.2f}x")
        print()


if __name__ == "__main__":
    main()

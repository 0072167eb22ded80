"""What a slow login shell costs homegpu: a node whose ~/.bashrc runs a pyenv-like init (0.1 s, then the
rehash lock; tests/simshell.py) against a node whose shell reads no ~/.bashrc, side by side on the simulated
LAN. Prints medians; asserts nothing.

Run as root:  HOMEGPU_TEST_LAN=N .venv/bin/python tests/benchmarks/bench_login.py [ROUNDS]

1. commands: N `run(["true"])` one after another on one open connection (what a run's preflight, code
   sync, launch and log tails are made of), and N at once;
2. status: `homegpu status` of the node alone, from the command to its exit;
3. run: `homegpu run` of a script that prints one line, on the node alone, from the command to its exit.
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(TESTS))

import tomli_w  # noqa: E402

from helpers import homegpu  # noqa: E402
from simcluster import SimCluster, free_job_port  # noqa: E402
from simshell import PyenvInit  # noqa: E402

from homegpu.remote.config.cluster_spec import load_cluster  # noqa: E402
from homegpu.remote.nodes.cluster import Cluster  # noqa: E402

COMMANDS = 30
NODES = {"silent": None, "pyenv": PyenvInit(0.1)}


def node_config(sim: SimCluster, root: Path, node: str) -> Path:
    data = sim.cluster_dict(jobs={"hello": {"python": sys.executable, "script": "code/hello.py", "nodes": [node],
                                            "port": free_job_port(), "max_restarts": 0}})
    data["nodes"] = [table for table in data["nodes"] if table["name"] == node]
    (root / "code").mkdir(exist_ok=True)
    (root / "code" / "hello.py").write_text("print('trained', flush=True)\n")
    config = root / f"{node}.toml"
    config.write_text(tomli_w.dumps(data))
    return config


async def commands(config: Path, node: str) -> tuple[float, float]:
    """(seconds for COMMANDS runs one after another, seconds for COMMANDS at once) on one open connection."""
    async with Cluster(load_cluster(str(config)), stream_stats=False) as cluster:
        session = cluster.node(node)
        await session.wait_online(30)
        await session.run(["true"], timeout=120)  # whatever the connection starts once is not counted
        started = time.perf_counter()
        for _ in range(COMMANDS):
            await session.run(["true"], timeout=120)
        serial = time.perf_counter() - started
        started = time.perf_counter()
        await asyncio.gather(*(session.run(["true"], timeout=120) for _ in range(COMMANDS)))
        return serial, time.perf_counter() - started


def wall(argv: list[str], cwd: Path) -> float:
    started = time.perf_counter()
    result = homegpu(*argv, cwd=cwd, timeout=300)
    took = time.perf_counter() - started
    if result.returncode != 0:
        raise SystemExit(f"homegpu {' '.join(argv)} failed: {result.stdout}{result.stderr}")
    return took


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    root = Path(tempfile.mkdtemp(prefix="bench-login-"))
    sim = SimCluster(0, name="login")
    for host, (name, pyenv) in enumerate(NODES.items(), start=180):
        sim.add_node(name, host, pyenv=pyenv)
    figures: dict[str, dict[str, list[float]]] = {name: {} for name in NODES}
    with sim:
        configs = {name: node_config(sim, root, name) for name in NODES}
        for _ in range(rounds):  # the two nodes alternate, so a busy moment hits both
            for name, config in configs.items():
                serial, parallel = asyncio.run(commands(config, name))
                figures[name].setdefault(f"{COMMANDS} commands one after another", []).append(serial)
                figures[name].setdefault(f"{COMMANDS} commands at once", []).append(parallel)
                figures[name].setdefault("homegpu status", []).append(
                    wall(["--config", str(config), "status"], root))
                figures[name].setdefault("homegpu run (one line)", []).append(
                    wall(["--config", str(config), "run", "hello", "--no-tui"], root))
    print(f"medians of {rounds} rounds, seconds")
    print(f"{'':40} {'silent shell':>14} {'pyenv 0.1 s':>14} {'ratio':>7}")
    for what in figures["silent"]:
        silent, pyenv = (statistics.median(figures[name][what]) for name in NODES)
        print(f"{what:40} {silent:14.3f} {pyenv:14.3f} {pyenv / silent:7.2f}")


if __name__ == "__main__":
    main()

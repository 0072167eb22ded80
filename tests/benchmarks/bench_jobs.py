"""Job benchmarks on the simulated LAN (tests/simcluster.py: namespaced nodes with their own sshd,
links shaped to 1 Gbit/s) and a real Docker engine. Prints ratios; asserts nothing.

Run as root:  .venv/bin/python tests/benchmarks/bench_jobs.py [launch] [throughput] [reach]  (default: all;
the launch part uses the shared Docker engine: hold /tmp/homegpu-cluster.lock around it)

1. launch: from the command to every worker running, for a 4-node and a 1-node Docker job
   (homegpu: preflight, code sync, parallel starts over each node's own forwarded Docker socket),
   against a sequential `ssh ALIAS docker run -d ...` loop over the same 4 nodes (by their ssh
   config aliases). For scale, the same 4 and 1 containers started straight through the engine's
   API with nothing else around. Docker nodes share this machine's one engine (simcluster.py says
   why), so their containers run on this machine's network, not on the shaped links.
2. throughput: the built-in trainer on two namespaced nodes, one worker each, talking across the
   shaped LAN: through `homegpu run` (process runtime) against the same trainer started by hand on
   the same two nodes (`ssh ALIAS env TF_CONFIG=... python -m homegpu.trainer ...`) with the same
   TF_CONFIG (the nodes' LAN addresses, the job's port on both), examples/s from the metric lines,
   both measured over epochs 2..N (epoch 1 holds TensorFlow's warm-up).
3. reach: `homegpu run` of a 2-node job whose port one node's firewall drops, from the command to its
   refusal (the reach proof, before code sync and any start), against `homegpu tfconfig` of the same job
   (the same connections and plan, no proof): what the proof adds to a refused launch.
"""

from __future__ import annotations

import asyncio
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(TESTS))

import docker  # noqa: E402

from images import ensure_tf_image  # noqa: E402
from helpers import homegpu_argv  # noqa: E402
from simcluster import SimCluster, SimNode, free_job_port  # noqa: E402
from simdocker import ensure_docker  # noqa: E402

from homegpu.remote.config.cluster_spec import load_cluster  # noqa: E402
from homegpu.remote.jobs import JobRun  # noqa: E402
from homegpu.remote.nodes.cluster import Cluster  # noqa: E402
from homegpu.trainer.metrics import parse_metric_line  # noqa: E402

SLEEPER = "import time\ntime.sleep(600)\n"
EPOCHS, STEPS, BATCH = 6, 100, 64
REPEATS = 3


def remove_job_containers(client: docker.DockerClient, job: str) -> None:
    for container in client.containers.list(all=True, filters={"label": f"homegpu.job={job}"}):
        container.remove(force=True)


async def homegpu_launch_seconds(config: Path, job: str) -> float:
    spec = load_cluster(config)
    async with Cluster(spec, stream_stats=False) as cluster:
        start = time.perf_counter()
        run = JobRun(cluster, spec.jobs[job], Path(tempfile.mkdtemp()))
        await run.launch()
        elapsed = time.perf_counter() - start
        await run.nodes.stop(run.run_id)
        await run.detach()
    return elapsed


def ssh_alias_argv(sim: SimCluster, node: SimNode, command: list[str]) -> list[str]:
    """`ssh ALIAS command` through the cluster's ssh config, as a user reaches a machine by name."""
    return ["ssh", "-F", str(sim.ssh_config_path), "-o", "BatchMode=yes", node.alias, shlex.join(command)]


def ssh_loop_seconds(sim: SimCluster, image: str) -> float:
    start = time.perf_counter()
    for node in sim.nodes:
        command = ["docker", "run", "-d", "--rm", "--network", "host", "--label", "homegpu.job=bench-loop",
                   image, "python3", "-c", SLEEPER]
        subprocess.run(ssh_alias_argv(sim, node, command), check=True, capture_output=True)
    return time.perf_counter() - start


def engine_floor_seconds(client: docker.DockerClient, image: str, count: int) -> float:
    """`count` containers created and started at once straight through the engine's API: what a
    launch costs on this machine before any tool adds anything. Every simulated node shares this one
    engine (and its 2 cores), so 4 starts here cost about 4 engines' CPU, which 4 real nodes
    would each spend on their own."""
    def one(_: int) -> None:
        client.containers.run(image, ["python3", "-c", SLEEPER], detach=True, network_mode="host",
                              labels={"homegpu.job": "bench-floor"})

    start = time.perf_counter()
    with ThreadPoolExecutor(count) as pool:
        list(pool.map(one, range(count)))
    return time.perf_counter() - start


def launch_benchmark(sim: SimCluster, client: docker.DockerClient, image: str, root: Path) -> None:
    code = root / "sleeper"
    code.mkdir()
    (code / "sleep.py").write_text(SLEEPER)
    jobs = {name: {"image": image, "script": "sleeper/sleep.py", "nodes": nodes, "port": free_job_port()}
            for name, nodes in (("bench4", [n.name for n in sim.nodes]), ("bench1", [sim.nodes[0].name]))}
    config = sim.write_cluster_toml(root / "cluster.toml", runtime="docker", jobs=jobs)
    four, one, loop, floor4, floor1 = [], [], [], [], []
    for _ in range(3):
        for count, floor in ((4, floor4), (1, floor1)):
            floor.append(engine_floor_seconds(client, image, count))
            remove_job_containers(client, "bench-floor")
        four.append(asyncio.run(homegpu_launch_seconds(config, "bench4")))
        remove_job_containers(client, "bench4")
        one.append(asyncio.run(homegpu_launch_seconds(config, "bench1")))
        remove_job_containers(client, "bench1")
        loop.append(ssh_loop_seconds(sim, image))
        remove_job_containers(client, "bench-loop")
    f, o, l = statistics.median(four), statistics.median(one), statistics.median(loop)
    e4, e1 = statistics.median(floor4), statistics.median(floor1)
    print("launch: command → all workers running (median of 3, s)")
    print(f"  homegpu, 4 nodes:          {f:6.2f}")
    print(f"  homegpu, 1 node:           {o:6.2f}   4 nodes / 1 node = {f / o:.2f}x")
    print(f"  ssh + docker run loop, 4:  {l:6.2f}   loop / homegpu = {l / f:.2f}x")
    print(f"  engine alone, 4 at once:   {e4:6.2f}")
    print(f"  engine alone, 1:           {e1:6.2f}   4 / 1 = {e4 / e1:.2f}x (the shared engine's floor)")


def epoch_rates(lines: list[str]) -> list[float]:
    rates = []
    for line in lines:
        data = parse_metric_line(line)
        if data and data.get("event") == "epoch" and data.get("epoch", 0) >= 2:
            rates.append(float(data["examples_per_sec"]))
    return rates


def trainer_args(output: str) -> list[str]:
    return ["--epochs", str(EPOCHS), "--steps-per-epoch", str(STEPS), "--batch-size", str(BATCH), "--output", output]


def by_hand_rate(sim: SimCluster, nodes: list[SimNode], port: int, root: Path) -> float:
    """Both workers started over ssh on their nodes with the TF_CONFIG homegpu would give them."""
    workers = [f"{node.address}:{port}" for node in nodes]
    procs = []
    for index, node in enumerate(nodes):
        tf_config = json.dumps({"cluster": {"worker": workers}, "task": {"type": "worker", "index": index}})
        command = ["env", f"TF_CONFIG={tf_config}", sys.executable, "-m", "homegpu.trainer",
                   *trainer_args(str(root / f"hand{index}"))]
        procs.append(subprocess.Popen(ssh_alias_argv(sim, node, command), stdin=subprocess.DEVNULL,
                                      stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True))
    rates = [statistics.mean(epoch_rates(p.stdout.read().splitlines())) for p in procs]
    for proc in procs:
        proc.wait()
    return sum(rates)


def homegpu_rate(config: Path, root: Path) -> float:
    """The same job through `homegpu run --no-tui`, as a user runs it; rates from its metrics.jsonl."""
    result = subprocess.run(homegpu_argv("--config", str(config), "run", "bench", "--no-tui"), cwd=root,
                            capture_output=True, text=True, timeout=900)
    assert result.returncode == 0 and "run succeeded" in result.stdout, result.stdout + result.stderr
    [run_dir] = (root / "experiments").iterdir()
    per_worker: dict[str, list[float]] = {}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        data = json.loads(line)
        if data.get("event") == "epoch" and data.get("epoch", 0) >= 2:
            per_worker.setdefault(data["worker_label"], []).append(float(data["examples_per_sec"]))
    assert len(per_worker) == 2, per_worker
    return sum(statistics.mean(rates) for rates in per_worker.values())


def throughput_benchmark(sim: SimCluster, root: Path) -> None:
    nodes = sim.nodes[:2]
    port = free_job_port()
    job = {"python": sys.executable, "nodes": [node.name for node in nodes], "epochs": EPOCHS,
           "steps_per_epoch": STEPS, "batch_size": BATCH, "port": port}
    config = sim.write_cluster_toml(root / "train.toml", jobs={"bench": job})
    hand, ours = [], []
    for _ in range(REPEATS):
        hand.append(by_hand_rate(sim, nodes, port, Path(tempfile.mkdtemp(dir=root))))
        ours.append(homegpu_rate(config, Path(tempfile.mkdtemp(dir=root))))
    h, o = statistics.median(hand), statistics.median(ours)
    print(f"\ntraining throughput, 2 nodes × 1 worker across the {sim.mbit} Mbit/s LAN, cnn, synthetic, "
          f"batch {BATCH}/worker (examples/s, both workers, median of {REPEATS})")
    print(f"  by hand with TF_CONFIG:  {h:8.0f}   (runs: {', '.join(f'{r:.0f}' for r in hand)})")
    print(f"  through homegpu:         {o:8.0f}   (runs: {', '.join(f'{r:.0f}' for r in ours)})")
    print(f"  homegpu / by hand = {o / h:.3f}")


def command_seconds(argv: list[str], cwd: Path) -> tuple[float, int]:
    start = time.perf_counter()
    result = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=300)
    return time.perf_counter() - start, result.returncode


def reach_benchmark(sim: SimCluster, root: Path) -> None:
    port = free_job_port()
    config = sim.write_cluster_toml(root / "reach" / "cluster.toml", jobs={"bench": {
        "python": sys.executable, "nodes": ["node1", "node2"], "port": port, "epochs": 1}})
    refused, plain = [], []
    with sim.node("node2").firewall(port):
        for _ in range(REPEATS):
            seconds, status = command_seconds(homegpu_argv("--config", str(config), "run", "bench", "--no-tui"),
                                              config.parent)
            assert status == 1, "the firewalled run must be refused"
            refused.append(seconds)
            plain.append(command_seconds(homegpu_argv("--config", str(config), "tfconfig", "bench"), config.parent)[0])
    r, p = statistics.median(refused), statistics.median(plain)
    print(f"\na firewalled job port, 2 nodes (s, median of {REPEATS})")
    print(f"  homegpu tfconfig (connect and plan):   {p:6.2f}")
    print(f"  homegpu run, refused by the proof:     {r:6.2f}")
    print(f"  refused / tfconfig = {r / p:.2f}")


def main() -> None:
    parts = sys.argv[1:] or ["launch", "throughput", "reach"]
    root = Path(tempfile.mkdtemp(prefix="homegpu-bench-"))
    print(f"homegpu job benchmarks, {platform.node()}, {os.cpu_count()} cores, {time.strftime('%Y-%m-%d')}\n")
    with SimCluster(4, first_host=120) as sim:
        if "launch" in parts:
            engine = ensure_docker()
            client = docker.DockerClient(base_url=f"unix://{engine.socket_path}")
            try:
                launch_benchmark(sim, client, ensure_tf_image(client), root)
            finally:
                client.close()
                engine.stop()
        if "throughput" in parts:
            throughput_benchmark(sim, root)
        if "reach" in parts:
            reach_benchmark(sim, root)


if __name__ == "__main__":
    main()

"""Job benchmarks against real sshd nodes and a real Docker engine. Prints ratios; asserts nothing.

Run as root:  .venv/bin/python tests/benchmarks/bench_jobs.py

1. Launch: from the command to every worker running, for a 4-node and a 1-node Docker job
   (homegpu: preflight, code sync, parallel starts over each node's own forwarded Docker socket),
   against a sequential `ssh node docker run -d ...` loop over the same 4 nodes. For scale, the
   same 4 and 1 containers started straight through the engine's API with nothing else around.
2. Training throughput: the built-in trainer on two workers through homegpu (process runtime)
   against the same trainer started by hand with the same TF_CONFIG, examples/s from the metric
   lines, both measured over epochs 2..N (epoch 1 holds TensorFlow's warm-up).
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
from simcluster import SimCluster, ensure_docker, free_job_port  # noqa: E402

from homegpu.remote.cluster import Cluster  # noqa: E402
from homegpu.remote.config import load_cluster  # noqa: E402
from homegpu.remote.job_run import JobRun  # noqa: E402
from homegpu.trainer.metrics import parse_metric_line  # noqa: E402

SLEEPER = "import time\ntime.sleep(600)\n"
EPOCHS, STEPS, BATCH = 6, 100, 64


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


def ssh_loop_seconds(sim: SimCluster, image: str) -> float:
    start = time.perf_counter()
    for node in sim.nodes:
        command = ["docker", "run", "-d", "--rm", "--network", "host", "--label", "homegpu.job=bench-loop",
                   image, "python3", "-c", SLEEPER]
        subprocess.run(sim.ssh_argv(node, shlex.join(command)), check=True, capture_output=True)
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


def by_hand_rate(python: str, root: Path) -> float:
    port = free_job_port()
    workers = [f"127.0.0.1:{port}", f"127.0.0.1:{port + 1}"]
    procs = []
    for index in range(2):
        env = {**os.environ, "TF_CONFIG": json.dumps({"cluster": {"worker": workers},
                                                      "task": {"type": "worker", "index": index}})}
        procs.append(subprocess.Popen(
            [python, "-m", "homegpu.trainer", "--epochs", str(EPOCHS), "--steps-per-epoch", str(STEPS),
             "--batch-size", str(BATCH), "--output", str(root / f"hand{index}")],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True))
    rates = [statistics.mean(epoch_rates(p.stdout.read().splitlines())) for p in procs]
    for proc in procs:
        proc.wait()
    return sum(rates)


async def homegpu_rate(root: Path) -> float:
    from homegpu.remote.config import embedded_default
    from homegpu.remote.job_config import JobSpec

    base = embedded_default()
    job = JobSpec(name="bench", workers_per_node=2, epochs=EPOCHS, steps_per_epoch=STEPS, batch_size=BATCH,
                  port=free_job_port())
    spec = type(base)(**{**base.__dict__, "jobs": {"bench": job}, "work_dir": str(root / "work")})
    async with Cluster(spec, stream_stats=False) as cluster:
        run = JobRun(cluster, job, root / "experiments")
        await run.launch()
        outcome = await run.watch()
    metrics = (root / "experiments" / run.run_id / "metrics.jsonl").read_text().splitlines()
    assert outcome.state.value == "succeeded", outcome.detail
    per_worker: dict[str, list[float]] = {}
    for line in metrics:
        data = json.loads(line)
        if data.get("event") == "epoch" and data.get("epoch", 0) >= 2:
            per_worker.setdefault(data["worker_label"], []).append(float(data["examples_per_sec"]))
    return sum(statistics.mean(rates) for rates in per_worker.values())


def throughput_benchmark(root: Path) -> None:
    hand, ours = [], []
    for _ in range(3):
        hand.append(by_hand_rate(sys.executable, Path(tempfile.mkdtemp(dir=root))))
        ours.append(asyncio.run(homegpu_rate(Path(tempfile.mkdtemp(dir=root)))))
    h, o = statistics.median(hand), statistics.median(ours)
    print(f"\ntraining throughput, 2 workers, cnn, synthetic, batch {BATCH}/worker (examples/s, both workers)")
    print(f"  by hand with TF_CONFIG:  {h:8.0f}")
    print(f"  through homegpu:         {o:8.0f}   homegpu / by hand = {o / h:.3f}")


def main() -> None:
    engine = ensure_docker()
    client = docker.DockerClient(base_url=f"unix://{engine.socket_path}")
    image = ensure_tf_image(client)
    root = Path(tempfile.mkdtemp(prefix="homegpu-bench-"))
    print(f"homegpu job benchmarks, {platform.node()}, {os.cpu_count()} cores, {time.strftime('%Y-%m-%d')}\n")
    try:
        with SimCluster(4, first_host=120) as sim:
            launch_benchmark(sim, client, image, root)
        throughput_benchmark(root)
    finally:
        client.close()
        engine.stop()


if __name__ == "__main__":
    main()

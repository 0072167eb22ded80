"""Image copy benchmark on the 1 Gbit/s LAN in a box: homegpu's chain against the seeds' way. Prints; asserts nothing.

Run as root (it starts sshd servers and Docker engines):  .venv/bin/python tests/benchmarks/bench_image_copy.py

Four machines, each with a Docker engine of its own (tests/simdocker.py) and a 1 Gbit/s link. node1
holds an image of IMAGE_MB of random bytes in LAYERS layers (random: no compression can cheat),
built here; it goes to node2..node4, in the same run, three ways:

- homegpu: `homegpu image copy IMAGE --from node1` (the chain node1 → node2 → node3 → node4), as a
  user runs it: the CLI's start, its SSH connections and the engines' checks included;
- the seeds' way: on node1, `docker save IMAGE | ssh NODE docker load`, node after node;
- a single copy to one node: homegpu's to node2 alone, and the seeds' one pipe to node2;
- and homegpu's fixed cost on its own: the same command when every target holds the image already.

Nothing crosses the controller's side of the bridge in any of them (homegpu's chain runs node to
node; the seeds' pipes run on node1), so its link needs no shaping to be fair. Between runs the
image is deleted from the targets' engines. Rounds alternate which way goes first; medians.
"""

from __future__ import annotations

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

TESTS = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(TESTS))

import docker  # noqa: E402

from helpers import homegpu_argv  # noqa: E402
from images import ensure_random_image  # noqa: E402
from simcluster import SimCluster, SimNode  # noqa: E402
from simdocker import NodeEngine, ensure_docker, image_id, own_engines  # noqa: E402

NODES, ROUNDS = 4, 3
IMAGE_MB, LAYERS = 300, 4
TARGETS = ("node2", "node3", "node4")


def run(argv: list[str], **kwargs) -> subprocess.CompletedProcess:
    result = subprocess.run(argv, capture_output=True, text=True, timeout=900, **kwargs)
    if result.returncode != 0:
        raise SystemExit(f"{shlex.join(argv)[:200]} failed: {result.stdout[-500:]} {result.stderr[-1500:]}")
    return result


def seed_copy(sim: SimCluster, source: SimNode, engine: NodeEngine, image: str, target: SimNode) -> None:
    """`docker save IMAGE | ssh TARGET docker load`, run on the source machine as its user would."""
    save = shlex.join(["docker", "-H", f"unix://{engine.socket_path}", "save", image])
    load = shlex.join(sim.ssh_argv(target, "docker", "load"))
    run(source.in_namespace(["bash", "-c", f"set -o pipefail; {save} | {load}"]))


def clear(engines: dict[str, NodeEngine], image: str) -> None:
    for name in TARGETS:
        client = engines[name].client()
        try:
            client.images.remove(image, force=True)
        except docker.errors.ImageNotFound:
            pass
        finally:
            client.close()


def timed(action) -> float:
    start = time.perf_counter()
    action()
    return time.perf_counter() - start


def one_round(sim: SimCluster, engines: dict[str, NodeEngine], toml: Path, image: str, number: int) -> dict:
    source = sim.node("node1")
    ways = {
        "homegpu chain to 3": lambda: run(homegpu_argv("--config", str(toml), "image", "copy", image, "--from",
                                                       "node1", *(f"--to={name}" for name in TARGETS))),
        "seeds' way to 3": lambda: [seed_copy(sim, source, engines["node1"], image, sim.node(name))
                                    for name in TARGETS],
        "homegpu to 1": lambda: run(homegpu_argv("--config", str(toml), "image", "copy", image, "--from", "node1",
                                                 "--to", "node2")),
        "seeds' way to 1": lambda: seed_copy(sim, source, engines["node1"], image, sim.node("node2")),
    }
    order = list(ways) if number % 2 == 0 else list(reversed(ways))
    times = {}
    want = image_id(engines["node1"].socket_path, image)
    for way in order:
        clear(engines, image)
        times[way] = timed(ways[way])
        reached = [name for name in TARGETS if image_id(engines[name].socket_path, image) == want]
        if len(reached) != (3 if "3" in way else 1):
            raise SystemExit(f"{way}: the image reached only {reached}")
    # homegpu's fixed cost: the CLI's start, its SSH connections and the engines' checks, with every
    # target already holding the image (the chain's last run left it there) and nothing to copy
    run(homegpu_argv("--config", str(toml), "image", "copy", image, "--from", "node1"))
    times["homegpu, nothing to copy"] = timed(
        lambda: run(homegpu_argv("--config", str(toml), "image", "copy", image, "--from", "node1")))
    return times


def main() -> None:
    print(f"homegpu image copy benchmark, {platform.node()}, {os.cpu_count()} cores, {time.strftime('%Y-%m-%d')}, "
          f"load {os.getloadavg()[0]:.1f}\n")
    host_engine = ensure_docker()
    host = docker.DockerClient(base_url=f"unix://{host_engine.socket_path}")
    image = ensure_random_image(host, IMAGE_MB, LAYERS)
    size = host.images.get(image).attrs["Size"]
    root = Path(tempfile.mkdtemp(prefix="homegpu-bench-image-"))
    try:
        with SimCluster(NODES, first_host=220) as sim, own_engines(sim, ("node1", *TARGETS)) as engines:
            # node1 gets the image from this machine's engine (setup, not measured)
            run(["sh", "-c", f"docker save {shlex.quote(image)} | docker -H unix://{engines['node1'].socket_path} load"])
            toml = sim.write_cluster_toml(root / "cluster.toml", runtime="docker")
            rounds = [one_round(sim, engines, toml, image, number) for number in range(ROUNDS)]
    finally:
        host.close()
        shutil.rmtree(root, ignore_errors=True)
    med = {way: statistics.median(r[way] for r in rounds) for way in rounds[0]}
    print(f"an image of {size / 1e6:.0f} MB ({LAYERS} layers of random bytes) from node1 to {len(TARGETS)} nodes, "
          f"1 Gbit/s links, median of {ROUNDS} rounds (s)")
    for way, seconds in med.items():
        print(f"  {way:20s} {seconds:6.2f}   every round: {'  '.join(f'{r[way]:6.2f}' for r in rounds)}")
    chain, seeds3, seeds1 = med["homegpu chain to 3"], med["seeds' way to 3"], med["seeds' way to 1"]
    print(f"  seeds' way to 3 / homegpu chain to 3 = {seeds3 / chain:.2f}x (target >= 2.5x)")
    print(f"  homegpu chain to 3 / homegpu to 1    = {chain / med['homegpu to 1']:.2f}x (target <= 1.3x)")
    print(f"  homegpu chain to 3 / seeds' way to 1 = {chain / seeds1:.2f}x")
    print(f"  wire time of one copy at 0.95 Gbit/s: {size * 8 / 0.95e9:.2f} s")


if __name__ == "__main__":
    main()

"""Code sync benchmark against real sshd nodes: homegpu's sync_tree against rsync. Prints; asserts nothing.

Run as root (it starts sshd servers):  .venv/bin/python tests/benchmarks/bench_sync.py

A generated project (5,000 files, about 200 MB: three 40 MB checkpoints, 47 data files of about
1 MB, 4,950 small .py/.json files in a nested tree, plus .git and __pycache__ that neither tool
sends) goes to 4 nodes at once, (1) into empty directories, (2) again with nothing changed, (3)
after 10 small files changed. The baseline is `rsync -a --delete --exclude DIR -e 'ssh -F CONFIG'`,
one per node, all 4 at once, to the same nodes in the same run; rounds alternate which tool goes
first, medians of ROUNDS. rsync pays an SSH handshake per run; homegpu's nodes are connected
already (as they are in the TUI), and the time to connect them is printed on its own.

The copies land in a tmpfs (/dev/shm, which every simulated node sees) so that the figures are the
tools' own cost, not this VM's disk, whose write-back made the first sync vary 3-16 s between
rounds; `--on-disk` puts them in the nodes' work directories instead.
"""

from __future__ import annotations

import asyncio
import os
import platform
import random
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(TESTS))

from simcluster import SimCluster  # noqa: E402

from homegpu.remote.config.cluster_spec import load_cluster  # noqa: E402
from homegpu.remote.jobs.codesync import SKIP_DIRS, sync_tree  # noqa: E402
from homegpu.remote.node_side.scripts.tree_sync import scan  # noqa: E402
from homegpu.remote.nodes.cluster import Cluster  # noqa: E402

NODES, ROUNDS, CHANGED = 4, 3, 10
MB = 1 << 20


def make_project(root: Path, rng: random.Random) -> list[Path]:
    """Write the project; return its small source files (the ones step 3 edits)."""
    for index in range(3):
        write(root / "checkpoints" / f"epoch{index}.bin", rng.randbytes(40 * MB))
    for index in range(47):
        write(root / "data" / f"part{index:03d}.csv", rng.randbytes(rng.randint(MB // 2, 3 * MB // 2)))
    sources = []
    for index in range(4950):
        depth = rng.randint(1, 4)
        folder = root.joinpath("src", *(f"pkg{rng.randint(0, 7)}" for _ in range(depth)))
        suffix = ".json" if index % 4 == 0 else ".py"
        path = folder / f"module{index}{suffix}"
        write(path, rng.randbytes(rng.randint(500, 12000)).hex().encode()[: rng.randint(1000, 12000)])
        sources.append(path)
    for script in sources[::500]:
        os.chmod(script, 0o755)  # a few executable scripts: the mode travels too
    for skipped in (".git/objects/pack/pack.pack", "src/__pycache__/a.cpython-311.pyc"):
        write(root / skipped, rng.randbytes(MB))
    return [path for path in sources if path.suffix == ".py"]


def write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


def ssh_config(sim: SimCluster, path: Path) -> Path:
    """An ssh_config naming each node by its name, with the cluster's key and known_hosts."""
    blocks = [f"Host {node.name}\n  HostName {node.address}\n  Port {node.port}\n  User root\n"
              f"  IdentityFile {sim.client_key_path}\n  IdentitiesOnly yes\n"
              f"  UserKnownHostsFile {sim.known_hosts_path}\n  GlobalKnownHostsFile /dev/null\n"
              f"  StrictHostKeyChecking yes\n  BatchMode yes\n" for node in sim.nodes]
    path.write_text("".join(blocks))
    return path


def rsync_seconds(sim: SimCluster, config: Path, project: Path, dest: str,
                  under: Path | None) -> tuple[float, float]:
    """(seconds, CPU seconds of the sending side: rsync and ssh on this machine)."""
    excludes = [f"--exclude={name}/" for name in sorted(SKIP_DIRS)]
    os.sync()
    start, cpu = time.perf_counter(), children_cpu()
    procs = [subprocess.Popen(["rsync", "-a", "--delete", *excludes, "-e", f"ssh -F {config}",
                               f"{project}/", f"{node.name}:{destination(node, under, dest)}/"])
             for node in sim.nodes]
    codes = [proc.wait() for proc in procs]
    elapsed = time.perf_counter() - start
    assert codes == [0] * len(procs), f"rsync failed: {codes}"
    return elapsed, children_cpu() - cpu


def children_cpu() -> float:
    """CPU seconds of this process's ended children (here: the rsync and ssh clients)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


async def homegpu_seconds(cluster: Cluster, sim: SimCluster, project: Path, dest: str,
                          under: Path | None) -> tuple[float, float, int]:
    """(seconds, CPU seconds of this process, files sent to all nodes together)."""
    os.sync()
    start, cpu = time.perf_counter(), time.process_time()
    results = await asyncio.gather(*(
        sync_tree(cluster.node(node.name), project, str(destination(node, under, dest))) for node in sim.nodes))
    return time.perf_counter() - start, time.process_time() - cpu, sum(len(r.uploaded) for r in results)


def mismatches(project: Path, copy: Path, edited: list[Path]) -> int:
    """Files or directories of `project` that `copy` lacks or holds differently (size and mode; the
    edited files byte for byte). Not mtimes: homegpu stores a file saved in the second of the sync a
    second early, on purpose (the next sync sends it again)."""
    def stamps(root: Path):
        files, dirs = scan(str(root), SKIP_DIRS, True)
        return {rel: (e[0], e[2]) for rel, e in files.items()}, set(dirs)
    (want, want_dirs), (have, have_dirs) = stamps(project), stamps(copy)
    wrong = {rel for rel in want.keys() | have.keys() if want.get(rel) != have.get(rel)}
    wrong |= {p for p in edited if (copy / p.relative_to(project)).read_bytes() != p.read_bytes()}
    return len(wrong) + len(want_dirs ^ have_dirs)


def destination(node, under: Path | None, name: str) -> Path:
    """Where a tool's copy for `node` goes: in the node's work directory, or under `under`."""
    return node.work_dir / name if under is None else under / node.name / name


async def one_round(cluster: Cluster, sim: SimCluster, config: Path, project: Path, sources: list[Path],
                    round_no: int, rng: random.Random, under: Path | None) -> dict[str, list[float]]:
    rsync_dest, homegpu_dest = f"bench-rsync-{round_no}", f"bench-homegpu-{round_no}"
    times: dict[str, list[float]] = {}
    rsync_first = round_no % 2 == 0

    async def both(step: str) -> None:
        order = ("rsync", "homegpu") if rsync_first else ("homegpu", "rsync")
        for tool in order:
            if tool == "rsync":
                seconds, cpu = rsync_seconds(sim, config, project, rsync_dest, under)
            else:
                seconds, cpu, sent = await homegpu_seconds(cluster, sim, project, homegpu_dest, under)
                times[f"{step} homegpu files"] = [sent]
            times[f"{step} {tool}"], times[f"{step} {tool} cpu"] = [seconds], [cpu]

    await both("first")
    await both("no change")
    edited = rng.sample(sources, CHANGED)
    for path in edited:
        with open(path, "ab") as out:
            out.write(b"\n# edited\n")
    await both("10 changed")
    for node in sim.nodes:
        for tool, dest in (("homegpu", homegpu_dest), ("rsync", rsync_dest)):
            copy = destination(node, under, dest)
            times.setdefault(f"{tool} mismatches", []).append(mismatches(project, copy, edited))
            shutil.rmtree(copy)
    time.sleep(1.1)  # the edits leave the racy second before the next round's first sync
    return times


async def run(sim: SimCluster, root: Path, under: Path | None) -> None:
    rng = random.Random(16)
    project = root / "project"
    sources = make_project(project, rng)
    files, _ = scan(str(project), SKIP_DIRS, True)
    print(f"project: {len(files)} files, {sum(e[0] for e in files.values()) / MB:.0f} MB "
          f"(and .git, __pycache__: skipped by both), {NODES} nodes, copies in "
          f"{'the nodes’ work dirs (disk)' if under is None else under}\n")
    for node in sim.nodes if under is not None else ():
        (under / node.name).mkdir()
    time.sleep(1.1)
    config = ssh_config(sim, root / "ssh_config")
    spec = load_cluster(sim.write_cluster_toml(root / "cluster.toml"))
    start = time.perf_counter()
    async with Cluster(spec, stream_stats=False) as cluster:
        for node in cluster.nodes.values():
            await node.wait_online(30)
        connect = time.perf_counter() - start
        rounds = [await one_round(cluster, sim, config, project, sources, number, rng, under)
                  for number in range(ROUNDS)]
    merged = {key: [value for r in rounds for value in r[key]] for key in rounds[0]}
    med = {key: statistics.median(values) for key, values in merged.items()}
    print(f"code sync to {NODES} nodes at once (median of {ROUNDS} rounds, s)")
    for step, target in (("first", "<= 1.5x"), ("no change", "<= 1 s"), ("10 changed", "<= 1.5x")):
        h, r = med[f"{step} homegpu"], med[f"{step} rsync"]
        print(f"  {step:11s} homegpu {h:6.2f} ({med[f'{step} homegpu files']:.0f} files sent)   "
              f"rsync -a {r:6.2f}   homegpu / rsync = {h / r:.2f}x   (target {target})")
    print(f"  sending side's CPU, first sync: homegpu (one process) {med['first homegpu cpu']:.2f} s, "
          f"rsync + ssh clients {med['first rsync cpu']:.2f} s")
    print(f"  homegpu connecting the {NODES} nodes first (once): {connect:.2f} s")
    print(f"  files or dirs differing from the project, all nodes and rounds: homegpu "
          f"{sum(merged['homegpu mismatches']):.0f}, rsync {sum(merged['rsync mismatches']):.0f}")
    print("  every round (s):")
    for key, values in merged.items():
        if not key.endswith(("files", "mismatches", "cpu")):
            print(f"    {key:18s} {'  '.join(f'{v:6.2f}' for v in values)}")


def main() -> None:
    version = subprocess.run(["rsync", "--version"], capture_output=True, text=True).stdout.split("\n")[0]
    print(f"homegpu code sync benchmark, {platform.node()}, {os.cpu_count()} cores, "
          f"{time.strftime('%Y-%m-%d')}, {version}, load {os.getloadavg()[0]:.1f}\n")
    root = Path(tempfile.mkdtemp(prefix="homegpu-bench-sync-"))
    on_disk = "--on-disk" in sys.argv[1:]
    under = None if on_disk else Path(tempfile.mkdtemp(prefix="homegpu-bench-sync-", dir="/dev/shm"))
    try:
        with SimCluster(NODES, first_host=140) as sim:
            asyncio.run(run(sim, root, under))
    finally:
        shutil.rmtree(root, ignore_errors=True)
        if under is not None:
            shutil.rmtree(under, ignore_errors=True)


if __name__ == "__main__":
    main()

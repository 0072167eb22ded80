"""What many tests share: the installed `homegpu` command, waiting for a condition, a quick demo job."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator, Sequence

import tiers
from simcluster import SimCluster, free_job_port
from simdocker import NodeEngine, own_engines


def homegpu_argv(*args: str) -> list[str]:
    """argv for the `homegpu` console script installed next to this Python, as a user runs it."""
    exe = shutil.which("homegpu", path=str(Path(sys.executable).parent))
    assert exe, "the homegpu console script is not installed next to this Python"
    return [exe, *args]


def homegpu(*args: str, cwd: Path | None = None, timeout: float = 120,
            input: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(homegpu_argv(*args), cwd=cwd, capture_output=True, text=True, timeout=timeout,
                          input=input)


# The one way the tests wait: on a condition, polled, never for a fixed time. A bound is how long a
# machine at load 8 may take, not how long it should: a wait ends as soon as its condition holds.


def wait_for(predicate, timeout: float, what: str, step: float = 0.2):
    """Poll `predicate` until it returns something true (returned), or fail naming `what`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(step)
    if value := predicate():
        return value
    raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")


async def wait_until(condition, timeout: float, what: str | None = None, step: float = 0.1):
    """Poll `condition` on the running loop until it returns something true (returned); after `timeout`,
    fail naming `what`, or without `what` return its last value."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := condition():
            return value
        await asyncio.sleep(step)
    value = condition()
    if not value and what is not None:
        raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")
    return value


def job_table(**overrides) -> dict:
    """A quick demo job: the built-in trainer on the synthetic set, two nodes, this test's Python; with a
    `script`, that script (its schedule its own: the trainer's keys are refused for it)."""
    schedule = {} if "script" in overrides else {"epochs": 2, "steps_per_epoch": 20, "batch_size": 32}
    return {"python": sys.executable, "nodes": ["node1", "node2"], **schedule, "port": free_job_port(),
            "stall_timeout": 120.0, "max_restarts": 2, **overrides}


def local_cluster_toml(folder: Path, jobs: str = "", name: str = "here", cluster: str = "", node: str = "") -> Path:
    """folder/cluster.toml whose one node, `here`, is this machine (host = "local", the process runtime: its
    real stats agent, no LAN), its work dir beside `folder` (FOLDER-node), not in the code a job ships from
    `folder`. `jobs`: job tables to add; `cluster`, `node`: more lines of [cluster] and of the node."""
    path = folder / "cluster.toml"
    work = folder.with_name(f"{folder.name}-node")
    path.write_text(f'[cluster]\nname = "{name}"\nwork_dir = "{work}"\n{cluster}\n'
                    f'[[nodes]]\nname = "here"\nhost = "local"\nruntime = "process"\n{node}\n{jobs}')
    return path


def read_metrics(run_dir: Path) -> list[dict]:
    """experiments/RUN-ID/metrics.jsonl, each line with its worker_label."""
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def write_config(sim: SimCluster, path: Path, **job) -> Path:
    """path/cluster.toml for `sim` with one job, "demo" (job_table with `job` overrides)."""
    return sim.write_cluster_toml(path / "cluster.toml", jobs={"demo": job_table(**job)})


def cmdlines(pids) -> dict[int, list[bytes]]:
    """Each process's argv, from /proc (one that ended while read is left out)."""
    found = {}
    for pid in pids:
        try:
            found[pid] = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
    return found


def worker_processes(sim: SimCluster) -> list[int]:
    """Training processes running on the simulated nodes (not their supervisors, whose command
    line carries the worker's argv after `python -c SCRIPT start ... --`)."""
    found = []
    for pid, argv in cmdlines(sim.pids()).items():
        # the built-in trainer, a user's script through user_script.py, a script run by itself, torchrun,
        # or a process torchrun started (`python -u SCRIPT`)
        if argv[1:3] in ([b"-m", b"homegpu.trainer"], [b"-m", b"homegpu.trainer.user_script"],
                         [b"-m", b"homegpu.trainer.torchrun"]) \
                or any(arg.endswith((b"train.py", b"multinode.py")) for arg in argv[1:3]):
            found.append(pid)
    return found


def run_and_strike(config: Path, cwd: Path, cue: str, strike, job: str = "demo") -> tuple[int, str]:
    """Run `job` through `homegpu run`; when a line contains `cue`, call strike(). (status, output)"""
    process = subprocess.Popen(homegpu_argv("--config", str(config), "run", job, "--no-tui"), cwd=cwd,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    output = []
    try:
        for line in process.stdout:
            output.append(line)
            if cue in line:
                strike()
                break
        output += process.stdout.readlines()
        process.wait(timeout=600)
    finally:
        process.kill()
    return process.returncode, "".join(output)


@contextlib.contextmanager
def node1_engine_holding(sim_cluster: SimCluster, image: str, folder: Path) -> Iterator[NodeEngine]:
    """node1 with a Docker engine of its own holding `image`, copied there by homegpu's `image copy` from node3
    (which uses this machine's engine), for the block."""
    with own_engines(sim_cluster, ["node1"]) as engines:
        toml = sim_cluster.write_cluster_toml(folder / "cluster.toml", runtime="docker")
        copy = homegpu("--config", str(toml), "image", "copy", image, "--from", "node3", "--to", "node1",
                       timeout=900)
        assert copy.returncode == 0, copy.stdout + copy.stderr
        yield engines["node1"]


def init_demo(sim_cluster: SimCluster, tmp_path: Path, framework: str) -> Path:
    """`homegpu init --framework FRAMEWORK` for process nodes node1 and node2 in tmp_path, then what a user adds by
    hand: the python with the framework on the nodes (this one), the nodes' known keys and a free job port."""
    made = homegpu("init", "--framework", framework, "--runtime", "process", "--node", "node1=node1",
                   "--node", "node2=node2", cwd=tmp_path)
    assert made.returncode == 0, made.stdout + made.stderr
    config = tmp_path / "cluster.toml"
    text = config.read_text().replace('runtime = "process"\n', f'runtime = "process"\npython = "{sys.executable}"\n')
    text = text.replace('name = "home"\n', f'name = "home"\nknown_hosts = "{sim_cluster.known_hosts_path}"\n', 1)
    text = text.replace("port = 29500\n", "").replace("[jobs.demo]\n", f"[jobs.demo]\nport = {free_job_port()}\n")
    config.write_text(text)
    return config


def run_init_demo(sim_cluster: SimCluster, tmp_path: Path, framework: str) -> Path:
    """init_demo, then `homegpu run demo --no-tui`: it succeeds and both nodes end its 5 epochs above 80% accuracy.
    Returns the run's folder."""
    init_demo(sim_cluster, tmp_path, framework)
    result = homegpu("run", "demo", "--no-tui", cwd=tmp_path, timeout=400)
    print(result.stdout[-3000:])
    assert result.returncode == 0, result.stdout + result.stderr
    for node in ("node1", "node2"):
        last = [line for line in result.stdout.splitlines() if line.startswith(f"{node} * epoch 5/5")]
        assert last and float(last[0].split("accuracy ")[1].split()[0]) > 0.8, result.stdout
    (run_dir,) = (tmp_path / "experiments").iterdir()
    return run_dir


def assert_one_container_exited_ok(engine: NodeEngine, job: str) -> None:
    """The engine ran one container of `job`, on the host's network, and it exited 0."""
    client = engine.client()
    try:
        (container,) = client.containers.list(all=True, filters={"label": f"homegpu.job={job}"})
        assert container.status == "exited" and container.attrs["State"]["ExitCode"] == 0
        assert container.attrs["HostConfig"]["NetworkMode"] == "host"
    finally:
        client.close()


NOBODY = 65534


def nobody_argv(code: str) -> list[str]:
    """argv of a Python that imports homegpu's CLI and queue as this user (root), then becomes user nobody
    before it runs `code`: a second Unix user, wherever the checkout lives. Needs root."""
    tiers.need("root")
    assert os.geteuid() == 0, "this test switches to user nobody: run the suite as root (CI does)"
    # build_parser imports the subcommands' modules while root can still read the Python they come from.
    prelude = ("import os, sys\nimport homegpu.tui.cli.main, homegpu.tui.cli.queue, homegpu.remote.queue\n"
               "homegpu.tui.cli.main.build_parser()\n"
               f"os.setgroups([]); os.setgid({NOBODY}); os.setuid({NOBODY})\n")
    return [sys.executable, "-c", prelude + code]


def as_nobody(code: str, timeout: float = 90) -> subprocess.CompletedProcess[str]:
    """Run `code` as user nobody (nobody_argv) to its end."""
    return subprocess.run(nobody_argv(code), capture_output=True, text=True, timeout=timeout, cwd="/")


def edited_copy(source: Path, folder: Path, edits: Sequence[tuple[str, str]]) -> Path:
    """folder/<source's name>: `source` with each (old, new) edit made once, as a user changes a published script;
    every `old` must be there."""
    text = source.read_text()
    for old, new in edits:
        assert text.count(old) == 1, f"{source.name} has {text.count(old)} of {old!r}"
        text = text.replace(old, new)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / source.name).write_text(text)
    return folder / source.name

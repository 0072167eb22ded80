"""Who owns each GPU process, end to end: a node running a homegpu job's worker and a stranger's process.

node3 of the simulated cluster has a replaying nvidia-smi first on its PATH (conftest.EXTRA_PATH_NODE):
there is no GPU here, so its answers are the H100's recorded output. The recording's pids are the
recording machine's, so the test starts real processes on node3 (the job's worker, started by
`homegpu run`, and a `sleep` run as `nobody` in node3's network namespace) and has the replay list
the recorded training process under their pids instead (gpu_replay.write_apps_with_pids). The rest
is real: the agent on node3 looks the pids up in /proc, `homegpu status --json` and preflight say
what it found, and the TUI's node detail is rendered from the cluster's own stats.
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator


from gpu_replay import FIXTURES, nvidia_smi_in, write_apps_with_pids
from helpers import homegpu, homegpu_argv, wait_for
from simcluster import SimCluster, SimNode, free_job_port

from homegpu.remote.config.cluster_spec import load_cluster
from homegpu.remote.nodes.cluster import Cluster
from homegpu.tui.view.render import node_detail
from homegpu.tui.view.state import NodeView


H100 = FIXTURES / "h100-80gb-hbm3"
NOBODY = 65534
RECORDED_MIB = 20076  # the recorded training process's memory (apps_load.csv)
HOLD = "import time\nprint('holding GPU 0', flush=True)\ntime.sleep(600)\n"


def replaying_node3(sim: SimCluster, apps: Path):
    """node3's nvidia-smi replays the H100 under load with the compute apps in `apps`; restored after."""
    return nvidia_smi_in(sim.node("node3").extra_path, H100 / "gpus_load.csv", apps,
                         version_fixture=H100 / "smi_version.txt")


def uid_of(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("Uid:"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


@contextmanager
def strangers_process(node: SimNode) -> Iterator[int]:
    """`sleep` as user nobody on `node` (in its network namespace); its pid."""
    argv = node.in_namespace(["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "sleep", "600"])
    proc = subprocess.Popen(argv)
    try:
        wait_for(lambda: uid_of(proc.pid) == NOBODY, 10, "the stranger's process to run as nobody")
        yield proc.pid
    finally:
        proc.kill()
        proc.wait()


def worker_of_run(run_id: str) -> int | None:
    """The process whose environment carries `run_id` as homegpu's worker marker."""
    marker = f"HOMEGPU_RUN_ID={run_id}".encode()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if marker in (entry / "environ").read_bytes().split(b"\0"):
                    return int(entry.name)
            except OSError:
                continue
    return None


def run_id_from(line: str) -> str:
    """`== hold running (run hold-2026..., generation 1, restarts 0)` → the run id."""
    return line.split("(run ", 1)[1].split(",", 1)[0]


async def node3_detail(config: Path, run_id: str) -> str:
    """The TUI's node detail of node3, from the cluster's own stats (as the app draws it)."""
    async with Cluster(load_cluster(config)) as cluster:
        await cluster.wait_settled(timeout=60)
        session = cluster.node("node3")
        await session.wait_for(lambda n: n.latest is not None and len(n.latest.gpus[0].processes) == 2, 30)
        view = NodeView("node3", "node3")
        view.take_stats(session.latest)
    return node_detail(view, 100, run_id).plain


def test_status_preflight_and_the_tui_name_each_gpu_process_owner(sim_cluster: SimCluster, tmp_path: Path):
    apps = tmp_path / "apps.csv"
    code = tmp_path / "hold"
    code.mkdir()
    (code / "hold.py").write_text(HOLD)
    config = sim_cluster.write_cluster_toml(tmp_path / "cluster.toml", jobs={"hold": {
        "python": sys.executable, "script": "hold/hold.py", "nodes": ["node3"], "port": free_job_port(),
        "max_restarts": 0}})
    with strangers_process(sim_cluster.node("node3")) as stranger, replaying_node3(sim_cluster, apps):
        write_apps_with_pids(H100 / "apps_load.csv", [stranger], apps)  # before the run: the stranger only
        run = subprocess.Popen(homegpu_argv("--config", str(config), "run", "hold", "--no-tui"), cwd=tmp_path,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        output = []
        try:
            for line in run.stdout:
                output.append(line)
                if line.startswith("== hold running"):
                    break
            text = "".join(output)
            assert "== hold running" in text, text
            run_id = run_id_from(output[-1])
            # Preflight warned (and went on) about the stranger's memory on the job's GPU.
            assert (f"preflight node3: ⚠ node3: GPU 0 already holds 19.6 GiB (25%) for pid {stranger} python3 "
                    "(user nobody)") in text, text

            worker = wait_for(lambda: worker_of_run(run_id), 30, "the job's worker process")
            write_apps_with_pids(H100 / "apps_load.csv", [worker, stranger], apps)  # both hold the GPU now
            status = homegpu("--config", str(config), "status", "--json")
            table = homegpu("--config", str(config), "status")
            detail = asyncio.run(node3_detail(config, run_id))
        finally:
            run.send_signal(signal.SIGINT)
            rest = run.communicate(timeout=120)[0]
    assert run.returncode == 130, rest  # stopped with Ctrl-C: every worker stopped (README's exit statuses)

    report = json.loads(status.stdout)
    [node3] = [node for node in report["nodes"] if node["name"] == "node3"]
    processes = {p["pid"]: p for p in node3["stats"]["gpus"][0]["processes"]}
    assert processes[worker]["owner"] == {
        "kind": "worker", "run_id": run_id, "job": "hold", "index": 0, "user": "root", "uid": 0,
        "container": None, "container_name": None, "gpu_memory": None}  # its job has no gpu_memory
    assert processes[stranger]["owner"] == {
        "kind": "process", "user": "nobody", "uid": NOBODY, "run_id": None, "job": None, "index": None,
        "container": None, "container_name": None, "gpu_memory": None}
    assert processes[stranger]["mem"] == processes[worker]["mem"] == RECORDED_MIB

    assert f"pid {worker:<7} python3" in table.stdout and f"homegpu worker 0 of job hold run {run_id}" in table.stdout
    assert f"pid {stranger:<7} python3" in table.stdout and "user nobody" in table.stdout

    assert f"pid {worker} python3 (19.6 GiB) this job's worker 0" in detail, detail
    assert f"pid {stranger} python3 (19.6 GiB) user nobody" in detail, detail

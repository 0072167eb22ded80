"""`homegpu serve` records the cluster's history on the test LAN and `homegpu history` reads it back: a job's GPU
time, a node cut off and back, and a serve killed (SIGKILL, as a crash) and started again, as systemd's
Restart=on-failure would, keeping its store.

node3's nvidia-smi replays output recorded on a real H100 (these machines have no GPU); its process list is
rewritten to name the job's real worker pid, as the GPU would list it, so the agent finds its owner.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from contextlib import closing, contextmanager
from pathlib import Path
from typing import Iterator


from gpu_replay import FIXTURES, write_apps_with_pids
from helpers import homegpu, homegpu_argv, wait_for
from homegpu.remote.config import load_cluster
from homegpu.remote.history import history_path
from simcluster import SimCluster, free_job_port
from test_gpu_owners_cluster import replaying_node3, run_id_from, worker_of_run


H100 = FIXTURES / "h100-80gb-hbm3"
HOLD_SECONDS = 20
CUT_SECONDS = 15
HOLD = f"import time\nprint('holding GPU 0', flush=True)\ntime.sleep({HOLD_SECONDS})\n"


def newest_gpu_sample(config: Path) -> float:
    """The time of the newest GPU sample serve has written to the history (0 before the first)."""
    path = history_path(load_cluster(config))
    if not path.is_file():
        return 0.0
    with closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=10)) as db:
        return db.execute("SELECT max(t) FROM gpu_samples").fetchone()[0] or 0.0


def recorded_after(config: Path, moment: float, what: str) -> float:
    """Wait until serve has written a GPU sample newer than `moment`."""
    return wait_for(lambda: (newest := newest_gpu_sample(config)) > moment and newest, 60, what, step=0.5)


@contextmanager
def serve_process(config: Path) -> Iterator[subprocess.Popen]:
    process = subprocess.Popen(homegpu_argv("--config", str(config), "serve", "--metrics-port", "0"),
                               cwd=config.parent, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        first = process.stdout.readline()
        assert first.startswith("homegpu serve:"), first + process.stdout.read()
        yield process
    finally:
        if process.poll() is None:
            process.terminate()
            assert process.wait(timeout=30) == 0


def test_history_shows_a_runs_gpu_time_a_nodes_offline_spell_and_survives_a_killed_serve(sim_cluster: SimCluster,
                                                                                          tmp_path: Path, monkeypatch):
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))  # every homegpu below inherits it
    (tmp_path / "hold").mkdir()
    (tmp_path / "hold" / "hold.py").write_text(HOLD)
    config = sim_cluster.write_cluster_toml(tmp_path / "cluster.toml", jobs={"hold": {
        "python": sys.executable, "script": "hold/hold.py", "nodes": ["node3"], "port": free_job_port(),
        "max_restarts": 0}})
    apps = tmp_path / "apps.csv"
    write_apps_with_pids(H100 / "apps_load.csv", [os.getpid()], apps)  # a stranger's process (this test's) at first
    node1 = sim_cluster.node("node1")
    with replaying_node3(sim_cluster, apps):
        with serve_process(config) as first:
            # samples through more than one of history's 10 m / 48 slices (12.5 s) before anything happens
            recorded_after(config, recorded_after(config, 0, "serve's first GPU sample") + 15, "15 s of samples")
            run = subprocess.Popen(homegpu_argv("--config", str(config), "run", "hold", "--no-tui"), cwd=tmp_path,
                                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            line = wait_for(lambda: next((l for l in iter(run.stdout.readline, "") if l.startswith("== hold running")),
                                         None), 60, "the run to start")
            run_id = run_id_from(line)
            worker = wait_for(lambda: worker_of_run(run_id), 30, "the job's worker process")
            write_apps_with_pids(H100 / "apps_load.csv", [worker], apps)  # the worker holds the GPU now
            node1.cut_link()
            cut_at = time.time()
            time.sleep(CUT_SECONDS)
            node1.restore_link()
            assert run.wait(timeout=120) == 0, run.stdout.read()
            write_apps_with_pids(H100 / "apps_load.csv", [os.getpid()], apps)
            recorded_after(config, time.time() + 2, "samples after the run")
            first.send_signal(signal.SIGKILL)  # a crash: nothing flushed on the way out
            first.wait(timeout=10)
            killed_at = time.time()
        time.sleep(2)  # serve is down for 2 s
        restarted_at = killed_at + 2
        with serve_process(config):  # what systemd's Restart=on-failure does
            recorded_after(config, restarted_at + 5, "samples after the restart")
    result = homegpu("--config", str(config), "history", "--since", "10m", "--json", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    history = json.loads(result.stdout)
    print(homegpu("--config", str(config), "history", "--since", "10m", cwd=tmp_path).stdout)  # as a user sees it

    (hours,) = [r for r in history["gpu_hours_by_run"] if r["run_id"] == run_id]
    assert hours["job"] == "hold" and hours["user"]
    held = hours["gpu_hours"] * 3600  # one GPU: its GPU-seconds are the seconds the worker held it
    assert HOLD_SECONDS * 0.5 <= held <= HOLD_SECONDS + 10, f"the run's GPU time: {held:.1f} s"

    offline = {node["node"]: node for node in history["offline"]}
    (spell,) = offline["node1"]["intervals"]
    assert cut_at <= spell["start"] <= cut_at + 10 and not spell["ongoing"], spell
    assert CUT_SECONDS * 0.3 <= spell["stop"] - spell["start"] <= CUT_SECONDS + 10, spell
    assert offline["node2"]["intervals"] == [] and offline["node3"]["intervals"] == []

    # The store was kept through the crash: samples from before the kill and after the restart, and the
    # GPU's series has nothing missing but about the seconds serve was down.
    (gpu,) = [g for g in history["gpus"] if g["node"] == "node3"]
    recorded = [t for t, util in zip(gpu["times"], gpu["util"]) if util is not None]
    assert min(recorded) < cut_at and max(recorded) > restarted_at, (min(recorded), max(recorded), cut_at)
    missing = [t for t, util in zip(gpu["times"], gpu["util"]) if min(recorded) < t < max(recorded) and util is None]
    assert len(missing) <= 1, f"slices of {600 / len(gpu['times']):.1f} s with no sample: {missing}"

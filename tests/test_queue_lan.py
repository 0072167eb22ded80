"""The queue on the test LAN, as a user drives it: `homegpu serve` runs it, `homegpu submit/queue/cancel` talk
to it, and the runs are real runs of user scripts on the simulated nodes (each its own machine: own network
namespace, address and work dir, reached through sshd).

node3's nvidia-smi replays output recorded on a real H100 (these machines have no GPU); its process list
names a real process run as user nobody in node3's namespace, so the agent finds a stranger holding 19.6 GiB
of GPU 0, as it would on a shared desktop. Emptying the list is that user's job ending.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import pytest
import tomli_w

from gpu_replay import FIXTURES, write_apps_with_pids
from helpers import as_nobody, homegpu, homegpu_argv, wait_for
from simcluster import SimCluster, free_job_port
from test_gpu_owners_cluster import replaying_node3, strangers_process


H100 = FIXTURES / "h100-80gb-hbm3"
# An experiment that runs until the test releases it (its file appears), so that a state such as
# "running" lasts until the test has seen it, however slow the machine.
SLEEPY = """import os, sys, time
print("started", os.environ.get("HOMEGPU_RUN_ID", "?"), "on GPU", os.environ.get("CUDA_VISIBLE_DEVICES"), flush=True)
deadline = time.time() + 600
while len(sys.argv) > 1 and not os.path.exists(sys.argv[1]) and time.time() < deadline:
    time.sleep(0.2)
print("done", flush=True)
"""
BOOM = "raise SystemExit('the experiment is broken: exit 3')\n"
ALERT_LOG = "import sys\nwith open(sys.argv[1], 'a') as log:\n    log.write(' '.join(sys.argv[2:]) + '\\n')\n"


@pytest.fixture
def lab(sim_cluster: SimCluster, tmp_path: Path, monkeypatch) -> Iterator[Path]:
    """A cluster file every user may read (the second user's test reads it), with the night's jobs:
    `sleepy` on node1+node2, `gpu3` on node3 (the replayed GPU), `boom` (fails) on node1, and `share` on node3
    with 19 GiB of GPU memory."""
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))  # serve and the commands inherit it
    folder = Path(tempfile.mkdtemp(prefix="homegpu-lab-"))
    folder.chmod(0o755)
    (folder / "exp").mkdir()
    (folder / "exp" / "sleepy.py").write_text(SLEEPY)
    (folder / "exp" / "boom.py").write_text(BOOM)
    (folder / "alert_log.py").write_text(ALERT_LOG)
    common = {"python": sys.executable, "max_restarts": 0}
    data = sim_cluster.cluster_dict(jobs={
        "sleepy": {**common, "script": "exp/sleepy.py", "nodes": ["node1", "node2"], "port": free_job_port()},
        "gpu3": {**common, "script": "exp/sleepy.py", "nodes": ["node3"], "port": free_job_port()},
        "boom": {**common, "script": "exp/boom.py", "nodes": ["node1"], "port": free_job_port()},
        "share": {**common, "script": "exp/sleepy.py", "nodes": ["node3"], "port": free_job_port(),
                  "gpu_memory": "19GiB"}})
    data["alerts"] = {"queued_runs": True,
                      "command": [sys.executable, str(folder / "alert_log.py"), str(tmp_path / "alerts.txt"),
                                  "{alert}", "{queue_id}", "{run_id}"]}
    config = folder / "cluster.toml"
    config.write_text(tomli_w.dumps(data))
    config.chmod(0o644)
    yield config
    subprocess.run(["rm", "-rf", str(folder)], check=True)


@contextmanager
def serving(config: Path, log: Path, experiments: Path) -> Iterator[subprocess.Popen]:
    """`homegpu serve` for `config`, its output in `log`, until its `queue:` line says it listens."""
    with open(log, "a") as out:
        process = subprocess.Popen(homegpu_argv("--config", str(config), "serve", "--metrics-port", "0",
                                                "--experiments", str(experiments)),
                                   stdout=out, stderr=subprocess.STDOUT, text=True)
    try:
        wait_for(lambda: "\nqueue: " in log.read_text() or process.poll() is not None, 60, "serve to listen")
        assert process.poll() is None, log.read_text()
        yield process
    finally:
        if process.poll() is None:
            process.terminate()
            assert process.wait(timeout=60) == 0, log.read_text()


def queue(config: Path) -> dict[str, dict]:
    result = homegpu("--config", str(config), "queue", "--json")
    assert result.returncode == 0, result.stderr
    return {entry["id"]: entry for entry in json.loads(result.stdout)["entries"]}


def queue_text(config: Path) -> str:
    result = homegpu("--config", str(config), "queue")
    assert result.returncode == 0, result.stderr
    print(result.stdout)  # the note shows the queue at each step (pytest -s)
    return result.stdout


def submit(config: Path, *args: str) -> str:
    result = homegpu("--config", str(config), "submit", *args)
    assert result.returncode == 0, result.stderr
    return result.stdout.split()[0]


def wait_state(config: Path, id_: str, state: str, timeout: float = 300) -> dict:
    return wait_for(lambda: (e := queue(config)[id_])["state"] == state and e, timeout, f"{id_} to be {state}", 0.5)


def until_released(tmp_path: Path, name: str) -> tuple[Path, str]:
    """A release file (made by the test to end a run) and the --set that gives it to SLEEPY."""
    release = tmp_path / f"release-{name}"
    return release, f"args=[{str(release)!r}]"


def test_a_night_of_experiments_in_order_around_another_users_gpu_process(sim_cluster: SimCluster, lab: Path,
                                                                          tmp_path: Path):
    experiments, apps = tmp_path / "experiments", tmp_path / "apps.csv"
    (end_first, first_args), (end_second, second_args), (end_on_gpu, on_gpu_args) = (
        until_released(tmp_path, name) for name in ("first", "second", "on-gpu"))
    with strangers_process(sim_cluster.node("node3")) as stranger, replaying_node3(sim_cluster, apps):
        write_apps_with_pids(H100 / "apps_load.csv", [stranger], apps)  # nobody's python holds 19.6 GiB of GPU 0
        with serving(lab, tmp_path / "serve.log", experiments):
            first = submit(lab, "sleepy", "--set", first_args)
            second = submit(lab, "sleepy", "--after", first, "--set", second_args)
            on_gpu = submit(lab, "gpu3", "--set", on_gpu_args)
            broken = submit(lab, "boom")
            after_broken = submit(lab, "sleepy", "--after", broken)
            assert [first, second, on_gpu, broken, after_broken] == ["q-1", "q-2", "q-3", "q-4", "q-5"]

            wait_state(lab, first, "running")
            waiting = wait_for(lambda: "GPU 0 busy" in (e := queue(lab)[on_gpu])["reason"] and e, 120, "q-3's why")
            assert waiting["state"] == "waiting"
            assert waiting["reason"] == "node3 GPU 0 busy: nobody's python3 holds 19.6 GiB"
            shown = queue_text(lab)
            assert "after q-1" in shown and "nobody's python3 holds 19.6 GiB" in shown
            assert "node node1 busy: q-1 runs there" in queue(lab)[broken]["reason"]

            end_first.touch()
            wait_state(lab, second, "running")
            write_apps_with_pids(H100 / "apps_load.csv", [], apps)  # nobody's job ended: GPU 0 is free
            wait_state(lab, on_gpu, "running")  # while q-2 runs: disjoint nodes overlap
            queue_text(lab)
            end_second.touch()
            end_on_gpu.touch()
            wait_state(lab, after_broken, "cancelled", 300)
            entries = wait_for(lambda: (q := queue(lab)) and all(e["state"] in ("succeeded", "failed", "cancelled")
                                                                 for e in q.values()) and q, 300, "the queue to end")
            queue_text(lab)

    assert [entries[i]["state"] for i in (first, second, on_gpu, broken, after_broken)] == \
        ["succeeded", "succeeded", "succeeded", "failed", "cancelled"]
    assert entries[second]["started"] >= entries[first]["ended"], "q-2 runs after q-1"
    assert entries[on_gpu]["started"] < entries[second]["ended"] and entries[second]["started"] < entries[on_gpu]["ended"], \
        "runs on disjoint nodes overlap"
    assert "the experiment is broken" in entries[broken]["reason"]
    assert entries[after_broken]["reason"] == "after q-4, which failed" and entries[after_broken]["run_id"] == ""
    for id_ in (first, second, on_gpu, broken):  # each left its record, as `homegpu run` does
        assert (experiments / entries[id_]["run_id"] / "logs").is_dir(), id_
    assert "started " + entries[first]["run_id"] in (experiments / entries[first]["run_id"] / "logs" / "node1.log").read_text()
    alerts = (tmp_path / "alerts.txt").read_text().splitlines()
    for id_ in (first, second, on_gpu):
        assert f"queued_run_started {id_} {entries[id_]['run_id']}" in alerts
        assert f"queued_run_succeeded {id_} {entries[id_]['run_id']}" in alerts
    assert f"queued_run_failed {broken} {entries[broken]['run_id']}" in alerts
    assert f"queued_run_cancelled {after_broken} " in [line[:len(f"queued_run_cancelled {after_broken} ")]
                                                       for line in alerts]


def test_runs_with_gpu_memory_share_a_card_around_another_users_process(sim_cluster: SimCluster, lab: Path,
                                                                         tmp_path: Path, home_ssh_config: Path):
    """node3's H100 (81559 MiB) with nobody's python3 holding 19.6 GiB, and a sweep of four runs of one 19 GiB job:
    three fit beside it, each seeing GPU 0 alone; the fourth waits saying who holds the card, and starts when the
    first ends. serve reaches node3 by its alias in ~/.ssh/config, as a user's serve does (no HOMEGPU_SSH_CONFIG)."""
    home_ssh_config.write_text(sim_cluster.ssh_config_path.read_text())
    experiments, apps = tmp_path / "experiments", tmp_path / "apps.csv"
    releases = [until_released(tmp_path, f"share{n}") for n in range(1, 5)]
    with strangers_process(sim_cluster.node("node3")) as stranger, replaying_node3(sim_cluster, apps):
        write_apps_with_pids(H100 / "apps_load.csv", [stranger], apps)
        with serving(lab, tmp_path / "serve.log", experiments):
            ids = [submit(lab, "share", "--set", args) for _, args in releases]
            for id_ in ids[:3]:
                wait_state(lab, id_, "running")
            fourth = wait_for(lambda: "needs" in (e := queue(lab)[ids[3]])["reason"] and e, 120, "q-4's why")
            assert fourth["state"] == "waiting"
            assert fourth["reason"] == ("needs 19.0 GiB on a GPU: the most free is 3.0 GiB on node3 GPU 0, held by "
                                        "nobody's python3 (19.6 GiB), q-1 (19.0 GiB), q-2 (19.0 GiB) and q-3 (19.0 GiB)")
            entries = queue(lab)
            assert [entries[id_]["reason"] for id_ in ids[:3]] == ["on node3 GPU 0 with 19.0 GiB"] * 3
            queue_text(lab)

            releases[0][0].touch()
            wait_state(lab, ids[3], "running")
            for release, _ in releases[1:]:
                release.touch()
            entries = wait_for(lambda: (q := queue(lab)) and all(q[i]["state"] == "succeeded" for i in ids) and q,
                               300, "the four runs to succeed")
    assert entries[ids[3]]["started"] >= entries[ids[0]]["ended"], "q-4 started on the room q-1 left"
    for id_ in ids:
        log = (experiments / entries[id_]["run_id"] / "logs" / "node3.log").read_text()
        assert f"started {entries[id_]['run_id']} on GPU 0" in log


def test_serve_killed_mid_queue_resumes_it_without_running_anything_twice(sim_cluster: SimCluster, lab: Path,
                                                                          tmp_path: Path):
    experiments = tmp_path / "experiments"
    end_long_one, long_args = until_released(tmp_path, "long")
    end_then, then_args = until_released(tmp_path, "then")
    end_then.touch()  # it runs to its end at once
    with serving(lab, tmp_path / "serve.log", experiments) as first_serve:
        long_one = submit(lab, "sleepy", "--set", long_args)
        then = submit(lab, "sleepy", "--after", long_one, "--set", then_args)
        running = wait_state(lab, long_one, "running")
        queue_text(lab)
        first_serve.send_signal(signal.SIGKILL)  # a crash, or the machine's OOM killer
        first_serve.wait(timeout=10)
    gone = homegpu("--config", str(lab), "queue")
    assert gone.returncode == 2 and gone.stderr.count("\n") == 1 and "start one with `homegpu --config" in gone.stderr
    with serving(lab, tmp_path / "serve-again.log", experiments):
        resumed = queue(lab)[long_one]
        assert (resumed["state"], resumed["run_id"]) == ("running", running["run_id"])
        queue_text(lab)
        end_long_one.touch()
        done = wait_state(lab, then, "succeeded", 300)
        entries = queue(lab)
        queue_text(lab)
    assert entries[long_one]["state"] == "succeeded" and entries[long_one]["run_id"] == running["run_id"]
    assert done["started"] >= entries[long_one]["ended"]
    runs = sorted(path.name for path in experiments.iterdir())
    assert runs == sorted([running["run_id"], done["run_id"]]), "one run per entry, none started again"
    worker_log = (experiments / running["run_id"] / "logs" / "node1.log").read_text()
    assert worker_log.count("started ") == 1 and "done" in worker_log


def test_another_user_is_refused_by_serve_in_one_line(sim_cluster: SimCluster, lab: Path, tmp_path: Path):
    with serving(lab, tmp_path / "serve.log", tmp_path / "experiments"):
        result = as_nobody(f"sys.exit(homegpu.tui.cli.main.main(['--config', {str(lab)!r}, 'submit', 'sleepy']))")
        assert result.returncode == 2, result.stderr
        assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
        assert "this cluster's queue is root's" in result.stderr
        assert queue(lab) == {}

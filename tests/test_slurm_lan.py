"""homegpu on a lab's Slurm (issue 39), on the test LAN with Slurm's own daemons (tests/simslurm.py): node1 is the
login node (`slurm_login`, by its ssh alias), node2 and node3 the compute nodes, each with its slurmd in its own
namespace. `homegpu run` asks sbatch on node1 for two nodes and trains on the two Slurm allocated; a second run
waits in Slurm's queue, which `homegpu queue` shows in homegpu's words, until `homegpu cancel` ends the first; a
partition Slurm does not have is refused in one line, and Ctrl-C cancels the run's Slurm job.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import tomli_w

from helpers import homegpu, homegpu_argv, job_table, run_and_strike, wait_for, worker_processes
from simcluster import SimCluster, own_cluster
from simslurm import SimSlurm
from test_queue_lan import serving, submit

TUTORIAL_SCRIPT = Path(__file__).parent / "fixtures" / "scripts" / "tf_tutorial_backup.py"
HOLD_SCRIPT = 'import time\nprint("holding", flush=True)\ntime.sleep(900)\n'


@pytest.fixture
def lab(lan) -> Iterator[SimCluster]:
    with own_cluster(3, first_host=130, name="lab") as cluster:
        yield cluster


def lab_toml(cluster: SimCluster, path: Path, login_by_alias: bool = False, node_overrides: dict | None = None,
             **jobs: dict) -> Path:
    """A lab's cluster file: scheduler slurm, node1 the login node (a [[nodes]] of the file, or with `login_by_alias`
    only its ssh config alias, as a login node that trains nothing is); each job on whatever nodes Slurm gives."""
    tables = {name: {key: value for key, value in table.items() if key != "nodes"} for name, table in jobs.items()}
    login = cluster.node("node1").alias if login_by_alias else "node1"
    data = cluster.cluster_dict(scheduler="slurm", slurm_login=login, jobs=tables, node_overrides=node_overrides)
    if login_by_alias:
        data["nodes"] = [node for node in data["nodes"] if node["name"] != "node1"]
    path.write_text(tomli_w.dumps(data))
    return path


def slurm_state(slurm: SimSlurm, job_id: str) -> str:
    result = slurm.run(["squeue", "--noheader", "--states=all", f"--jobs={job_id}", "--format=%T"])
    return result.stdout.strip()


def started(path: Path, config: Path, job: str, cwd: Path) -> tuple[subprocess.Popen, Path]:
    """`homegpu run JOB --no-tui` in the background, its output into a file (read while it runs)."""
    out = path / f"{job}.out"
    process = subprocess.Popen(homegpu_argv("--config", str(config), "run", job, "--no-tui"), cwd=cwd,
                               stdout=out.open("w"), stderr=subprocess.STDOUT, text=True)
    return process, out


def holding(out: Path) -> bool:
    """Both workers of the hold script started (each printed its line)."""
    return len(re.findall(r"^ *node[23] \| holding$", out.read_text(), re.M)) == 2


def slurm_id(out: Path | str) -> str:
    text = out if isinstance(out, str) else out.read_text()
    found = re.search(r"Slurm job (\d+) submitted on node1 for 2 node\(s\)", text)
    return found[1] if found else ""


def test_a_run_trains_on_the_two_nodes_slurm_allocated_and_its_slurm_job_completes(lab, tmp_path):
    with SimSlurm(lab, ["node2", "node3"]) as slurm:
        config = lab_toml(lab, tmp_path / "cluster.toml", login_by_alias=True, train=job_table())
        result = homegpu("--config", str(config), "run", "train", "--no-tui", cwd=tmp_path, timeout=600)
        print(result.stdout, result.stderr)
        assert result.returncode == 0, result.stdout + result.stderr
        login = re.escape(lab.node("node1").alias)
        submitted = re.search(rf"Slurm job (\d+) submitted on {login} for 2 node\(s\)", result.stdout)
        assert submitted, result.stdout
        assert f"Slurm job {submitted[1]} runs on node2, node3" in result.stdout
        summary = result.stdout[result.stdout.index("run succeeded"):]
        assert re.search(r"^\s+node2 +0 +2 ", summary, re.M) and re.search(r"^\s+node3 +0 +2 ", summary, re.M), summary
        assert "node1" not in summary  # the login node submits; it trains nothing
        wait_for(lambda: slurm_state(slurm, submitted[1]) == "COMPLETED", 30, "the Slurm job COMPLETED, not CANCELLED")
        assert not worker_processes(lab)


def test_a_tutorial_script_trains_on_slurms_nodes_and_a_killed_worker_restarts_inside_the_allocation(lab, tmp_path):
    """The TensorFlow tutorial's script, unchanged, on the two nodes Slurm allocated; a worker killed mid-run makes
    homegpu restart every worker on the same nodes, inside the same Slurm job, which then COMPLETED."""
    (tmp_path / "tutorial").mkdir()
    shutil.copy(TUTORIAL_SCRIPT, tmp_path / "tutorial" / "train.py")
    with SimSlurm(lab, ["node2", "node3"]) as slurm:
        config = lab_toml(lab, tmp_path / "cluster.toml", tutorial=job_table(script="tutorial/train.py", args=["4"]))

        def kill_worker_on_node3():
            victims = set(worker_processes(lab)) & lab.node("node3").pids()
            assert victims, "node3's worker not found"
            for pid in victims:
                os.kill(pid, signal.SIGKILL)

        status, text = run_and_strike(config, tmp_path, "node3 | Epoch 2/4", kill_worker_on_node3, job="tutorial")
        print(text)
        assert status == 0, text
        (submitted,) = re.findall(r"Slurm job (\d+) submitted on node1 for 2 node\(s\)", text)  # once, not per try
        assert f"Slurm job {submitted} runs on node2, node3" in text and "generation 2" in text, text
        wait_for(lambda: slurm_state(slurm, submitted) == "COMPLETED", 30, "the Slurm job COMPLETED")
        assert not worker_processes(lab)


def test_a_second_run_waits_in_slurms_queue_until_the_first_is_cancelled(lab, tmp_path):
    (tmp_path / "hold").mkdir()
    (tmp_path / "hold" / "hold.py").write_text(HOLD_SCRIPT)
    hold = job_table(script="hold/hold.py")
    with SimSlurm(lab, ["node2", "node3"]) as slurm:
        config = lab_toml(lab, tmp_path / "cluster.toml", first=hold, second=hold, bad=job_table(partition="nope"))
        refused = homegpu("--config", str(config), "run", "bad", "--no-tui", cwd=tmp_path)
        assert refused.returncode == 1 and refused.stderr.count("\n") == 1, refused.stderr
        assert "partition 'nope' does not exist: set partition in [jobs.bad] to one of: debug" in refused.stderr

        cut = lab_toml(lab, tmp_path / "cut.toml", node_overrides={"node3": {"port": 2}}, first=hold)
        unreachable = homegpu("--config", str(cut), "run", "first", "--no-tui", cwd=tmp_path)
        assert unreachable.returncode == 1 and unreachable.stderr.count("\n") == 1, unreachable.stderr
        assert "Slurm allocated node2, node3 to first, and homegpu cannot reach them all over SSH: node3 is " \
            in unreachable.stderr
        assert not worker_processes(lab)
        wait_for(lambda: slurm_state(slurm, slurm_id(unreachable.stdout)) == "CANCELLED", 30, "its Slurm job cancelled")

        first, first_out = started(tmp_path, config, "first", tmp_path)
        second = None
        try:
            wait_for(lambda: holding(first_out) or first.poll() is not None, 120, "the first run's workers to start")
            first_id = slurm_id(first_out)
            assert first.poll() is None and first_id, first_out.read_text()
            second, second_out = started(tmp_path, config, "second", tmp_path)
            waiting = "Slurm job {}: waiting for 2 nodes in partition debug"
            wait_for(lambda: slurm_id(second_out) and waiting.format(slurm_id(second_out)) in second_out.read_text(),
                     60, "the second run to wait for nodes")
            second_id = slurm_id(second_out)

            queue = homegpu("--config", str(config), "queue", cwd=tmp_path)
            print(queue.stdout)  # what a user saw (pytest -s)
            assert queue.returncode == 0, queue.stderr
            rows = {line.split()[0]: line for line in queue.stdout.splitlines()[1:]}
            assert re.search(rf"^\s*{first_id}\s+first\s+running\s+first-\S+\s+running on node\[2-3\] for ",
                             rows[first_id]), queue.stdout
            assert re.search(r"waiting\s+second-\S+\s+waiting for 2 nodes in partition debug$", rows[second_id]), \
                queue.stdout

            cancelled = homegpu("--config", str(config), "cancel", first_id, cwd=tmp_path)
            assert cancelled.returncode == 0 and f"Slurm job {first_id} (first, run first-" in cancelled.stdout
            assert first.wait(timeout=120) == 1
            assert f"Slurm ended job {first_id}, which held the run's nodes: cancelled" in first_out.read_text()
            wait_for(lambda: holding(second_out), 120, "the second run to start")
            assert f"Slurm job {second_id} runs on node2, node3" in second_out.read_text()

            second.send_signal(signal.SIGINT)  # Ctrl-C: the workers stop and the Slurm job is cancelled
            assert second.wait(timeout=120) == 130, second_out.read_text()
            print(first_out.read_text(), second_out.read_text())
            wait_for(lambda: slurm_state(slurm, second_id) == "CANCELLED", 30, "the second Slurm job cancelled")
            assert not worker_processes(lab)
        finally:
            for process in (first, second):
                if process is not None and process.poll() is None:
                    process.kill()


def test_serve_submits_queued_runs_to_slurm_and_follows_each_to_its_end(lab, tmp_path):
    """`homegpu submit` goes to serve, which submits each entry to Slurm at once (Slurm decides when it runs): one
    --after the first waits in Slurm on the first's Slurm job (afterok), another waits for the nodes the first holds,
    each saying so in serve's queue; every one then runs, and ends COMPLETED in Slurm."""
    (tmp_path / "short").mkdir()
    (tmp_path / "short" / "short.py").write_text(
        'import sys, time\nprint("working", flush=True)\ntime.sleep(float(sys.argv[1]))\n')
    short = job_table(script="short/short.py", args=["3"])
    with SimSlurm(lab, ["node2", "node3"]) as slurm:  # the first holds both nodes long enough to see the others wait
        config = lab_toml(lab, tmp_path / "cluster.toml", first=short | {"args": ["60"]}, second=short, third=short)
        with serving(config, tmp_path / "serve.log", tmp_path / "experiments"):
            first = submit(config, "first")
            # Slurm's id for it, from homegpu's list of its Slurm jobs: the entry's own "Slurm job N: waiting" lasts only
            # until Slurm starts it, which on an idle lab is at once
            first_job = wait_for(lambda: next((job["slurm_id"] for job in slurm_jobs(config, tmp_path)
                                               if job["job"] == "first"), None), 180, "the first in Slurm's queue")
            second, third = submit(config, "second", "--after", first), submit(config, "third")
            wait_for(lambda: re.fullmatch(rf"Slurm job \d+: waiting for job {first_job} to succeed",
                                          entries(config)[second]["reason"]), 120, "the second to wait on the first")
            waits = wait_for(lambda: re.fullmatch(r"Slurm job (\d+): waiting for 2 nodes in partition debug",
                                                  entries(config)[third]["reason"]), 120, "the third to wait for nodes")
            both = homegpu("--config", str(config), "queue", cwd=tmp_path)
            print(both.stdout)
            assert re.search(rf"^\s*{waits[1]}\s+third\s+waiting\s+third-\S+\s+waiting for 2 nodes", both.stdout,
                             re.M), both.stdout
            assert re.search(rf"^\s*{third}\s+third\s+waiting\s", both.stdout, re.M), both.stdout  # serve's own
            for id_ in (first, second, third):
                wait_for(lambda: entries(config)[id_]["state"] == "succeeded", 240, f"{id_} to succeed")
        ids = [job["slurm_id"] for job in slurm_jobs(config, tmp_path)]
        assert len(ids) == 3 and {slurm_state(slurm, id_) for id_ in ids} == {"COMPLETED"}
        assert not worker_processes(lab)


def entries(config: Path) -> dict[str, dict]:
    """serve's queue entries by id (homegpu queue --json)."""
    result = homegpu("--config", str(config), "queue", "--json")
    assert result.returncode == 0, result.stderr
    return {entry["id"]: entry for entry in json.loads(result.stdout)["entries"]}


def slurm_jobs(config: Path, cwd: Path) -> list[dict]:
    result = homegpu("--config", str(config), "queue", "--json", cwd=cwd)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)["slurm_jobs"]

"""Jobs on the process runtime: real sshd nodes, real TensorFlow MultiWorkerMirroredStrategy.

Every run goes through the `homegpu` command as a user would type it. The workers are plain
processes on the simulated machines (node1 and node2 of tests/simcluster.py), started by homegpu over SSH.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path


from helpers import (
    homegpu, homegpu_argv, job_table, read_metrics, run_and_strike, wait_for, worker_processes, write_config,
)
from simcluster import free_job_port

from homegpu.remote.record.timeline import load_timeline


TUTORIAL = Path(__file__).parent / "fixtures" / "trainer" / "tutorial_script.py"


def only_run(tmp_path: Path) -> Path:
    (run_dir,) = (tmp_path / "experiments").iterdir()
    return run_dir


def test_demo_job_trains_across_two_nodes(sim_cluster, tmp_path):
    config = write_config(sim_cluster, tmp_path)
    result = homegpu("--config", str(config), "run", "demo", "--no-tui", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "preflight node1: ready" in result.stdout and "preflight node2: ready" in result.stdout
    assert "run succeeded" in result.stdout
    run_dir = only_run(tmp_path)
    epochs = [m for m in read_metrics(run_dir) if m.get("event") == "epoch"]
    assert {m["worker_label"] for m in epochs} == {"node1", "node2"}
    assert max(m["epoch"] for m in epochs) == 2
    assert (run_dir / "logs" / "node1.log").stat().st_size > 0
    assert (run_dir / "logs" / "node2.log").stat().st_size > 0
    assert any((run_dir / "output" / "model").iterdir()), "the chief's model was not fetched"
    assert not worker_processes(sim_cluster)
    for node in ("node1", "node2"):  # the model is home: the workers' backups are gone from their disks
        outs = list(sim_cluster.node(node).work_dir.glob(f"runs/{run_dir.name}/out/*"))
        assert outs and not any((out / "backup").exists() for out in outs), outs
        remembered = sim_cluster.node(node).work_dir / "import-checks.json"  # preflight's import, on its disk
        assert stat.S_IMODE(remembered.stat().st_mode) == 0o600, remembered
        said = [entry["said"] for entry in json.loads(remembered.read_text()).values()]
        assert said == [metadata.version("tensorflow")], said


def test_killed_worker_restarts_everyone_and_resumes(sim_cluster, tmp_path):
    config = write_config(sim_cluster, tmp_path, epochs=4, steps_per_epoch=30)

    def kill_worker_1():
        victim = [pid for pid in worker_processes(sim_cluster) if _index_of(pid) == 1]
        assert victim, "worker 1 not found"
        os.kill(victim[0], signal.SIGKILL)

    status, text = run_and_strike(config, tmp_path, "node2 * epoch 1/4", kill_worker_1)
    assert status == 0, text
    assert "restarting" in text and "generation 2" in text
    starts = [m for m in read_metrics(only_run(tmp_path)) if m.get("event") == "start"]
    assert any(m.get("initial_epoch", 0) >= 1 for m in starts), "training did not resume from the backup"
    assert not worker_processes(sim_cluster)
    # The run's timeline: every node's samples, and each kind of event a restarted run has.
    timeline = load_timeline(only_run(tmp_path) / "timeline.sqlite")
    kinds = {event.kind for event in timeline.events}
    assert {"preflight", "launch", "running", "worker_start", "worker_exit", "restart", "end"} <= kinds, kinds
    (restart,) = timeline.events_of("restart")
    assert "node2" in restart.summary and "SIGKILL" in restart.summary, restart
    assert {node.name for node in timeline.nodes} == {"node1", "node2"}
    assert all(len(node.cpu.values) >= 3 for node in timeline.nodes)
    assert (only_run(tmp_path) / "report.html").is_file() and "report.html" in text


def test_a_node_that_dies_mid_job_is_waited_for_then_the_run_fails_naming_it(sim_cluster, tmp_path):
    """The machine itself goes away for good: the restart waits reconnect_timeout for it (using up one
    restart, not one per try against the offline node), then the run fails saying why."""
    config = write_config(sim_cluster, tmp_path, epochs=20, steps_per_epoch=20, max_restarts=2,
                          reconnect_timeout=8)
    node2 = sim_cluster.node("node2")
    try:
        status, text = run_and_strike(config, tmp_path, "node2 * epoch 1/20", node2.kill)
    finally:
        node2.restart()
    assert status == 1, text
    assert "waiting up to 8 s for node2 to come back (offline)" in text, text
    assert "restart failed: node2 did not come back within 8 s (offline: " in text, text
    assert "restarts 1" in text and "restarts 2" not in text, text
    assert not any(line.startswith("Traceback") for line in text.splitlines()), text  # the workers' own may show
    assert not worker_processes(sim_cluster)


def _index_of(pid: int) -> int | None:
    env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    for item in env:
        if item.startswith(b"TF_CONFIG="):
            return json.loads(item[len(b"TF_CONFIG="):])["task"]["index"]
    return None


def test_stopped_worker_trips_the_stall_watchdog(sim_cluster, tmp_path):
    """A SIGSTOPped worker prints nothing and never exits: only the watchdog can notice.

    One worker, so no peer notices first: with two, TensorFlow's own collective health check
    fails the chief within seconds, which restarts the job through the exit-status path
    (test_killed_worker_restarts_everyone_and_resumes covers that path).
    """
    config = write_config(sim_cluster, tmp_path, nodes=["node1"], epochs=3, steps_per_epoch=30,
                          stall_timeout=25.0)  # over TensorFlow's import on a busy 2-core machine

    def stop_the_worker():
        (victim,) = worker_processes(sim_cluster)
        os.kill(victim, signal.SIGSTOP)

    status, text = run_and_strike(config, tmp_path, "node1 * epoch 1/3", stop_the_worker)
    assert "no progress for 25s (stalled)" in text and "restarting" in text, text
    assert status == 0, text
    starts = [m for m in read_metrics(only_run(tmp_path)) if m.get("event") == "start"]
    assert starts[-1]["initial_epoch"] >= 1, "training did not resume from the backup"
    assert not worker_processes(sim_cluster)


def test_killed_homegpu_reattaches_without_duplicates_and_stop_cleans_up(sim_cluster, tmp_path):
    config = write_config(sim_cluster, tmp_path, epochs=50, steps_per_epoch=30)
    first = subprocess.Popen(homegpu_argv("--config", str(config), "run", "demo", "--no-tui"), cwd=tmp_path,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        for line in first.stdout:
            if "epoch 1/50" in line:
                break
        first.kill()  # homegpu dies; the workers live on their nodes
        first.wait()
        running = worker_processes(sim_cluster)
        assert len(running) == 2

        second = subprocess.Popen(homegpu_argv("--config", str(config), "run", "demo", "--no-tui"), cwd=tmp_path,
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            attach_line = second.stdout.readline()
            while "attaching" not in attach_line and attach_line:
                attach_line = second.stdout.readline()
            assert "already running" in attach_line
            wait_for(lambda: "epoch" in second.stdout.readline(), 120, "progress after attaching")
            assert sorted(worker_processes(sim_cluster)) == sorted(running), "a duplicate worker was started"
        finally:
            second.kill()
            second.wait()

        listing = homegpu("--config", str(config), "jobs", cwd=tmp_path)
        assert listing.returncode == 0 and listing.stdout.count("running") == 2

        stopped = homegpu("--config", str(config), "stop", "demo", cwd=tmp_path)
        assert stopped.returncode == 0, stopped.stdout + stopped.stderr
        assert "stopped demo" in stopped.stdout
        wait_for(lambda: not worker_processes(sim_cluster), 30, "workers to end")
        logs = homegpu("--config", str(config), "logs", "demo", "--node", "node1", cwd=tmp_path)
        assert logs.returncode == 0 and "node1 |" in logs.stdout
    finally:
        first.kill()
        for pid in worker_processes(sim_cluster):
            os.kill(pid, signal.SIGKILL)


def test_tutorial_style_user_script_runs_unchanged(sim_cluster, tmp_path):
    code = tmp_path / "my_model"
    code.mkdir()
    shutil.copy(TUTORIAL, code / "train.py")
    config = sim_cluster.write_cluster_toml(
        tmp_path / "cluster.toml",
        jobs={"mine": {"python": sys.executable, "script": "my_model/train.py", "nodes": ["node1", "node2"],
                       "port": free_job_port(), "stall_timeout": 120.0}})
    result = homegpu("--config", str(config), "run", "mine", "--no-tui", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "node1 |" in result.stdout and "node2 |" in result.stdout
    assert not worker_processes(sim_cluster)
    # Keras's own progress bar: one line per epoch in the saved log, and read as progress.
    run_dir = only_run(tmp_path)
    for log in (run_dir / "logs").iterdir():
        assert max(map(len, log.read_text().splitlines())) < 1000, f"{log.name} kept a progress bar's redraws"
    assert "node1 * epoch 2/2  loss " in result.stdout, result.stdout
    summary = result.stdout[result.stdout.index("run succeeded"):]
    for worker in ("node1", "node2"):
        row = next(line.split() for line in summary.splitlines() if line.split()[:1] == [worker])
        assert row[1:3] == ["0", "2"], row  # exit 0 after 2 epochs
        assert all(_is_number(figure) for figure in row[3:5]), row  # the final loss and accuracy
    epochs = [m for m in read_metrics(run_dir) if m.get("event") == "epoch"]
    assert {(m["worker_label"], m["epoch"]) for m in epochs} == {(w, e) for w in ("node1", "node2") for e in (1, 2)}
    # The chief's saved model came home; the other worker's temporary save and the backup did not.
    output = run_dir / "output"
    assert (output / "keras-model" / "saved_model.pb").is_file(), sorted(p.name for p in output.iterdir())
    assert not (output / "backup").exists() and not list(output.glob("workertemp_*"))
    assert "the chief's output (keras-model)" in result.stdout


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def test_preflight_failure_starts_nothing_and_names_the_node(sim_cluster, tmp_path):
    config = sim_cluster.write_cluster_toml(
        tmp_path / "cluster.toml",
        jobs={"demo": job_table(data_dir="/nonexistent/datasets")},
        node_overrides={})
    result = homegpu("--config", str(config), "run", "demo", "--no-tui", cwd=tmp_path)
    assert result.returncode == 1
    assert "node1: data_dir /nonexistent/datasets does not exist" in result.stderr
    assert not worker_processes(sim_cluster)


def test_a_python_without_tensorflow_is_refused_at_preflight_and_not_remembered(sim_cluster, tmp_path):
    config = write_config(sim_cluster, tmp_path, python="/usr/bin/python3")  # Debian's: no TensorFlow
    result = homegpu("--config", str(config), "run", "demo", "--no-tui", cwd=tmp_path)
    assert result.returncode == 1, result.stdout + result.stderr
    for node in ("node1", "node2"):
        assert (f"{node}: TensorFlow with tf-keras is not importable by /usr/bin/python3; install it there: "
                "/usr/bin/python3 -m pip install 'tensorflow==2.21.*' 'tf-keras==2.21.*'") in result.stderr
        remembered = sim_cluster.node(node).work_dir / "import-checks.json"
        assert not remembered.exists() or "/usr/bin/python3" not in remembered.read_text()
    assert not worker_processes(sim_cluster)


def test_a_script_that_fails_at_import_is_not_restarted_and_its_error_is_quoted(sim_cluster, tmp_path):
    code = tmp_path / "broken"
    code.mkdir()
    (code / "train.py").write_text("import json\nimport not_a_module_of_anyone  # the user's typo\n")
    config = sim_cluster.write_cluster_toml(
        tmp_path / "cluster.toml",
        jobs={"mine": {"python": sys.executable, "script": "broken/train.py", "nodes": ["node1", "node2"],
                       "port": free_job_port()}})
    result = homegpu("--config", str(config), "run", "mine", "--no-tui", cwd=tmp_path)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "restarting" not in result.stdout and "generation 2" not in result.stdout, result.stdout
    final = result.stdout[result.stdout.index("run failed"):].splitlines()[0]
    assert "script error on every worker (node1, node2)" in final, final
    assert "ModuleNotFoundError: No module named 'not_a_module_of_anyone'" in final and "not restarted" in final
    assert not worker_processes(sim_cluster)


KERAS3_STYLE_ERROR = """\
import json
import os

import tensorflow as tf

index = json.loads(os.environ["TF_CONFIG"])["task"]["index"]


def fit():
    # As Keras 3 fails under MultiWorkerMirroredStrategy: a PerReplica dump, each worker's own values.
    values = "\\n".join(f"  {i}: {tf.constant(index * 1000.0 + i)!r} on worker {index}" for i in range(300))
    raise ValueError("Attempt to convert a value (PerReplica:{\\n" + values + "\\n}) with an unsupported type "
                     "(<class 'tensorflow.python.distribute.values.PerReplica'>) to a Tensor.")


fit()
"""
RAISED_ON_LINE = 12


def test_a_script_error_with_a_300_line_message_of_per_worker_values_ends_at_once_and_is_shown_once(
        sim_cluster, tmp_path):
    code = tmp_path / "keras3"
    code.mkdir()
    (code / "train.py").write_text(KERAS3_STYLE_ERROR)
    assert KERAS3_STYLE_ERROR.splitlines()[RAISED_ON_LINE - 1].lstrip().startswith("raise ValueError")
    config = sim_cluster.write_cluster_toml(
        tmp_path / "cluster.toml",
        jobs={"mine": {"python": sys.executable, "script": "keras3/train.py", "nodes": ["node1", "node2"],
                       "port": free_job_port()}})
    result = homegpu("--config", str(config), "run", "mine", "--no-tui", cwd=tmp_path)
    print(result.stdout, result.stderr)  # as the user saw it (pytest -s)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "restarting" not in result.stdout and "generation 2" not in result.stdout, result.stdout
    final = result.stdout[result.stdout.index("run failed"):].splitlines()[0]
    assert final.startswith(
        "run failed: script error on every worker (node1, node2) before training started: ValueError: Attempt to "
        f"convert a value (PerReplica:{{ … at train.py:{RAISED_ON_LINE} (exit 1; not restarted) — known cause: "
        "Keras 3 under MultiWorkerMirroredStrategy; fix: "), final
    assert len(final) < 400, final
    # The traceback once, its message cut to a few lines with where the whole is; the other worker's in one line.
    lines = result.stdout.splitlines()
    run_dir = only_run(tmp_path)
    assert sum(line.endswith("| Traceback (most recent call last):") for line in lines) == 1, result.stdout
    assert sum("on worker" in line for line in lines) <= 6, result.stdout
    shown = next(line.split("|")[0].strip() for line in lines if line.endswith("| Traceback (most recent call last):"))
    other = ({"node1", "node2"} - {shown}).pop()
    logs = Path("experiments") / run_dir.name / "logs"
    assert f"{shown} | … 295 lines cut (whole in {logs / shown}.log)" in result.stdout, result.stdout
    assert f"{other} | the same ValueError at train.py:{RAISED_ON_LINE} as {shown} (whole in {logs / other}.log)" \
        in result.stdout, result.stdout
    # The logs keep every line.
    for worker in ("node1", "node2"):
        assert (run_dir / "logs" / f"{worker}.log").read_text().count("on worker") == 300
    assert not worker_processes(sim_cluster)


def test_two_runs_of_one_job_started_together_train_once(sim_cluster, tmp_path):
    config = write_config(sim_cluster, tmp_path, epochs=3, steps_per_epoch=20)
    here, there = tmp_path / "terminal1", tmp_path / "terminal2"
    here.mkdir(), there.mkdir()
    first, second = (subprocess.Popen(homegpu_argv("--config", str(config), "run", "demo", "--no-tui"), cwd=cwd,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                     for cwd in (here, there))
    outputs = [process.communicate(timeout=600)[0] for process in (first, second)]
    assert [first.returncode, second.returncode] == [0, 0], "\n----\n".join(outputs)
    attached = [text for text in outputs if "is already running" in text]
    assert len(attached) == 1, "\n----\n".join(outputs)  # one started it, the other followed it
    runs = {path.name for cwd in (here, there) for path in (cwd / "experiments").iterdir()}
    assert len(runs) == 1, runs
    assert all("generation 2" not in text for text in outputs)  # nobody burned restarts on a taken port
    assert not worker_processes(sim_cluster)


def test_a_worker_killed_under_two_controllers_is_restarted_once_by_the_one_that_started_it(sim_cluster, tmp_path):
    """A second `homegpu run` of the job attaches (a TUI would too); when a worker dies, the first restarts the run
    and the second follows its next generation instead of starting every worker again, and both see it succeed."""
    config = write_config(sim_cluster, tmp_path, epochs=6, steps_per_epoch=30)
    here, there = tmp_path / "terminal1", tmp_path / "terminal2"
    here.mkdir(), there.mkdir()
    starter = subprocess.Popen(homegpu_argv("--config", str(config), "run", "demo", "--no-tui"), cwd=here,
                               stdout=(here / "out").open("w"), stderr=subprocess.STDOUT, text=True)
    follower = None
    try:
        wait_for(lambda: "node2 * epoch 1/6" in (here / "out").read_text(), 300, "the first epoch")
        follower = subprocess.Popen(homegpu_argv("--config", str(config), "run", "demo", "--no-tui"), cwd=there,
                                    stdout=(there / "out").open("w"), stderr=subprocess.STDOUT, text=True)
        wait_for(lambda: "is already running" in (there / "out").read_text(), 120, "the second to attach")
        copies = {terminal: terminal / "experiments" for terminal in (here, there)}
        wait_for(lambda: "node2 * epoch 2/6" in (here / "out").read_text()
                 and any(copies[here].glob("*/chief-backup/*")), 300, "the starter's copy of the chief's backup")
        time.sleep(3)  # the follower polls every second: before the fix, it copied at its first poll once attached
        assert not any(copies[there].glob("*/chief-backup/*")), "the follower copied the chief's backup too"
        # four epochs left to kill it in: on a busy machine the waits above can take an epoch or two
        victim = [pid for pid in worker_processes(sim_cluster) if _index_of(pid) == 1]
        assert victim, f"no worker 1 left to kill:\n{(here / 'out').read_text()}"
        os.kill(victim[0], signal.SIGKILL)
        assert [starter.wait(timeout=600), follower.wait(timeout=120)] == [0, 0]
    finally:
        for process in (starter, follower):
            if process is not None and process.poll() is None:
                process.kill()
    started, followed = (here / "out").read_text(), (there / "out").read_text()
    assert "generation 2" in started and "generation 3" not in started, started
    assert "the controller that started the run acts on it: following" in followed, followed
    assert "following generation 2, started by the run's controller" in followed, followed
    assert "generation 3" not in followed and "run succeeded" in followed, followed
    assert not worker_processes(sim_cluster)


FILL_50_MB = """\
with open("model.bin", "wb") as out:  # in the worker's output dir, on the node's work dir
    for _ in range(50):
        out.write(b"x" * 1_000_000)
"""


def test_a_full_disk_on_a_node_is_named_with_its_room_and_the_partial_output_marked(sim_cluster, tmp_path):
    """node1's work dir is a 30 MB filesystem and the script writes 50 MB there: the run ends at once
    naming the node, the filesystem, the room left and the fix (not "vanished", not restarted), what
    the chief wrote comes home marked partial, and no empty or half-written state file is left."""
    node1 = sim_cluster.node("node1")
    (tmp_path / "fill").mkdir()
    (tmp_path / "fill" / "fill.py").write_text(FILL_50_MB)
    config = write_config(sim_cluster, tmp_path, script="fill/fill.py", nodes=["node1"])
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=30m", "tmpfs", str(node1.work_dir)], check=True)
    try:
        node1.restart()  # its sshd's mount namespace binds the small disk as ~/.homegpu
        result = homegpu("--config", str(config), "run", "demo", "--no-tui", cwd=tmp_path, timeout=300)
        left_on_node = sorted(p.name for p in (node1.work_dir / "runs").glob("*/*")
                              if p.name.endswith(".tmp") or (p.suffix == ".exit" and not p.stat().st_size))
    finally:
        node1.stop()
        subprocess.run(["umount", "-l", str(node1.work_dir)], check=False)
        node1.start()
    text = result.stdout + result.stderr
    print(text)  # the run as a user saw it (pytest -s)
    assert result.returncode == 1, text
    assert re.search(r"run failed: node1: no space left on tmpfs \(tmpfs at \S+: \d+ MB free of 30 MB\)", text), text
    assert "set work_dir in cluster.toml to a disk with room" in text, text
    assert "vanished" not in text and "did not start" not in text and "generation 2" not in text, text
    assert "the chief's partial output (model.bin: the run failed, so a file may be cut short" in text, text
    assert (only_run(tmp_path) / "output" / "PARTIAL.txt").read_text().startswith("Partial: the run failed")
    assert left_on_node == [], f"half-written or empty state files on node1: {left_on_node}"
    assert not worker_processes(sim_cluster)

"""A PyTorch DDP script, written as pytorch/examples' ddp-tutorial-series writes it, run by homegpu on two
machines of the test LAN with real PyTorch: torchrun on each node, gloo between them (no GPU here)."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tomllib
from pathlib import Path

import tomli_w
from helpers import homegpu, homegpu_argv, run_and_strike, run_init_demo, wait_for, worker_processes

from simcluster import free_job_port
from test_queue_lan import ALERT_LOG, serving, submit, wait_state
from homegpu.remote.record import load_timeline

DDP_SCRIPT = Path(__file__).parent / "fixtures" / "scripts" / "ddp_tutorial.py"
# pytorch/examples' distributed/ddp-tutorial-series as published: multinode.py (gloo and the CPU for a machine
# without a GPU) and its datautils.py; its snapshot is saved on global rank 0 alone
PUBLISHED = Path(__file__).parent / "fixtures" / "scripts" / "ddp_tutorial_series"
RESUMED = re.compile(r"^\s*(node\d) \| Resuming training from snapshot at Epoch (\d+)$", re.MULTILINE)
# the tutorial's `[GPU0] Epoch 3 | Batchsize: 32 | Steps: 64 | Loss 0.1234`, read as progress; `run --no-tui` shows:
NODE_EPOCH = re.compile(r"^(node\d) \* epoch (\d+)/\?\s+loss ([0-9.]+)", re.MULTILINE)


def ddp_job(sim_cluster, tmp_path: Path, name: str = "ddp", **job) -> Path:
    """cluster.toml with job `name`: the tutorial's multinode.py in ddp/, on node1 and node2."""
    (tmp_path / "ddp").mkdir()
    shutil.copy(DDP_SCRIPT, tmp_path / "ddp" / "multinode.py")
    table = {"framework": "pytorch", "python": sys.executable, "script": "ddp/multinode.py", "args": ["6", "1"],
             "nodes": ["node1", "node2"], "port": free_job_port(), "stall_timeout": 120.0, "max_restarts": 1, **job}
    return sim_cluster.write_cluster_toml(tmp_path / "cluster.toml", jobs={name: table})


def epoch_losses(output: str, node: str) -> dict[int, float]:
    """The epochs (counted from 1: the script's `Epoch 0` is epoch 1) and losses `run --no-tui` showed for `node`."""
    return {int(epoch): float(loss) for found, epoch, loss in NODE_EPOCH.findall(output) if found == node}


def recorded_epochs(run_dir: Path) -> dict[str, list[int]]:
    """Each worker's epoch events in the run's metrics.jsonl."""
    found: dict[str, list[int]] = {}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        event = json.loads(line)
        if event.get("event") == "epoch":
            found.setdefault(event["worker_label"], []).append(event["epoch"])
    return found


def kill_training_process(sim_cluster, node: str) -> None:
    """SIGKILL `node`'s training process (the one torchrun started, not torchrun)."""
    victims = [pid for pid in worker_processes(sim_cluster) if pid in sim_cluster.node(node).pids()
               and b"homegpu.trainer.torchrun" not in Path(f"/proc/{pid}/cmdline").read_bytes()]
    assert victims, f"{node}'s training process not found"
    os.kill(victims[0], signal.SIGKILL)


def test_tfconfig_shows_the_torchrun_each_node_runs(sim_cluster, tmp_path):
    config = ddp_job(sim_cluster, tmp_path)
    result = homegpu("--config", str(config), "tfconfig", "ddp")
    assert result.returncode == 0, result.stdout + result.stderr
    address = sim_cluster.node("node1").address
    assert "torchrun on each node; WORLD_SIZE 2, backend gloo (a process runs on CPU)" in result.stdout
    assert (f"torchrun --nnodes=2 --nproc-per-node=1 --node-rank=1 --master-addr={address} --master-port="
            in result.stdout), result.stdout
    assert "TF_CONFIG" not in result.stdout


def test_the_ddp_tutorial_trains_unchanged_on_two_nodes_and_its_loss_falls(sim_cluster, pytorch, tmp_path):
    config = ddp_job(sim_cluster, tmp_path)
    result = homegpu("--config", str(config), "run", "ddp", "--no-tui", cwd=tmp_path, timeout=400)
    print(result.stdout[-4000:])
    assert result.returncode == 0, result.stdout + result.stderr
    for node in ("node1", "node2"):  # one process a node: rank 0 on node1, the chief, rank 1 on node2
        losses = epoch_losses(result.stdout, node)
        assert sorted(losses) == list(range(1, 7)), result.stdout  # its Epoch 0..5
        assert losses[6] < 0.5 * losses[1], f"{node} did not learn: {losses}"
    assert "generation 2" not in result.stdout and "Traceback" not in result.stdout
    (run_dir,) = (tmp_path / "experiments").iterdir()
    assert recorded_epochs(run_dir) == {"node1": list(range(1, 7)), "node2": list(range(1, 7))}
    assert (run_dir / "output" / "snapshot.pt").is_file()  # the chief's snapshot came home
    assert not worker_processes(sim_cluster)


def test_the_tutorials_own_nccl_line_is_refused_before_anything_starts(sim_cluster, tmp_path):
    config = ddp_job(sim_cluster, tmp_path, name="ddpnccl")
    script = tmp_path / "ddp" / "multinode.py"
    text = script.read_text().replace('backend="nccl" if torch.cuda.is_available() else "gloo"', 'backend="nccl"')
    script.write_text(text)
    line = text.splitlines().index('    init_process_group(backend="nccl")') + 1
    result = homegpu("--config", str(config), "run", "ddpnccl", "--no-tui", cwd=tmp_path, timeout=120)
    assert result.returncode == 1, result.stdout + result.stderr
    (refusal,) = [line for line in result.stderr.splitlines() if line.strip()]
    assert refusal.startswith(f"homegpu: ddpnccl not started: ddp/multinode.py:{line}: "
                              "`init_process_group(backend='nccl')` needs a GPU in every process, but node1 has none")
    assert not worker_processes(sim_cluster)
    for name in ("node1", "node2"):
        assert not list(sim_cluster.node(name).work_dir.glob("runs/ddpnccl-*"))


def test_a_killed_process_restarts_every_node_from_the_snapshot(sim_cluster, pytorch, tmp_path):
    config = ddp_job(sim_cluster, tmp_path, name="ddpkill", args=["8", "1"], env={"EPOCH_PAUSE": "2"})

    def kill_node2s_process():
        kill_training_process(sim_cluster, "node2")

    # Killed in its next epoch (its first 2 s pause there), once node2 saved its snapshot after epoch 3: node1
    # saves the same one (its epochs run in step with node2's), so both resume at the same epoch. (Killed
    # between an epoch's last collective and its save, node2 would resume an epoch behind node1: the tutorial
    # keeps a snapshot per node and trusts them to agree; here that window is the moment between its print
    # and its save.)
    cue = "node2 | Epoch 3 | Training snapshot saved"
    status, text = run_and_strike(config, tmp_path, cue, kill_node2s_process, job="ddpkill")
    print(text[-4000:])
    assert status == 0, text
    assert "generation 2" in text
    resumed = {int(epoch) for epoch in re.findall(r"Resuming training from snapshot at Epoch (\d+)", text)}
    assert len(resumed) == 1 and min(resumed) >= 3, text
    (epoch,) = resumed  # epochs done: the script's next is its `Epoch {epoch}`, shown as epoch + 1
    after = text[text.index("generation 2"):]
    assert f"node1 * epoch {epoch + 1}/?" in after and f"node1 * epoch {epoch}/?" not in after  # from the snapshot
    assert "node2 * epoch 8/?" in after
    assert not worker_processes(sim_cluster)


PUBLISHED_EPOCHS = 40  # 29 epochs past the kill's cue: the kill lands long before node2 could finish


def run_published_killing_node2(sim_cluster, tmp_path: Path, name: str, **job) -> tuple[int, str]:
    """The published multinode.py (40 epochs, a snapshot every 10: the two arguments of its command line) as job
    `name`, node2's process killed once node1 saved its snapshot of epoch 10; (status, output) of `run --no-tui`."""
    config = ddp_job(sim_cluster, tmp_path, name=name, args=[str(PUBLISHED_EPOCHS), "10"], **job)
    for file in ("multinode.py", "datautils.py"):
        shutil.copy(PUBLISHED / file, tmp_path / "ddp" / file)
    status, text = run_and_strike(config, tmp_path, "node1 | Epoch 10 | Training snapshot saved",
                                  lambda: kill_training_process(sim_cluster, "node2"), job=name)
    print(text[-4000:])
    return status, text


def test_the_published_multinode_py_resumes_on_both_nodes_from_the_chiefs_snapshot(sim_cluster, pytorch, tmp_path):
    """The tutorial's multinode.py saves its snapshot on global rank 0 alone and has every process load it where
    the file exists: written for a shared filesystem. node2's process killed mid-run, node1's snapshot reaches
    node2 before generation 2, and both ranks go on from the same epoch to the last."""
    status, text = run_published_killing_node2(sim_cluster, tmp_path, "published")
    assert status == 0, text
    assert "generation 2" in text and "generation 3" not in text, text
    resumed = dict(RESUMED.findall(text[text.index("generation 2"):]))
    assert set(resumed) == {"node1", "node2"} and len(set(resumed.values())) == 1, text  # the same epoch
    assert int(resumed["node1"]) >= 10 and not RESUMED.findall(text[:text.index("generation 2")])
    (run_dir,) = (tmp_path / "experiments").iterdir()
    for node, rank in (("node1", 0), ("node2", 1)):  # each rank's last epoch, after its resumed one
        log = (run_dir / "logs" / f"{node}.log").read_text()
        assert f"[GPU{rank}] Epoch {resumed[node]} |" in log[log.index("Resuming training"):], log[-2000:]
        assert f"[GPU{rank}] Epoch {PUBLISHED_EPOCHS - 1} |" in log, log[-2000:]
    assert not worker_processes(sim_cluster)


def test_a_snapshot_the_checkpoint_key_leaves_out_is_named_in_one_line(sim_cluster, pytorch, tmp_path):
    """The same run with `checkpoint` naming a file the script never writes: node2 begins generation 2 at epoch 0
    and node1 at its snapshot's, and the run stops there, naming snapshot.pt, rather than spend its restarts."""
    status, text = run_published_killing_node2(sim_cluster, tmp_path, "missing", checkpoint="model.pt", max_restarts=3)
    assert status == 1, text
    (line,) = [line for line in text.splitlines() if line.startswith("run failed: ")]
    assert re.fullmatch(r"run failed: workers would resume from different epochs \(node1 with \d+ epochs done, node2 "
                        r"with none done\): node2 lacks snapshot\.pt from node1's working dir, which the job's "
                        r'checkpoint = "model\.pt" leaves out: name what the script resumes from there; stopped '
                        r"rather than restarted", line), line
    assert "generation 3" not in text and not worker_processes(sim_cluster)


def test_the_pytorch_demo_from_init_trains_across_two_nodes(sim_cluster, pytorch, tmp_path):
    run_dir = run_init_demo(sim_cluster, tmp_path, "pytorch")
    assert (run_dir / "output" / "model.pt").is_file()
    # balanced by speed by default: each node's own compute speed, which the job's next plan takes as its speed
    workers = load_timeline(run_dir / "timeline.sqlite").workers
    assert len(workers) == 2 and all(worker.compute_examples_per_sec.measured for worker in workers), workers


def test_serve_queues_a_pytorch_job_records_its_epochs_and_alerts(sim_cluster, pytorch, tmp_path, monkeypatch):
    """The ddp tutorial through `homegpu submit` to `homegpu serve`: its queue entry runs it, its record has
    each node's epochs (read from the script's own lines), and the queue's alerts name it."""
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))  # serve and the commands inherit it
    config = ddp_job(sim_cluster, tmp_path, name="ddpq", args=["3", "1"])
    data = tomllib.loads(config.read_text())
    alert_log = tmp_path / "alert_log.py"
    alert_log.write_text(ALERT_LOG)
    data["alerts"] = {"queued_runs": True, "command": [sys.executable, str(alert_log), str(tmp_path / "alerts.txt"),
                                                       "{alert}", "{queue_id}", "{run_id}"]}
    config.write_text(tomli_w.dumps(data))
    experiments = tmp_path / "experiments"
    with serving(config, tmp_path / "serve.log", experiments):
        queued = submit(config, "ddpq")
        entry = wait_state(config, queued, "succeeded", 400)
    assert recorded_epochs(experiments / entry["run_id"]) == {"node1": [1, 2, 3], "node2": [1, 2, 3]}
    alerts = (tmp_path / "alerts.txt").read_text().splitlines()
    assert f"queued_run_succeeded {queued} {entry['run_id']}" in alerts
    assert not worker_processes(sim_cluster)


def test_a_pytorch_run_is_attached_to_then_stopped_with_every_process(sim_cluster, pytorch, tmp_path):
    """A second `homegpu run` attaches to the running job (no second torchrun); `homegpu stop` from another
    terminal ends torchrun and the processes it started on both nodes, and the run that watches it ends as
    stopped (torchrun's exit 1 on TERM is not a failure to restart from)."""
    config = ddp_job(sim_cluster, tmp_path, name="ddpstop", args=["50", "1"], env={"EPOCH_PAUSE": "1"})
    seen = {}

    def attach_then_stop():
        running = sorted(worker_processes(sim_cluster))
        second = subprocess.Popen(homegpu_argv("--config", str(config), "run", "ddpstop", "--no-tui"), cwd=tmp_path,
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            seen["attached"] = wait_for(lambda: "already running" in (line := second.stdout.readline()) and line,
                                        60, "the second run to attach")
            wait_for(lambda: " * epoch " in second.stdout.readline(), 120, "progress after attaching")
            seen["same"] = sorted(worker_processes(sim_cluster)) == running
        finally:
            second.kill()
            second.wait()
        seen["stop"] = homegpu("--config", str(config), "stop", "ddpstop", cwd=tmp_path)

    status, text = run_and_strike(config, tmp_path, "node2 * epoch 2/?", attach_then_stop, job="ddpstop")
    print(text[-3000:])
    assert "attaching" in seen["attached"] and seen["same"], "a duplicate torchrun was started"
    assert seen["stop"].returncode == 0 and "stopped ddpstop" in seen["stop"].stdout, seen["stop"].stderr
    wait_for(lambda: not worker_processes(sim_cluster), 30, "torchrun and its processes to end")
    assert status == 130 and "generation 2" not in text, text  # the watching run ends as stopped, no restart
    assert "== ddpstop stopped (run ddpstop-" in text and "stopped with `homegpu stop`" in text

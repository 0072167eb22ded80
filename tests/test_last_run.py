"""The pace advice from a job's last run (remote/plan/last_run.py): real timeline files, written with the
recorder's own schema, read back the way the planner reads them.

Under MultiWorkerMirroredStrategy both workers of a run report the same examples/s (they step
together), so the run shows who held the other back only through how busy each one's GPU was.
"""

from __future__ import annotations

import json
import os
import sqlite3
from dataclasses import replace
from pathlib import Path

import pytest

from homegpu.remote.config.cluster_spec import parse_cluster
from homegpu.remote.plan.last_run import last_shares, last_timeline, own_speeds
from homegpu.remote.plan.tfconfig import job_device_plan
from homegpu.remote.plan.worker_devices import WorkerDevices
from homegpu.remote.record.timeline_schema import SCHEMA

RTX3090 = "NVIDIA GeForce RTX 3090"
CLUSTER = """
[cluster]
name = "home"
[[nodes]]
name = "desktop"
host = "192.168.1.20"
[[nodes]]
name = "closet"
host = "192.168.1.21"
[jobs.demo]
nodes = ["desktop", "closet"]
workers_per_node = "per-gpu"
"""
GPUS = {"desktop": [(0, RTX3090)], "closet": [(0, RTX3090)]}


def write_run(experiments: Path, run_id: str, job: str, rate: float, util: dict[str, float],
              cpu_workers: tuple[str, ...] = (), compute: dict[str, float] | None = None) -> Path:
    """A finished run: 20 step lines per worker at `rate` examples/s, each node's GPU 0 at util[node] %; with
    `compute`, a balanced run's epoch lines, each worker's own compute speed (compute[node] examples/s)."""
    run = experiments / run_id
    run.mkdir(parents=True)
    db = sqlite3.connect(run / "timeline.sqlite")
    db.executescript(SCHEMA)
    db.executemany("INSERT INTO meta VALUES (?, ?)", [("job", json.dumps(job)), ("run_id", json.dumps(run_id))])
    for t in range(100, 120):
        for node in ("desktop", "closet"):
            db.execute("INSERT INTO worker_samples (t, worker, event, examples_per_sec) VALUES (?, ?, 'step', ?)",
                       (t, node, rate))
            if node not in cpu_workers:
                db.execute("INSERT INTO gpu_samples (t, node, gpu, util) VALUES (?, ?, 0, ?)", (t, node, util[node]))
    for t, node in ((110, "desktop"), (110, "closet"), (119, "desktop"), (119, "closet")) if compute else ():
        db.execute("INSERT INTO worker_samples (t, worker, event, examples_per_sec, compute_examples_per_sec) "
                   "VALUES (?, ?, 'epoch', ?, ?)", (t, node, rate, compute[node]))
    db.commit()
    db.close()
    return run


def test_same_cards_are_evenly_matched_by_the_table_but_the_run_shows_the_slow_one(tmp_path):
    """Two RTX 3090s: the table says nothing, but desktop's GPU was busy 95% and closet's 30%: closet
    waited on desktop (a throttling card, a x1 riser) and would train faster alone."""
    spec = parse_cluster(CLUSTER)
    even = replace(spec.jobs["demo"], balance="even")
    table = job_device_plan(spec, even, GPUS)
    assert table.pace.sentences == () and not table.pace.measured
    write_run(tmp_path, "demo-20261122-100000-1", "demo", 100.0, {"desktop": 95.0, "closet": 30.0})
    plan = job_device_plan(spec, even, GPUS, last_timeline(tmp_path, "demo"))
    assert plan.pace.measured and plan.pace.leave_out == ("desktop",)
    assert plan.pace.speeds == pytest.approx((100 / 0.95, 100 / 0.30))
    assert "desktop (GPU 0 RTX 3090) would run at about 32% of the other workers' pace" in plan.pace.sentences[0]
    assert "speeds from the job's last run" in "\n".join(plan.lines())
    # balanced by speed (the default), the slow card takes a smaller share and adds to the run
    balanced = job_device_plan(spec, spec.jobs["demo"], GPUS, last_timeline(tmp_path, "demo"))
    assert balanced.pace.leave_out == () and balanced.pace.gain == 1.0
    assert balanced.pace.sentences[0].endswith(
        "of the other workers' pace; balanced by speed, with it the job trains 1.31× as fast as the other 1 worker "
        "alone")
    assert 'each step\'s 128 examples split by speed (balance = "speed"): desktop 31, closet 97' in balanced.lines()


def test_the_latest_run_of_this_job_counts_not_another_jobs(tmp_path):
    old = write_run(tmp_path, "demo-1", "demo", 100.0, {"desktop": 95.0, "closet": 30.0})
    other = write_run(tmp_path, "demo-big-1", "demo-big", 100.0, {"desktop": 30.0, "closet": 95.0})
    newest = write_run(tmp_path, "demo-2", "demo", 100.0, {"desktop": 50.0, "closet": 50.0})
    for age, run in enumerate((old, newest, other)):  # `other` is the newest file of all
        os.utime(run / "timeline.sqlite", (1_000 + age, 1_000 + age))
    timeline = last_timeline(tmp_path, "demo")
    assert timeline is not None and timeline.meta["run_id"] == "demo-2"
    assert last_timeline(tmp_path, "nothing-ran") is None


def test_a_worker_without_gpu_figures_leaves_the_table_in_charge(tmp_path):
    spec = parse_cluster(CLUSTER)
    write_run(tmp_path, "demo-1", "demo", 100.0, {"desktop": 95.0, "closet": 30.0}, cpu_workers=("closet",))
    timeline = last_timeline(tmp_path, "demo")
    plan = job_device_plan(spec, spec.jobs["demo"], GPUS)
    assert own_speeds(timeline, plan.workers) == {"desktop": pytest.approx(100 / 0.95)}
    assert not job_device_plan(spec, spec.jobs["demo"], GPUS, timeline).pace.measured


def test_a_cpu_worker_counts_as_always_busy(tmp_path):
    """The laptop trains on CPU at the job's pace; the GPU beside it was busy 5%: about 20× faster alone."""
    spec = parse_cluster(CLUSTER.replace('"closet"]', '"closet"]\n').replace("closet", "laptop"))
    gpus = {"desktop": [(0, RTX3090)], "laptop": []}
    run = write_run(tmp_path, "demo-1", "demo", 40.0, {"desktop": 5.0, "closet": 0.0}, cpu_workers=("closet",))
    db = sqlite3.connect(run / "timeline.sqlite")
    db.execute("UPDATE worker_samples SET worker = 'laptop' WHERE worker = 'closet'")
    db.commit()
    db.close()
    plan = job_device_plan(spec, spec.jobs["demo"], gpus, last_timeline(tmp_path, "demo"))
    assert plan.pace.speeds == pytest.approx((40 / 0.05, 40.0))
    assert plan.pace.leave_out == ("laptop",) and "about 5% of the GPU workers' pace" in plan.pace.sentences[0]


def test_a_damaged_latest_run_is_passed_over_for_the_one_before(tmp_path):
    experiments = tmp_path / "experiments"
    older = write_run(experiments, "demo-1", "demo", 1000.0, {"desktop": 95.0, "closet": 30.0})
    newer = write_run(experiments, "demo-2", "demo", 500.0, {"desktop": 95.0, "closet": 30.0})
    (newer / "timeline.sqlite").write_bytes(b"not a database\n" * 100)
    os.utime(older / "timeline.sqlite", (1, 1))
    timeline = last_timeline(experiments, "demo")
    assert timeline is not None and timeline.meta["run_id"] == "demo-1"


def write_metrics(run: Path, lines: list[dict]) -> None:
    (run / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))


def test_a_balanced_runs_last_shares_start_the_next_run_on_the_same_workers(tmp_path):
    """The chief's last line that told the shares; none where the last run had other workers or told none."""
    experiments = tmp_path / "experiments"
    run = write_run(experiments, "demo-1", "demo", 100.0, {"desktop": 90, "closet": 90})
    write_metrics(run, [
        {"worker_label": "desktop", "worker": 0, "event": "start", "shares": [64, 64]},
        {"worker_label": "closet", "worker": 1, "event": "start", "shares": [64, 64]},
        {"worker_label": "desktop", "worker": 0, "event": "epoch", "epoch": 1, "shares": [100, 28]},
        {"worker_label": "desktop", "worker": 0, "event": "epoch", "epoch": 2, "shares": [104, 24]},
        {"worker_label": "desktop", "worker": 0, "event": "end"},
    ])
    assert last_shares(experiments, "demo", ["desktop", "closet"]) == (104, 24)
    assert last_shares(experiments, "demo", ["closet", "desktop"]) is None  # another chief: other ranks
    assert last_shares(experiments, "demo", ["desktop", "closet", "laptop"]) is None
    assert last_shares(experiments, "other", ["desktop", "closet"]) is None
    write_metrics(run, [{"worker_label": "desktop", "worker": 0, "event": "epoch", "shares": [0, "x"]},
                        {"worker_label": "closet", "worker": 1, "event": "epoch"}])
    assert last_shares(experiments, "demo", ["desktop", "closet"]) is None  # shares that do not read: none


def test_a_balanced_runs_own_compute_speeds_come_before_the_gpus_business(tmp_path):
    """A balanced run measured each worker's compute alone (its epoch lines' compute_examples_per_sec): desktop's
    GPU busy 95 % and closet's 30 % would say 105 and 333 examples/s, the compute says 400 and 120, and a worker
    of two GPUs (replicas) counts each one's."""
    spec = parse_cluster(CLUSTER)
    write_run(tmp_path, "demo-1", "demo", 100.0, {"desktop": 95.0, "closet": 30.0},
              compute={"desktop": 400.0, "closet": 120.0})
    timeline = last_timeline(tmp_path, "demo")
    plan = job_device_plan(spec, spec.jobs["demo"], GPUS)
    assert own_speeds(timeline, plan.workers) == {"desktop": 400.0, "closet": 120.0}
    assert job_device_plan(spec, spec.jobs["demo"], GPUS, timeline).pace.speeds == pytest.approx((400.0, 120.0))
    two = WorkerDevices("desktop", 0, 0, (0, 1), (RTX3090, RTX3090), 2)
    assert own_speeds(timeline, [two]) == {"desktop": 800.0}

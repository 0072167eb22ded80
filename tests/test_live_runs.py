"""The runs `homegpu status` shows: those a controller here records now (its flock on metrics.jsonl), each worker's
latest epoch line read from the file's end, then only what was appended; its share of a step and its step in parts
in status's text and JSON."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from homegpu.remote.events import Metric
from homegpu.remote.record import ExperimentLog, LiveRuns, RunFolder, live_runs
from homegpu.trainer import shares
from homegpu.trainer.metrics import format_metric, parse_metric_line
from homegpu.tui.view.text import format_status, status_json

RUN = "demo-20261129-112410-ab12"
SHARES = [39, 25]  # of a global batch of 64: the faster node1 takes more


def epoch_line(rank: int, epoch: int, balanced: bool = True, **more) -> Metric:
    """A worker's epoch line as the built-in trainer prints it (trainer/progress.py, train.py's _tell_shares), read
    back as the controller reads it."""
    fields = dict(worker=rank, workers=2, time=1795309958.342, epoch=epoch, epochs=6, loss=0.4, accuracy=0.88,
                  examples_per_sec=(327.0, 53.0)[rank], seconds=4.3)
    if balanced:
        speed, overhead = (41.3, 31.2)[rank], (0.16, 0.31)[rank]
        fields |= {"shares": SHARES, **shares.step_parts(SHARES[rank], speed, overhead, 1.34)}
    return Metric(parse_metric_line(format_metric(event="epoch", **fields | more)))


def step_line(rank: int) -> Metric:
    return Metric(parse_metric_line(format_metric(event="step", worker=rank, workers=2, epoch=1, step=10,
                                                  loss=0.9, accuracy=0.5, examples_per_sec=300.0)))


@pytest.fixture
def record(tmp_path):
    """A run being recorded, as `homegpu run` records it: its ExperimentLog open."""
    log = ExperimentLog(tmp_path, RUN)
    yield log
    log.close()


def test_status_shows_each_workers_share_and_step_in_parts(tmp_path, record):
    for rank, label in enumerate(("node1", "node2")):
        record.metric(label, step_line(rank))
        record.metric(label, epoch_line(rank, 1))
        record.metric(label, epoch_line(rank, 2))
    (run,) = LiveRuns(tmp_path).read()
    text = format_status([], watched=True, runs=[run])
    assert text.splitlines() == [
        "", "runs recorded here now:", f"  {RUN}",
        "    node1  epoch 2/6  327 examples/s  share 39/64, a step 0.94 s compute + 0.16 s besides + 0.24 s waiting",
        "    node2  epoch 2/6  53 examples/s  share 25/64, a step 0.8 s compute + 0.31 s besides + 0.23 s waiting",
    ]
    obj = json.loads(json.dumps(status_json("home", [], 1.0, True, [run])))
    assert obj["runs"] == [{"run_id": RUN, "workers": [
        {"worker": "node1", "rank": 0, "epoch": 2, "epochs": 6, "examples_per_sec": 327.0, "share": 39,
         "global_batch": 64, "step_seconds": 1.34, "compute_seconds": 0.9443, "overhead_seconds": 0.16,
         "wait_seconds": 0.2357},
        {"worker": "node2", "rank": 1, "epoch": 2, "epochs": 6, "examples_per_sec": 53.0, "share": 25,
         "global_batch": 64, "step_seconds": 1.34, "compute_seconds": 0.8013, "overhead_seconds": 0.31,
         "wait_seconds": 0.2287}]}]


def test_an_unbalanced_run_is_shown_without_shares(tmp_path, record):
    record.metric("node1", epoch_line(0, 3, balanced=False))
    (run,) = LiveRuns(tmp_path).read()
    assert format_status([], runs=[run]).splitlines()[-1] == "    node1  epoch 3/6  327 examples/s"
    (worker,) = status_json("home", [], 1.0, runs=[run])["runs"][0]["workers"]
    assert worker["share"] is worker["global_batch"] is worker["compute_seconds"] is worker["wait_seconds"] is None
    # shares per replica (a worker with two GPUs) give no worker's share: its parts are still its own
    record.metric("node1", epoch_line(0, 4, shares=[20, 19, 25]))
    (run,) = LiveRuns(tmp_path).read()
    assert format_status([], runs=[run]).splitlines()[-1].startswith("    node1  epoch 4/6  327 examples/s  a step ")


def test_a_run_before_its_first_epoch_says_so(tmp_path, record):
    record.metric("node1", step_line(0))
    (run,) = LiveRuns(tmp_path).read()
    assert format_status([], runs=[run]).splitlines()[-2:] == [f"  {RUN}", "    no epoch yet"]
    assert status_json("home", [], 1.0, runs=[run])["runs"] == [{"run_id": RUN, "workers": []}]


def test_a_finished_run_is_not_shown(tmp_path, record):
    record.metric("node1", epoch_line(0, 6))
    now = [1000.0]
    runs = LiveRuns(tmp_path, clock=lambda: now[0])
    assert [run.run_id for run in runs.read()] == [RUN]
    record.close()  # the run ended: its controller lets go of the file
    assert runs.read() == [] and LiveRuns(tmp_path).read() == []
    assert format_status([], runs=[]) == "" and status_json("home", [], 1.0)["runs"] == []
    # a controller that attaches to it again records it again: seen at the next look at the quiet runs
    again = ExperimentLog(tmp_path, RUN)
    try:
        again.metric("node1", epoch_line(0, 6))
        assert runs.read() == []  # not yet: a quiet run costs a tick nothing
        now[0] += live_runs.RECHECK_SECONDS
        assert [run.run_id for run in runs.read()] == [RUN]
    finally:
        again.close()


def test_a_run_begun_after_the_first_look_is_found(tmp_path):
    runs = LiveRuns(tmp_path)
    assert runs.read() == []
    log = ExperimentLog(tmp_path, RUN)
    try:
        log.metric("node1", epoch_line(0, 1))
        assert [run.run_id for run in runs.read()] == [RUN]
    finally:
        log.close()


def test_a_killed_controllers_run_is_not_shown(tmp_path):
    """The kernel lets go of the lock of a controller killed with SIGKILL: nothing of it stays live."""
    metrics = RunFolder.of(tmp_path, RUN).metrics
    metrics.parent.mkdir(parents=True)
    metrics.write_text(json.dumps({"worker_label": "node1", **epoch_line(0, 1).fields}) + "\n")
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys; from homegpu.remote.record import live_runs; "
         "f = open(sys.argv[1], 'a'); live_runs.hold_recording(f); print('held', flush=True); sys.stdin.read()",
         str(metrics)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "held\n"
        assert [run.run_id for run in LiveRuns(tmp_path).read()] == [RUN]
    finally:
        holder.kill()
        holder.wait()
    assert LiveRuns(tmp_path).read() == []


def test_a_growing_file_is_read_from_where_the_last_read_ended(tmp_path, record):
    runs = LiveRuns(tmp_path)
    for rank, label in enumerate(("node1", "node2")):
        record.metric(label, epoch_line(rank, 1))
    assert [metric.epoch for _, metric in runs.read()[0].epochs] == [1, 1]
    metrics = RunFolder.of(tmp_path, RUN).metrics
    read = metrics.stat().st_size
    with open(metrics, "r+b") as handle:  # what was read is never read again: spoil it in place
        handle.write(b"x" * read)
    record.metric("node1", epoch_line(0, 2))
    text = json.dumps({"worker_label": "node2", **epoch_line(1, 2).fields}) + "\n"
    with open(metrics, "a") as handle:  # a line half written is taken once it ends
        handle.write(text[:40])
        handle.flush()
        assert [metric.epoch for _, metric in runs.read()[0].epochs] == [2, 1]
        handle.write(text[40:])
    assert [metric.epoch for _, metric in runs.read()[0].epochs] == [2, 2]


def test_a_long_file_is_read_back_only_as_far_as_every_workers_latest_epoch(tmp_path, record, monkeypatch):
    monkeypatch.setattr(live_runs, "FIRST_READ", 1024)  # a few lines: the read goes back block after block
    for epoch in (1, 2, 3):
        record.metric("node2", epoch_line(1, epoch))
        record.metric("node1", epoch_line(0, epoch))
        for _ in range(60):
            record.metric("node1", step_line(0))
    record.metric("node1", epoch_line(0, 4))
    ((first, chief), (second, other)) = LiveRuns(tmp_path).read()[0].epochs
    assert (first, chief.epoch, second, other.epoch) == ("node1", 4, "node2", 3)
    metrics = RunFolder.of(tmp_path, RUN).metrics
    with open(metrics, "r+b") as handle:  # the start is never reached once both are found near the end
        handle.write(b"{broken\n")
    with_start_spoiled = LiveRuns(tmp_path).read()[0].epochs
    assert [(label, metric.epoch) for label, metric in with_start_spoiled] == [("node1", 4), ("node2", 3)]


def test_no_experiments_folder_is_no_run(tmp_path):
    assert LiveRuns(tmp_path / "nowhere").read() == []

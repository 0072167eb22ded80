"""The timeline recorder and reader: a scripted run made of the hub's real event dataclasses and the stats
agent's recorded lines goes in, and the rows, the event kinds and the downsampling bound come out."""

from __future__ import annotations

import asyncio
import sqlite3
from dataclasses import replace

import pytest

from helpers import wait_until
from homegpu.remote.events import EventHub, Metric, NodeStatsUpdated, WorkerMetric
from homegpu.remote.record.timeline import TimelineRecorder, load_timeline
from homegpu.remote.record.timeline_schema import SCHEMA, TimelineDamaged
from timeline_events import recorded_stats, scripted_run, stats_stream


def record(path, events, **options) -> None:
    recorder = TimelineRecorder(path, **options)
    for event in events:
        recorder.handle(event)
    recorder.close()


def count(path, table: str, where: str = "1") -> int:
    with sqlite3.connect(path) as db:
        return db.execute(f"SELECT count(*) FROM {table} WHERE {where}").fetchone()[0]


def test_a_scripted_run_leaves_every_sample_and_every_kind_of_event(tmp_path):
    path = tmp_path / "run" / "timeline.sqlite"
    events = scripted_run()
    record(path, events)

    assert count(path, "node_samples", "node = 'gpu1'") == 31
    assert count(path, "node_samples", "node = 'gpu2'") == 28  # offline for 3 s
    assert count(path, "gpu_samples", "node = 'gpu2'") == 2 * 28  # two GPUs
    timeline = load_timeline(path)
    kinds = [event.kind for event in timeline.events]
    for kind in ("preflight_start", "preflight", "launch", "running", "worker_start", "straggler", "node_offline",
                 "node_online", "restart", "stall", "worker_exit", "end"):
        assert kind in kinds, kind
    assert kinds[-1] == "end" and timeline.events[-1].details["state"] == "succeeded"
    assert [e.summary for e in timeline.events_of("preflight_start", "phase")] == [
        "preflight", "preflight: syncing code to 2 node(s)"]
    assert [e.kind for e in timeline.events_of("preflight_start", "phase")] == ["preflight_start", "phase"]
    restart = timeline.events_of("restart")[0]
    assert "stalled" in restart.summary and restart.details["generation"] == 1
    resumed = [e for e in timeline.events_of("worker_start") if e.details.get("resumed")]
    assert len(resumed) == 2 and "resumed at epoch 1" in resumed[0].summary
    assert [e.worker for e in timeline.events_of("straggler")] == ["gpu2"]


def test_samples_keep_the_recorded_values(tmp_path):
    path = tmp_path / "timeline.sqlite"
    record(path, scripted_run())
    timeline = load_timeline(path)
    gpu1, gpu2 = timeline.nodes
    recorded = recorded_stats("h100_mig_load").gpus[0]
    assert gpu1.name == "gpu1" and len(gpu1.gpus) == 1 and len(gpu2.gpus) == 2
    assert set(gpu1.gpus[0].power.values) == {recorded.power}
    assert set(gpu1.gpus[0].util.values) == {None}  # the recorded MIG GPU has no util: NULL, not 0
    assert gpu1.gpus[0].mem_total == recorded.mem_total and gpu1.gpus[0].sm_clock.values[0] == recorded.sm_clock
    assert gpu1.cpu.values[0] == recorded_stats("h100_mig_load").cpu

    worker = {w.name: w for w in timeline.workers}["gpu1"]
    assert len(worker.loss.values) == 2 * 4 and len(worker.val_accuracy.values) == 2 * 2  # per generation: 4 steps, 2 epochs
    # steps/s comes from examples/s over the start line's per-worker batch of 64.
    assert worker.steps_per_sec.values[0] == pytest.approx(worker.examples_per_sec.values[0] / 64)
    assert timeline.duration == pytest.approx(31.0, abs=0.5)


def test_rows_are_written_in_batches_not_one_commit_per_sample(tmp_path):
    path = tmp_path / "timeline.sqlite"
    recorder = TimelineRecorder(path)
    stream = stats_stream(nodes=4, seconds=3)
    for event in stream[:4]:  # the first second: nothing written yet
        recorder.handle(event)
    assert count(path, "node_samples") == 0
    for event in stream[4:]:
        recorder.handle(event)
    assert 0 < count(path, "node_samples") < len(stream)
    recorder.close()
    assert count(path, "node_samples") == len(stream)


def test_long_runs_are_downsampled_to_buckets_before_the_full_rate_window(tmp_path):
    path = tmp_path / "timeline.sqlite"
    seconds, full_rate, bucket = 900, 120, 10
    record(path, stats_stream(nodes=2, seconds=seconds), full_rate_seconds=full_rate, bucket_seconds=bucket)

    per_node = count(path, "node_samples", "node = 'node1'")
    assert per_node <= (seconds - full_rate) / bucket + full_rate + 60 + bucket  # 60: compaction cadence
    assert per_node < seconds / 2
    with sqlite3.connect(path) as db:
        end = db.execute("SELECT max(t) FROM node_samples").fetchone()[0]
        old = [t for (t,) in db.execute("SELECT t FROM node_samples WHERE node = 'node1' AND t < ? ORDER BY t",
                                        (end - full_rate - 60,))]
        recent = db.execute("SELECT count(*) FROM node_samples WHERE node = 'node1' AND t > ?",
                            (end - full_rate,)).fetchone()[0]
        power = {p for (p,) in db.execute("SELECT DISTINCT power FROM gpu_samples WHERE node = 'node1'")}
    assert all(later - earlier == pytest.approx(bucket) for earlier, later in zip(old, old[1:]))
    assert recent >= full_rate - 1  # the last window keeps every second
    assert power and all(p == pytest.approx(recorded_stats("h100_mig_load").gpus[0].power) for p in power)


async def test_run_reads_a_hub_subscription_and_writes_on_close(tmp_path):
    hub = EventHub()
    path = tmp_path / "timeline.sqlite"
    recorder = TimelineRecorder(path)
    subscription = hub.subscribe()
    task = asyncio.create_task(recorder.run(subscription))
    events = scripted_run()
    for event in events[:-1]:
        hub.publish(event)
    # the recorder takes the queue a few times a second and writes once a second, while it runs
    await wait_until(lambda: count(path, "node_samples") > 0, 60, "samples written before the end")
    hub.publish(events[-1])  # the end, still queued when the recorder is cancelled: recorded all the same
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    recorder.close()
    assert count(path, "events", "kind = 'end'") == 1
    assert count(path, "node_samples") == 31 + 28


def test_loading_a_missing_timeline_names_the_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="no timeline at .*nothing.sqlite"):
        load_timeline(tmp_path / "nothing.sqlite")


def test_a_stopped_run_alerts_and_meta_are_recorded(tmp_path):
    from homegpu.remote.events import JobState, JobStateChanged, NodeStatsUnavailable

    path = tmp_path / "timeline.sqlite"
    recorder = TimelineRecorder(path)
    recorder.set_meta(run_id="demo-1", job="demo")
    recorder.handle(NodeStatsUnavailable("gpu3", "python3 not found", at=100.0))
    recorder.record_event("alert", 101.0, "GPU 0 at 91 °C", node="gpu1", details={"temp": 91})
    recorder.handle(JobStateChanged("demo", "demo-1", JobState.STOPPING, 1, 0, "Ctrl-C", at=102.0))
    recorder.handle(JobStateChanged("demo", "demo-1", JobState.STOPPED, 1, 0, at=103.0))
    recorder.close()
    timeline = load_timeline(path)
    assert timeline.meta == {"run_id": "demo-1", "job": "demo"}
    assert [e.kind for e in timeline.events] == ["stats_unavailable", "alert", "stop", "end"]
    assert timeline.events[1].details == {"temp": 91} and timeline.events[1].node == "gpu1"
    assert timeline.events[-1].details["state"] == "stopped"


def test_the_timeline_can_be_read_while_the_recorder_writes(tmp_path):
    path = tmp_path / "timeline.sqlite"
    recorder = TimelineRecorder(path)
    for event in scripted_run()[:60]:
        recorder.handle(event)
    recorder.flush()
    written = count(path, "node_samples")
    assert written > 0 and sum(len(n.cpu.times) for n in load_timeline(path).nodes) == written
    recorder.close()


def test_only_the_jobs_nodes_are_recorded_when_asked(tmp_path):
    path = tmp_path / "timeline.sqlite"
    record(path, scripted_run(), nodes=["gpu1"])
    timeline = load_timeline(path)
    assert [node.name for node in timeline.nodes] == ["gpu1"]
    assert not timeline.events_of("node_offline") and timeline.events_of("straggler")  # worker events stay


def test_alerts_and_a_failing_alert_command_are_events_of_the_timeline(tmp_path):
    from homegpu.remote.events import Alert, AlertCommandFailed, AlertState

    path = tmp_path / "timeline.sqlite"
    fired = Alert("gpu_temperature", AlertState.FIRING, "gpu1 GPU 0 is at 91 °C (alert at 85 °C)", node="gpu1",
                  gpu=0, value=91.0, threshold=85.0, at=100.0)
    record(path, [fired, AlertCommandFailed("notify-send '{title}'", "cannot run notify-send: No such file",
                                            at=100.5),
                  Alert("gpu_temperature", AlertState.FIRING, "elsewhere", node="gpu9", gpu=0, at=100.7),
                  Alert("gpu_temperature", AlertState.CLEARED, "gpu1 GPU 0 cooled to 70 °C", node="gpu1", gpu=0,
                        value=70.0, threshold=85.0, at=110.0)], nodes=["gpu1"])
    events = load_timeline(path).events
    assert [(e.kind, e.summary) for e in events] == [
        ("alert", "firing: gpu1 GPU 0 is at 91 °C (alert at 85 °C)"),
        ("alert_command_failed", "cannot run notify-send: No such file"),
        ("alert", "cleared: gpu1 GPU 0 cooled to 70 °C")]  # gpu9 is not the run's node
    assert events[0].details == {"alert": "gpu_temperature", "state": "firing", "gpu": 0, "value": 91.0,
                                 "threshold": 85.0}


def test_reading_a_finished_timeline_leaves_no_wal_files_beside_it(tmp_path):
    """A read-only connection closing last cannot fold the WAL back: the run folder would keep
    timeline.sqlite-wal and -shm after `homegpu report` or the pace advice read it."""
    path = tmp_path / "run" / "timeline.sqlite"
    record(path, scripted_run())
    assert load_timeline(path).events
    assert sorted(p.name for p in path.parent.iterdir()) == ["timeline.sqlite"]


def test_a_recorder_attaching_to_a_damaged_timeline_keeps_it_aside_and_records_anew(tmp_path):
    """A controller attaching to a run again appends to its timeline: one cut short is renamed, kept,
    and said in the new one's events, never a traceback."""
    path = tmp_path / "run" / "timeline.sqlite"
    events = scripted_run()
    record(path, events[: len(events) // 2])
    with path.open("r+b") as file:
        file.truncate(path.stat().st_size // 2)
    size = path.stat().st_size
    record(path, events[len(events) // 2:])

    kept = tmp_path / "run" / "timeline.sqlite.damaged"
    assert kept.stat().st_size == size
    timeline = load_timeline(path)
    (note,) = timeline.events_of("timeline_damaged")
    assert note.summary == (f"{path} is damaged (database disk image is malformed): kept as "
                            "timeline.sqlite.damaged; this timeline starts when recording resumed")
    assert timeline.events_of("end") and timeline.workers  # what came after the damage
    with pytest.raises(TimelineDamaged, match=r"timeline.sqlite.damaged is damaged \(database disk image"):
        load_timeline(kept)


def test_a_timeline_from_before_the_energy_counter_is_read_and_appended_to(tmp_path):
    """A run recorded before the GPUs' energy counters were read: its rows read with no counter (None), and
    a controller attaching to it again adds the column and records the counter from then on."""
    path = tmp_path / "timeline.sqlite"
    with sqlite3.connect(path) as db:
        db.executescript(SCHEMA.replace("sm_clock REAL, energy REAL)", "sm_clock REAL)"))
        db.execute("INSERT INTO gpu_samples VALUES (1795316000.0, 'gpu1', 0, 90, 1000, 81559, 60, 400, 1980)")
    db.close()
    (gpu,) = load_timeline(path).nodes[0].gpus
    assert gpu.energy.values == (None,) and gpu.power.values == (400,)
    stats = recorded_stats("h100_mig_load")
    counting = replace(stats, gpus=(replace(stats.gpus[0], energy=123456.5),))
    record(path, [NodeStatsUpdated("gpu1", counting, at=1795316001.0)])
    (gpu,) = load_timeline(path).nodes[0].gpus
    assert gpu.energy.values == (None, 123456.5)


def test_a_balanced_runs_compute_speed_is_recorded_and_an_older_timeline_gains_its_column(tmp_path):
    """Each epoch line of a balanced run tells its worker's own compute speed (trainer/PROTOCOL.md): the timeline
    keeps it beside examples/s. A timeline an older homegpu wrote reads without it (nothing measured), and a
    controller attaching to it again adds the column."""
    path = tmp_path / "timeline.sqlite"
    with sqlite3.connect(path) as db:
        before = SCHEMA.replace("steps_per_sec REAL,\n    compute_examples_per_sec REAL)", "steps_per_sec REAL)")
        assert before != SCHEMA
        db.executescript(before)
        db.execute("INSERT INTO worker_samples VALUES (1795316000.0, 'laptop', 'epoch', 1, 20, 0.5, 0.8, NULL, "
                   "NULL, 300, 4.7)")
    db.close()
    (old,) = load_timeline(path).workers
    assert old.examples_per_sec.values == (300,) and old.compute_examples_per_sec.measured == ()
    epoch = {"event": "epoch", "epoch": 2, "epochs": 3, "loss": 0.4, "examples_per_sec": 310.0,
             "compute_examples_per_sec": 1240.5, "shares": [52, 12], "worker": 1, "worker_label": "laptop"}
    record(path, [WorkerMetric("demo", "demo-1", "laptop", 1, Metric(epoch), at=1795316010.0)])
    (worker,) = load_timeline(path).workers
    assert worker.compute_examples_per_sec.values == (None, 1240.5)
    assert worker.examples_per_sec.values == (300, 310.0)

"""A run's workers' lines reach the hub once each: a log line as its LogLine, a metric line as one
WorkerMetric (never also as log text), and into the run's record."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from types import SimpleNamespace

from homegpu.remote.config import NodeSpec, parse_cluster
from homegpu.remote.events import NA, EventHub, GpuStats, LogLine, Metric, NodeStats, Straggler, WorkerMetric
from homegpu.remote.jobs import JobRun
from homegpu.remote.jobs import watch
from homegpu.remote.jobs.watch import WorkerTrack, WorkerWatch
from homegpu.remote.jobs.worker_logs import WorkerLines
from homegpu.remote.logs import LogTail, classify
from homegpu.remote.logs.tail import FileResume
from homegpu.remote.node_side.scripts import worker_process
from homegpu.remote.nodes import Cluster
from homegpu.remote.plan import WorkerSlot
from homegpu.remote.plan.device_plan import plan_devices
from homegpu.remote.record import ExperimentLog
from homegpu.remote.runtimes import WorkerStatus
from homegpu.trainer.metrics import format_metric


def tracks(*labels: str) -> dict[str, WorkerTrack]:
    slots = [WorkerSlot(index, NodeSpec(label, "local"), 0, 23456 + index, "127.0.0.1")
             for index, label in enumerate(labels)]
    return {slot.label: WorkerTrack(slot, runtime=None) for slot in slots}


def line(worker: str, seq: int, text: str) -> LogLine:
    return LogLine(worker, "log", seq, text, worker, metric=classify(text))


def published(hub: EventHub, feed) -> list[object]:
    with hub.subscribe() as events:
        feed()
        return events.drain(1000)


def test_a_metric_line_is_published_once_as_a_worker_metric_and_a_log_line_as_a_log_line(tmp_path):
    hub, workers = EventHub(), tracks("big")
    experiment = ExperimentLog(tmp_path, "run-1")
    take = WorkerLines("demo", "run-1", hub, workers, experiment)._taker(workers["big"], 0)
    epoch = format_metric(event="epoch", epoch=1, epochs=2, loss=0.5, examples_per_sec=900.0)
    events = published(hub, lambda: [take(line("big", 1, epoch)), take(line("big", 2, "plain"))])
    experiment.close()
    assert [type(e) for e in events] == [WorkerMetric, LogLine]
    assert events[0].metric == Metric({"event": "epoch", "epoch": 1, "epochs": 2, "loss": 0.5,
                                       "examples_per_sec": 900.0})
    assert events[1].text == "plain"
    assert workers["big"].progressed and workers["big"].last_metric.loss == 0.5
    assert experiment.folder.log("big").read_text().splitlines() == [epoch, "plain"]
    assert '"loss": 0.5' in experiment.folder.metrics.read_text()


def test_attaching_again_records_only_what_the_record_lacks(tmp_path):
    """A controller that attaches to a run again (serve restarted, a second `homegpu run`) reads the current
    generation from its start: the lines its record already holds are followed, never written twice."""
    first = ExperimentLog(tmp_path, "run-1")
    old = ["=== homegpu: big generation 1 starting ===", "gen 1", "=== homegpu: big generation 2 starting ===",
           format_metric(event="epoch", epoch=1, loss=0.9)]
    for text in old:
        first.log_line("big", text)
    first.metric("big", classify(old[-1]))
    first.close()
    again, hub, workers = ExperimentLog(tmp_path, "run-1"), EventHub(), tracks("big")
    assert again.recorded_lines("big", 2) == 2 and again.recorded_lines("big", 3) == 0
    assert again.recorded_lines("other", 2) == 0
    take = WorkerLines("demo", "run-1", hub, workers, again)._taker(workers["big"], again.recorded_lines("big", 2))
    generation_2 = [*old[2:], format_metric(event="epoch", epoch=2, loss=0.5), "after"]
    events = published(hub, lambda: [take(line("big", seq, text)) for seq, text in enumerate(generation_2)])
    again.close()
    assert again.folder.log("big").read_text().splitlines() == old + generation_2[2:]
    assert [json.loads(row)["epoch"] for row in again.folder.metrics.read_text().splitlines()] == [1, 2]
    assert len([e for e in events if isinstance(e, WorkerMetric)]) == 2  # the hub still sees all of it
    assert workers["big"].last_metric.loss == 0.5


def test_a_slow_worker_is_a_straggler_once_every_worker_reported_the_epoch():
    hub, workers = EventHub(), tracks("fast", "slow", "mid")
    lines = WorkerLines("demo", "run-1", hub, workers, None)
    rates = {"fast": 1000.0, "mid": 980.0, "slow": 300.0}

    def feed():
        for seq, (worker, rate) in enumerate(rates.items(), 1):
            text = format_metric(event="epoch", epoch=2, examples_per_sec=rate)
            lines._taker(workers[worker], 0)(line(worker, seq, text))

    stragglers = [e for e in published(hub, feed) if isinstance(e, Straggler)]
    assert [(s.worker, s.examples_per_sec, s.unit, s.epoch) for s in stragglers] == [("slow", 300.0, "examples/s", 2)]


def test_a_straggler_says_what_holds_its_gpus_back_where_its_node_shows_something():
    """The run's lookup (the run's Generations.held_back: the node's session's GpuHealth) is asked for the straggler only."""
    hub, workers = EventHub(), tracks("fast", "slow", "mid")
    asked: list[str] = []
    cause = "GPU 0 thermal slowdown at 87 °C since 09:00: clocks 1,200 of 1,860 MHz; improve the case's airflow"

    def held_back(worker: str) -> list[str]:
        asked.append(worker)
        return [cause] if worker == "slow" else []

    lines = WorkerLines("demo", "run-1", hub, workers, None, held_back)
    rates = {"fast": 1000.0, "mid": 980.0, "slow": 300.0}

    def feed():
        for seq, (worker, rate) in enumerate(rates.items(), 1):
            lines._taker(workers[worker], 0)(line(worker, seq, format_metric(event="epoch", epoch=2,
                                                                             examples_per_sec=rate)))

    (straggler,) = [e for e in published(hub, feed) if isinstance(e, Straggler)]
    assert (straggler.worker, straggler.held_back, asked) == ("slow", (cause,), ["slow"])
    assert straggler.cause_text == f". Held back: {cause}"
    assert Straggler("demo", "run-1", "slow", 300.0, 990.0).cause_text == ""  # nothing seen: the figures alone


def test_a_straggler_in_a_balanced_run_says_what_its_share_of_a_step_is():
    hub, workers = EventHub(), tracks("fast", "slow", "mid")
    lines = WorkerLines("demo", "run-1", hub, workers, None)
    rates = {"fast": 1000.0, "mid": 980.0, "slow": 300.0}

    def feed():
        for seq, (worker, rate) in enumerate(rates.items(), 1):
            lines._taker(workers[worker], 0)(line(worker, seq, format_metric(
                event="epoch", epoch=2, examples_per_sec=rate, shares=[227, 62, 223])))

    (straggler,) = [e for e in published(hub, feed) if isinstance(e, Straggler)]
    assert straggler.cause_text == (". Balanced: it does 62 of the 512 examples of each step, by its speed, so the "
                                    "others do not wait for it")


def test_a_worker_that_slows_a_balanced_run_even_at_its_smallest_share_is_named_with_the_figures():
    """Two desktops and a laptop whose smallest share (32 of 768) outlasts the desktops' whole step without it:
    balancing cannot help, and the straggler's words say so, with how to leave it out."""
    hub, workers = EventHub(), tracks("desk1", "laptop", "desk2")
    lines = WorkerLines("demo", "run-1", hub, workers, None)
    figures = {"desk1": (368, 1000.0, 980.0), "laptop": (32, 20.0, 15.0), "desk2": (368, 1000.0, 990.0)}

    def feed():
        for seq, (worker, (share, rate, compute)) in enumerate(figures.items(), 1):
            lines._taker(workers[worker], 0)(line(worker, seq, format_metric(
                event="epoch", epoch=2, examples_per_sec=rate, shares=[368, 32, 368],
                compute_examples_per_sec=compute)))

    (straggler,) = [e for e in published(hub, feed) if isinstance(e, Straggler)]
    assert straggler.worker == "laptop"
    assert straggler.cause_text == (
        ". Balanced, laptop slows the run even at its smallest share: 32 of 768 examples a step take it 2.13 s, while "
        "the others would do the whole step without it in 0.39 s: the job trains faster without it "
        '(nodes = ["desk1", "desk2"] in the job leaves it out)')


def test_the_runs_lookup_names_only_the_workers_own_gpus_as_its_nodes_session_judged_them(tmp_path):
    """Two workers on one node, one per GPU: GPU 1 is hot, so box#1 is told of it and box of nothing."""
    cluster = Cluster(parse_cluster('[[nodes]]\nname = "box"\nhost = "box"\n[jobs.demo]\nworkers_per_node = "per-gpu"\n'))
    cool = GpuStats(index=0, name="NVIDIA GeForce RTX 3090", uuid="GPU-0", util=97, mem_used=NA, mem_total=NA,
                    temp=70, power=NA, power_limit=NA, sm_clock=1860, throttle=(), sm_clock_max=1860)
    hot = replace(cool, index=1, uuid="GPU-1", temp=87, sm_clock=1200, throttle=("hw_thermal",))
    for at in (1000.0, 1010.0):
        stats = NodeStats(at, "nvml", (cool, hot), "580", "13.0", NA, (NA, NA, NA), NA, NA, NA)
        cluster.node("box").health.take(stats)
    run = JobRun(cluster, cluster.spec.jobs["demo"], tmp_path)
    run.plan = plan_devices({"box": stats}, "per-gpu", None)
    slots = [WorkerSlot(index, cluster.spec.nodes[0], index, 23456 + index, "127.0.0.1") for index in (0, 1)]
    run.tracks = {slot.label: WorkerTrack(slot, runtime=None) for slot in slots}
    assert run._generations.held_back("box") == []
    [cause] = run._generations.held_back("box#1")
    assert cause.startswith("GPU 1 thermal slowdown at 87 °C since ") and cause.endswith("improve the case's airflow")
    run.plan = None  # no plan (a numeric layout without stats): every GPU of the node is the worker's
    assert run._generations.held_back("box") == [cause]


class _Unstarted(LogTail):
    def start(self) -> "_Unstarted":
        return self


class _Runtime:
    """A runtime whose tails of a worker's output are only read here (nothing follows a node)."""

    def tail(self, run_id: str, label: str, generation: int, follow: bool = True, **kwargs) -> LogTail:
        return _Unstarted(SimpleNamespace(name="box"), FileResume(f"{label}.g{generation}.log", follow), **kwargs)


def test_a_generation_reads_the_scripts_epochs_as_its_workers_first_generation_did():
    """The DDP tutorial counts from 0; a generation resumed from its snapshot begins with `Epoch 3` (three done),
    which alone would read as a count from 1: the worker's track keeps what the first generation showed."""
    workers = tracks("box")
    workers["box"].runtime = _Runtime()
    lines = WorkerLines("ddp", "run-1", EventHub(), workers, None)
    lines.follow(1, None)
    first = workers["box"].tail.classifier
    assert [first.classify(f"[GPU0] Epoch {n} | Loss 0.5").epoch for n in range(3)] == [1, 2, 3]
    lines.follow(2, None)
    resumed = workers["box"].tail.classifier
    assert resumed is not first and resumed.classify("[GPU0] Epoch 3 | Loss 0.4").epoch == 4


def test_a_workers_supervisor_saying_it_exited_nudges_the_watch_and_nothing_else_does():
    hub, workers, nudges = EventHub(), tracks("big"), []
    lines = WorkerLines("demo", "run-1", hub, workers, None, nudge=lambda: nudges.append("big"))
    take = lines._taker(workers["big"], 0)
    for seq, text in enumerate(["=== homegpu: big generation 2 starting ===", "Epoch 1/3", "exited with status 1",
                                format_metric(event="epoch", epoch=1, epochs=3, loss=0.5)]):
        take(line("big", seq, text))
    assert nudges == []
    take(line("big", 9, (worker_process.EXIT_NOTE % ("big", 2, -9)).rstrip("\n")))
    assert nudges == ["big"]


class CountingRuntime:
    """A node's runtime whose workers all run, counting its round trips (each starts a process on the node)."""

    def __init__(self) -> None:
        self.polls = 0

    async def statuses(self, run_id: str, labels) -> list[WorkerStatus]:
        self.polls += 1
        return [WorkerStatus(label, "running", generation=1, run_id=run_id) for label in labels]


async def test_the_watch_polls_the_nodes_when_a_log_said_a_worker_ended_else_only_now_and_then(monkeypatch):
    """The loop checks each second (stalls, epochs); a poll starts a process on every node, so it polls when nudged,
    and otherwise after QUIET_POLL_SECONDS for a worker that vanished without a word."""
    runtime, workers = CountingRuntime(), tracks("big", "small")
    for track in workers.values():
        track.runtime = runtime
    watching = WorkerWatch("demo", EventHub(), workers)
    monkeypatch.setattr(watch, "QUIET_POLL_SECONDS", math.inf)
    for _ in range(3):
        assert await watching.check("run-1", 1, stall_timeout=600) is None
    assert runtime.polls == 1  # the first check, one round trip for the node's two workers
    assert {t.status.state for t in workers.values()} == {"running"}
    watching.nudge()
    await watching.check("run-1", 1, stall_timeout=600)
    await watching.check("run-1", 1, stall_timeout=600)
    assert runtime.polls == 2
    monkeypatch.setattr(watch, "QUIET_POLL_SECONDS", 0.0)
    await watching.check("run-1", 1, stall_timeout=600)
    assert runtime.polls == 3


async def test_a_stall_is_judged_at_every_check_between_polls(monkeypatch):
    runtime, workers = CountingRuntime(), tracks("big")
    workers["big"].runtime = runtime
    watching = WorkerWatch("demo", EventHub(), workers)
    monkeypatch.setattr(watch, "QUIET_POLL_SECONDS", math.inf)
    assert await watching.check("run-1", 1, stall_timeout=600) is None
    workers["big"].last_activity -= 601
    assert await watching.check("run-1", 1, stall_timeout=600) == "big: no progress for 600s (stalled)"
    assert runtime.polls == 1

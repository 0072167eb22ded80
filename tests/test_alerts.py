"""The alert evaluator (remote/alerts/evaluate.py), pure: events and times in, FIRING and CLEARED alerts out.

GPU samples are the stats agent's real lines recorded on an H100 (tests/fixtures/tui/), with only
their temperature or memory changed to play a GPU heating up and cooling down.
"""

from __future__ import annotations

import dataclasses
import time

import pytest

from homegpu.remote.alerts.evaluate import AlertEvaluator
from homegpu.remote.config.alert_rules import AlertRules
from homegpu.remote.config.tariff import Tariff
from homegpu.remote.events import (
    NA, REJOINED, SHRUNK, Alert, AlertState, JobState, JobStateChanged, Metric, NodeState, NodeStateChanged,
    NodeStatsUpdated, ProcessOwner, QueueRunChanged, Straggler, WorkerMetric,
)
from timeline_events import recorded_stats

T0 = 1_795_316_000.0
H100 = recorded_stats("h100_mig_load")  # one GPU: 53 °C, 11125 of 81559 MiB
TWO_GPUS = recorded_stats("h100nvl_idle")
FIRING, CLEARED = AlertState.FIRING, AlertState.CLEARED


def hot(temp: object = 53, mem_used: object = None, stats=H100, gpu: int = 0) -> object:
    """The recorded stats with GPU `gpu` at `temp` °C (and `mem_used` MiB, if given)."""
    gpus = list(stats.gpus)
    changes = {"temp": temp} if mem_used is None else {"temp": temp, "mem_used": mem_used}
    gpus[gpu] = dataclasses.replace(gpus[gpu], **changes)
    return dataclasses.replace(stats, gpus=tuple(gpus))


def samples(evaluator: AlertEvaluator, temps: list[object], node: str = "desk") -> list[tuple[str, int]]:
    """Feed one sample per temperature, a second apart; (state, index of the sample) per alert."""
    return [(alert.state.value, i) for i, temp in enumerate(temps)
            for alert in evaluator.take(NodeStatsUpdated(node, hot(temp), at=T0 + i))]


# (temperatures, one a second; alerts as (state, sample index))
TEMPERATURE_CASES = [
    ("cool throughout", [40, 50, 60, 84], []),
    ("fires once and stays quiet while hot", [70, 85, 90, 95, 88, 86], [("firing", 1)]),
    ("clears 5 °C below the threshold", [90, 84, 82, 80, 70], [("firing", 0), ("cleared", 3)]),
    ("hovering at the threshold does not flap", [85, 84.5, 85, 83, 85.5, 84, 85, 81, 85],
     [("firing", 0)]),
    ("fires again after a clear", [90, 79, 86, 60], [("firing", 0), ("cleared", 1), ("firing", 2), ("cleared", 3)]),
    ("a GPU that cannot measure its temperature says nothing", [NA, NA, 99], [("firing", 2)]),
]


@pytest.mark.parametrize("name, temps, expected", TEMPERATURE_CASES, ids=[case[0] for case in TEMPERATURE_CASES])
def test_gpu_temperature(name, temps, expected):
    assert samples(AlertEvaluator(AlertRules(gpu_temperature=85)), temps) == expected


def test_gpu_temperature_alert_says_where_and_how_hot_and_its_clear_matches_it():
    evaluator = AlertEvaluator(AlertRules(gpu_temperature=85))
    evaluator.take(JobStateChanged("train", "train-1", JobState.RUNNING, 1, 0, at=T0))
    (fired,) = evaluator.take(NodeStatsUpdated("desk", hot(91.0), at=T0 + 1))
    assert (fired.kind, fired.node, fired.gpu, fired.value, fired.threshold) == ("gpu_temperature", "desk", 0, 91, 85)
    assert (fired.job, fired.run_id) == ("train", "train-1")  # the run going on, for HOMEGPU_RUN_ID
    assert fired.message == "desk GPU 0 is at 91 °C (alert at 85 °C)"
    assert evaluator.firing == (fired,)
    (cleared,) = evaluator.take(NodeStatsUpdated("desk", hot(62), at=T0 + 2))
    assert cleared.key == fired.key and cleared.state is CLEARED and cleared.value == 62
    assert cleared.message == "desk GPU 0 cooled to 62 °C (at or below 80 °C)"
    assert evaluator.firing == ()


def test_a_gpu_alert_names_the_run_going_on_when_it_fires_and_when_it_clears():
    evaluator = AlertEvaluator(AlertRules(gpu_temperature=85))
    (fired,) = evaluator.take(NodeStatsUpdated("desk", hot(91), at=T0))
    assert (fired.job, fired.run_id) == ("", "")  # hot before any run
    evaluator.take(JobStateChanged("train", "train-1", JobState.PREFLIGHT, 1, 0, at=T0 + 1))
    (cleared,) = evaluator.take(NodeStatsUpdated("desk", hot(60), at=T0 + 2))
    assert (cleared.job, cleared.run_id) == ("train", "train-1")
    evaluator.take(JobStateChanged("train", "train-1", JobState.SUCCEEDED, 1, 0, at=T0 + 3))
    (again,) = evaluator.take(NodeStatsUpdated("desk", hot(91), at=T0 + 4))
    assert again.run_id == ""  # the run is over


def test_each_gpu_and_each_node_has_its_own_alert():
    evaluator = AlertEvaluator(AlertRules(gpu_temperature=80))
    both_hot = hot(90, stats=hot(95, stats=TWO_GPUS, gpu=1), gpu=0)
    alerts = evaluator.take(NodeStatsUpdated("a", both_hot, at=T0))
    alerts += evaluator.take(NodeStatsUpdated("b", both_hot, at=T0))
    assert sorted((a.node, a.gpu) for a in alerts) == [("a", 0), ("a", 1), ("b", 0), ("b", 1)]
    alerts = evaluator.take(NodeStatsUpdated("a", hot(40, stats=both_hot, gpu=1), at=T0 + 1))
    assert [(a.state, a.node, a.gpu) for a in alerts] == [(CLEARED, "a", 1)]


MEMORY_CASES = [  # (MiB used of 81559, one a second)
    ("fires at the percentage and clears 5 points below", [40_000, 78_000, 81_000, 76_000, 73_000],
     [("firing", 1), ("cleared", 4)]),
    ("hovering does not flap", [77_500, 76_000, 77_600, 75_000], [("firing", 0)]),
    ("no total: no percentage", [NA], []),
]


@pytest.mark.parametrize("name, used, expected", MEMORY_CASES, ids=[case[0] for case in MEMORY_CASES])
def test_gpu_memory_percent(name, used, expected):
    evaluator = AlertEvaluator(AlertRules(gpu_memory_percent=95))
    got = [(alert.state.value, i) for i, mib in enumerate(used)
           for alert in evaluator.take(NodeStatsUpdated("desk", hot(mem_used=mib), at=T0 + i))]
    assert got == expected


def test_rules_that_are_off_fire_nothing():
    evaluator = AlertEvaluator(AlertRules())
    events = [NodeStatsUpdated("desk", hot(120, mem_used=81_559), at=T0),
              NodeStateChanged("desk", NodeState.ONLINE, at=T0), NodeStateChanged("desk", NodeState.OFFLINE, at=T0),
              JobStateChanged("j", "r", JobState.FAILED, 1, 0, "x (stalled)", at=T0),
              Straggler("j", "r", "w", 1.0, 10.0, at=T0, epoch=2),
              QueueRunChanged("q-1", "j", "r", "failed", "w0: exit 1", at=T0)]
    assert [alert for event in events for alert in evaluator.take(event)] == []
    assert evaluator.tick(T0 + 10_000) == []


def node(state: NodeState, at: float, reason: str = "") -> NodeStateChanged:
    return NodeStateChanged("box", state, reason, at=T0 + at)


# (events and ticks in order: an event, or a float for a tick at T0 + that; alerts as (state, step))
OFFLINE_CASES = [
    ("offline long enough, then back", [node(NodeState.ONLINE, 0), node(NodeState.OFFLINE, 5, "connection lost"),
                                        30.0, 64.0, 66.0, node(NodeState.CONNECTING, 70), 80.0,
                                        node(NodeState.ONLINE, 90)], [("firing", 4), ("cleared", 7)]),
    ("back before the limit: nothing", [node(NodeState.ONLINE, 0), node(NodeState.OFFLINE, 5), 40.0,
                                        node(NodeState.ONLINE, 50), 200.0], []),
    ("reconnect attempts keep the clock running", [node(NodeState.ONLINE, 0), node(NodeState.OFFLINE, 0),
                                                   node(NodeState.CONNECTING, 30), node(NodeState.OFFLINE, 61)],
     [("firing", 3)]),
    ("never online: not offline", [node(NodeState.CONNECTING, 0), node(NodeState.OFFLINE, 1), 500.0], []),
]


@pytest.mark.parametrize("name, steps, expected", OFFLINE_CASES, ids=[case[0] for case in OFFLINE_CASES])
def test_node_offline(name, steps, expected):
    evaluator = AlertEvaluator(AlertRules(node_offline_seconds=60))
    got = []
    for i, step in enumerate(steps):
        alerts = evaluator.tick(T0 + step) if isinstance(step, float) else evaluator.take(step)
        got += [(alert.state.value, i) for alert in alerts]
    assert got == expected


def test_node_offline_says_for_how_long_and_why():
    evaluator = AlertEvaluator(AlertRules(node_offline_seconds=60))
    evaluator.take(node(NodeState.ONLINE, 0))
    evaluator.take(node(NodeState.OFFLINE, 10, "connection lost"))
    evaluator.take(node(NodeState.CONNECTING, 20))
    (fired,) = evaluator.tick(T0 + 135)
    assert fired.message == "box has been offline for 2 min 5 s (offline: connection lost)"
    (cleared,) = evaluator.take(node(NodeState.ONLINE, 200))
    assert cleared.message == "box is back online after 3 min 10 s"


def state(value: JobState, at: float, detail: str = "", run: str = "r1", generation: int = 1) -> JobStateChanged:
    return JobStateChanged("train", run, value, generation, generation - 1, detail, at=T0 + at)


def metric(worker: str, kind: str, at: float, run: str = "r1", **data) -> WorkerMetric:
    return WorkerMetric("train", run, worker, 0 if worker == "w0" else 1, Metric({"event": kind, **data}), at=T0 + at)


def straggler(worker: str, epoch: int, at: float, run: str = "r1") -> Straggler:
    return Straggler("train", run, worker, 400.0, 1200.0, at=T0 + at, epoch=epoch)


ALL_JOB_RULES = AlertRules(job_failed=True, job_stalled=True, straggler=True, job_succeeded=True, run_shrunk=True)
GOING_ON = "w2 lost (offline 300 s): going on with w0, w1 from epoch 3 (global batch 96 kept: 48 per worker)"

# (events; alerts as (kind, state, index of the event))
JOB_CASES = [
    ("succeeded once", [state(JobState.RUNNING, 0), state(JobState.SUCCEEDED, 9), state(JobState.SUCCEEDED, 9)],
     [("job_succeeded", "firing", 1)]),
    ("failed once, with the reason", [state(JobState.RUNNING, 0), state(JobState.FAILED, 9, "w1: exit 1")],
     [("job_failed", "firing", 1)]),
    ("a stall restarts the run, and progress clears it",
     [state(JobState.RUNNING, 0), state(JobState.RESTARTING, 5, "w1: no progress for 300s (stalled)"),
      metric("w0", "start", 8), metric("w0", "step", 9, step=1, epoch=1), metric("w1", "step", 10, step=1, epoch=1)],
     [("job_stalled", "firing", 1), ("job_stalled", "cleared", 3)]),
    ("a stall that fails the run stays", [state(JobState.RUNNING, 0),
                                          state(JobState.FAILED, 5, "w1: no progress for 300s (stalled)")],
     [("job_stalled", "firing", 1), ("job_failed", "firing", 1)]),
    ("a restart for another reason is no stall", [state(JobState.RUNNING, 0), state(JobState.RESTARTING, 5, "w1: exit 1")],
     []),
    ("a straggler fires once and clears when an epoch passes without a flag",
     [state(JobState.RUNNING, 0), straggler("w1", 2, 10), metric("w1", "epoch", 20, epoch=3), straggler("w1", 3, 20),
      metric("w1", "epoch", 30, epoch=4), metric("w1", "epoch", 40, epoch=5)],
     [("straggler", "firing", 1), ("straggler", "cleared", 5)]),
    ("a straggler still firing clears when the run ends",
     [state(JobState.RUNNING, 0), straggler("w1", 2, 10), state(JobState.SUCCEEDED, 30)],
     [("straggler", "firing", 1), ("job_succeeded", "firing", 2), ("straggler", "cleared", 2)]),
    ("a run that goes on with fewer machines, each time; a machine back is no alert",
     [state(JobState.RUNNING, 0), dataclasses.replace(state(JobState.RESTARTING, 9, GOING_ON), regroup=SHRUNK),
      dataclasses.replace(state(JobState.RESTARTING, 9, GOING_ON), regroup=SHRUNK),
      dataclasses.replace(state(JobState.RESTARTING, 30, "w2 back: rejoining with w0, w1, w2", generation=2),
                          regroup=REJOINED),
      dataclasses.replace(state(JobState.RESTARTING, 40, GOING_ON, generation=3), regroup=SHRUNK)],
     [("run_shrunk", "firing", 1), ("run_shrunk", "firing", 4)]),
    ("each run has its own end", [state(JobState.FAILED, 1), state(JobState.FAILED, 2, run="r2")],
     [("job_failed", "firing", 0), ("job_failed", "firing", 1)]),
]


@pytest.mark.parametrize("name, events, expected", JOB_CASES, ids=[case[0] for case in JOB_CASES])
def test_job_alerts(name, events, expected):
    evaluator = AlertEvaluator(ALL_JOB_RULES)
    got = [(alert.kind, alert.state.value, i) for i, event in enumerate(events) for alert in evaluator.take(event)]
    assert got == expected


def test_job_alerts_name_the_run_and_the_worker():
    evaluator = AlertEvaluator(ALL_JOB_RULES)
    (slow,) = evaluator.take(straggler("w1", 2, 10))
    assert (slow.worker, slow.job, slow.run_id, slow.value, slow.threshold) == ("w1", "train", "r1", 400, 1200)
    assert slow.message == "w1 is a straggler in train (run r1): 400 examples/s against 1200 for the others"
    capped = ("GPU 0 power cap: clocks 1,400 of 1,980 MHz at its 250 W limit; raise the limit (nvidia-smi -pl) "
              "or accept it")
    (held,) = AlertEvaluator(ALL_JOB_RULES).take(dataclasses.replace(straggler("w1", 2, 10), held_back=(capped,)))
    assert held.message == ("w1 is a straggler in train (run r1): 400 examples/s against 1200 for the others. "
                            "Held back: GPU 0 power cap: clocks 1,400 of 1,980 MHz at its 250 W limit; raise the "
                            "limit (nvidia-smi -pl) or accept it")
    (failed, cleared) = evaluator.take(state(JobState.FAILED, 20, "w1: exit 137 (killed)"))
    assert failed.message == "train (run r1) failed: w1: exit 137 (killed)"
    assert cleared.message == "train (run r1) failed" and cleared.key == slow.key


RUN = "train-20261124-021500-a3f9"


def queued(state: str, at: float, entry: str = "q-12", run: str = RUN, reason: str = "") -> QueueRunChanged:
    return QueueRunChanged(entry, "train", run, state, reason, at=T0 + at)


# (events; alerts as (kind, queue entry, index of the event))
QUEUE_CASES = [
    ("a run's life: started, then succeeded", [queued("started", 0), queued("succeeded", 60)],
     [("queued_run_started", "q-12", 0), ("queued_run_succeeded", "q-12", 1)]),
    ("a repeated event fires once", [queued("started", 0), queued("started", 1), queued("failed", 9, reason="x"),
                                     queued("failed", 10, reason="x")],
     [("queued_run_started", "q-12", 0), ("queued_run_failed", "q-12", 2)]),
    ("once per entry and state, with or without the run id", [queued("cancelled", 0, run=""), queued("cancelled", 1)],
     [("queued_run_cancelled", "q-12", 0)]),
    ("two entries in one state are two alerts", [queued("started", 0), queued("started", 0, "q-13", "train-2")],
     [("queued_run_started", "q-12", 0), ("queued_run_started", "q-13", 1)]),
    ("a failure, and the entry after it cancelled",
     [queued("started", 0), queued("failed", 9, reason="w1: exit 1"),
      queued("cancelled", 9, "q-13", "", "after q-12, which failed")],
     [("queued_run_started", "q-12", 0), ("queued_run_failed", "q-12", 1), ("queued_run_cancelled", "q-13", 2)]),
    ("a state that is not one of the four says nothing", [queued("running", 0), queued("waiting", 1)], []),
]


@pytest.mark.parametrize("name, events, expected", QUEUE_CASES, ids=[case[0] for case in QUEUE_CASES])
def test_queued_run_alerts(name, events, expected):
    evaluator = AlertEvaluator(AlertRules(queued_runs=True))
    got = [(alert.kind, alert.queue_id, i) for i, event in enumerate(events) for alert in evaluator.take(event)]
    assert got == expected
    assert evaluator.firing == ()  # news, not a condition: nothing to clear


def test_queued_run_alerts_say_the_entry_the_job_the_run_and_why():
    evaluator = AlertEvaluator(AlertRules(queued_runs=True))
    (started,) = evaluator.take(queued("started", 0))
    assert (started.kind, started.state, started.job, started.run_id, started.queue_id) == (
        "queued_run_started", FIRING, "train", RUN, "q-12")
    assert started.message == f"q-12 (train) started as run {RUN}" and started.at == T0
    (tuned,) = evaluator.take(QueueRunChanged("q-14", "train", RUN, "started", at=T0,
                                              settings=("epochs=20", "env.SEED=7")))
    assert tuned.message == f"q-14 (train epochs=20 env.SEED=7) started as run {RUN}"  # which experiment it is
    (failed,) = evaluator.take(queued("failed", 9, reason="w1: exit 1 (ValueError: bad shape)"))
    assert failed.message == "q-12 (train) failed: w1: exit 1 (ValueError: bad shape)"
    assert (failed.kind, failed.run_id, failed.queue_id) == ("queued_run_failed", RUN, "q-12")
    (cancelled,) = evaluator.take(queued("cancelled", 9, "q-13", "", "after q-12, which failed"))
    assert cancelled.message == "q-13 (train) cancelled: after q-12, which failed"
    assert (cancelled.kind, cancelled.run_id, cancelled.queue_id) == ("queued_run_cancelled", "", "q-13")
    (succeeded,) = evaluator.take(queued("succeeded", 20, "q-14", "train-3"))
    assert succeeded.message == "q-14 (train) succeeded (run train-3)"
    (bare,) = evaluator.take(queued("failed", 20, "q-15", ""))
    assert bare.message == "q-15 (train) failed"


def test_queued_runs_is_its_own_switch_and_leaves_the_run_alerts_alone():
    events = [queued("started", 0), JobStateChanged("train", RUN, JobState.RUNNING, 1, 0, at=T0 + 1),
              JobStateChanged("train", RUN, JobState.FAILED, 1, 0, "w1: exit 1", at=T0 + 9),
              queued("failed", 9, reason="w1: exit 1")]
    every_other_rule = AlertEvaluator(dataclasses.replace(ALL_JOB_RULES, gpu_temperature=85, node_offline_seconds=1))
    assert [alert.kind for event in events for alert in every_other_rule.take(event)] == ["job_failed"]
    both = AlertEvaluator(dataclasses.replace(ALL_JOB_RULES, queued_runs=True))
    got = [alert for event in events for alert in both.take(event)]
    assert [alert.kind for alert in got] == ["queued_run_started", "job_failed", "queued_run_failed"]
    assert got[1].queue_id == ""  # job_failed is about the run, whoever started it


def test_two_entries_alerts_never_share_a_key():
    one = Alert("queued_run_failed", FIRING, "q-1 (train) failed", job="train", run_id="r", queue_id="q-1")
    assert one.key != dataclasses.replace(one, queue_id="q-2").key
    assert one.key != dataclasses.replace(one, kind="queued_run_cancelled").key
    assert one.key != dataclasses.replace(one, run_id="r2").key  # about a run, like job_failed


# -- budgets: the recorded MIG H100 draws 433.78 W; at 1.00 a kWh an hour of it costs 0.43378 ------------------


def drawing(run: str = "", at: float = 0.0) -> NodeStatsUpdated:
    """The recorded H100 a second-by-second sample; its one process is run `run`'s worker when given."""
    gpu = H100.gpus[0]
    owner = ProcessOwner("worker", "alice", 1000, run_id=run, job="train", index=0) if run else None
    processes = tuple(dataclasses.replace(process, owner=owner) for process in gpu.processes[:1]) if run else ()
    return NodeStatsUpdated("desk", dataclasses.replace(H100, gpus=(dataclasses.replace(gpu, processes=processes),)),
                            at=at)


def budget_alerts(rules: AlertRules, events: list[object]) -> list[tuple[str, str, int]]:
    evaluator = AlertEvaluator(rules, Tariff(1.0, "EUR"))
    return [(alert.kind, alert.state.value, round(alert.at - start)) for event in events
            for alert in evaluator.take(event)]


def local(hour: int, minute: int = 0) -> float:
    day = time.localtime(T0)
    return time.mktime((day.tm_year, day.tm_mon, day.tm_mday, hour, minute, 0, 0, 0, -1))


start = local(21)


def test_the_days_budget_fires_once_when_crossed_and_clears_at_midnight():
    """0.10 EUR is crossed after 0.10 / 0.43378 h = 830 s of the GPU; then nothing until the next day."""
    events = [drawing(at=start + second) for second in range(0, 3 * 3600 + 1, 1)]  # 21:00 to 00:00
    alerts = budget_alerts(AlertRules(budget_per_day=0.10), events)
    assert alerts == [("budget_per_day", "firing", 830), ("budget_per_day", "cleared", 3 * 3600)]


def test_the_days_budget_counts_the_rest_of_the_machines_too():
    """The H100 (433.78 W: 830 s to 0.10 EUR) on a desk whose rest draws 600 W by its estimate: crossed sooner."""
    events = [dataclasses.replace(e, stats=dataclasses.replace(e.stats, host_power=600.0))
              for e in (drawing(at=start + second) for second in range(0, 3600))]
    assert budget_alerts(AlertRules(budget_per_day=0.10), events) == [("budget_per_day", "firing", 349)]


def test_a_runs_budget_counts_only_the_gpus_its_workers_are_on():
    events = [state(JobState.RUNNING, 0, run="r1"), *[drawing(at=start + s) for s in range(600)],  # not the run's
              *[drawing("r1", start + 600 + s) for s in range(1200)]]
    events[0] = dataclasses.replace(events[0], at=start)
    alerts = budget_alerts(AlertRules(budget_per_run=0.10), events)
    assert alerts == [("budget_per_run", "firing", 600 + 829)]  # the step into its first sample is its own
    evaluator = AlertEvaluator(AlertRules(budget_per_run=0.10), Tariff(1.0, "EUR"))
    said = [alert for event in events for alert in evaluator.take(event)]
    assert said[0].message == "train (run r1) has cost 0.10 EUR in electricity, over its budget of 0.10 EUR"
    assert said[0].run_id == "r1" and said[0].threshold == 0.10


def test_each_runs_budget_is_its_own():
    events = [state(JobState.RUNNING, 0, run="r1"), *[drawing("r1", start + s) for s in range(1000)],
              state(JobState.SUCCEEDED, 1000, run="r1"), state(JobState.RUNNING, 1001, run="r2"),
              *[drawing("r2", start + 1001 + s) for s in range(1000)]]
    evaluator = AlertEvaluator(AlertRules(budget_per_run=0.10), Tariff(1.0, "EUR"))
    said = [alert for event in events for alert in evaluator.take(event)]
    assert [(alert.kind, alert.run_id) for alert in said] == [("budget_per_run", "r1"), ("budget_per_run", "r2")]

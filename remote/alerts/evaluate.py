"""The alert rules of [alerts] applied to the hub's events: which alerts fire, and which clear.

Pure: :meth:`AlertEvaluator.take` gets each event, :meth:`AlertEvaluator.tick` the time (for the
offline clock, when no event comes), and both return the alerts to publish. No I/O and no clock of
its own, so the table tests feed events and times and read what comes out.

Each condition fires once, then stays quiet until it clears (one CLEARED alert). Temperature and
memory clear only a margin below the threshold (hysteresis), so a GPU hovering at the threshold
does not flap. What each rule watches:

- gpu_temperature / gpu_memory: every GPU of every node, from the stats agent's samples.
- node_offline: a node that was online and has not been for `node_offline_seconds` (one that never
  connected is not offline: the TUI and preflight already say so); clears when it is back.
- job_stalled: the controller's own stall detection (a worker printed nothing for the job's
  `stall_timeout`: the run restarts, or fails); clears when a worker of the run makes progress again.
- straggler: the controller's own straggler detection (a worker's rate for an epoch below 60% of
  the median of the others'); clears when a later epoch passes without it being flagged.
- job_failed / job_succeeded: the run's end, once per run.
- run_shrunk: the run went on without a machine that left for good (its JobStateChanged says SHRUNK), once each
  time.
- budget_per_day / budget_per_run: what the electricity cost, each GPU's energy between two samples
  (energy/'s step rule) priced by [cluster]'s tariff: all GPUs and the rest of the machines (where RAPL
  or idle_watts gives it) since local midnight (fires once a day, clears at midnight), and the GPUs a run's
  workers are on while it runs (fires once per run).
- queued_runs: each run `homegpu serve`'s queue starts (QueueRunChanged): queued_run_started,
  queued_run_succeeded, queued_run_failed, queued_run_cancelled (an entry cancelled before or while it
  ran), once per queue entry and state.
Alerts about a run that are still firing when it ends clear then (but not the stall that ended it). A
run's end and a queued run's alerts are news, not conditions: they fire once and never clear.
"""

from __future__ import annotations

import re
import time
from dataclasses import replace
from typing import Callable

from homegpu.remote.config import AlertRules, Tariff
from homegpu.remote.energy import JOULES_PER_KWH, EnergySteps, Step
from homegpu.remote.events import (
    RUN_ALERTS, SHRUNK, Alert, AlertState, JobState, JobStateChanged, NodeState, NodeStateChanged, NodeStatsUpdated,
    QueueRunChanged, Straggler, WorkerMetric,
)

TEMPERATURE_MARGIN = 5.0  # °C below the threshold before a hot GPU's alert clears
MEMORY_MARGIN = 5.0  # percentage points below the threshold before a full GPU's alert clears
_STALLED = re.compile(r"\bstalled\b")
QUEUED_STATES = ("started", "succeeded", "failed", "cancelled")  # QueueRunChanged.state: one alert kind each


class AlertEvaluator:
    """Turns events into FIRING and CLEARED alerts for `rules`; remembers what is firing."""

    def __init__(self, rules: AlertRules, tariff: Tariff = Tariff()) -> None:
        self.rules, self.tariff = rules, tariff
        self._firing: dict[tuple, Alert] = {}
        self._said: set[tuple] = set()  # one-shot alerts (a run's end, a queued run's news) already given
        self._online_once: set[str] = set()
        self._offline: dict[str, tuple[float, str]] = {}  # node -> (since, why)
        self._flagged: dict[tuple[str, str], int] = {}  # (run id, worker) -> the epoch it was last flagged for
        self._run: tuple[str, str] = ("", "")  # (job, run id) of the run going on
        self._steps = EnergySteps()  # each GPU's energy since its previous sample, keyed (node, GPU)
        self._day: tuple[str, float] = ("", 0.0)  # (local date, the GPUs' cost that day)
        self._run_cost: dict[str, float] = {}  # run id -> its GPUs' cost so far

    @property
    def firing(self) -> tuple[Alert, ...]:
        return tuple(self._firing.values())

    def take(self, event: object) -> list[Alert]:
        """The alerts `event` fires or clears (most events: none)."""
        handler = _HANDLERS.get(type(event))
        return handler(self, event) if handler else []

    def tick(self, now: float) -> list[Alert]:
        """The node_offline alerts due at `now` (a node offline long enough, with no event since)."""
        return [alert for node in list(self._offline) for alert in self._offline_due(node, now)]

    # -- firing and clearing ---------------------------------------------------------------------

    def _fire(self, alert: Alert) -> list[Alert]:
        if alert.key in self._firing:
            return []
        self._firing[alert.key] = alert
        return [alert]

    def _clear(self, key: tuple, at: float, message: str, value: float | None = None) -> list[Alert]:
        fired = self._firing.pop(key, None)
        if fired is None:
            return []
        job, run_id = (fired.job, fired.run_id) if fired.kind in RUN_ALERTS else self._run
        return [replace(fired, state=AlertState.CLEARED, message=message, at=at, job=job, run_id=run_id,
                        value=fired.value if value is None else value)]

    def _once(self, alert: Alert, key: tuple | None = None) -> list[Alert]:
        """`alert` the first time its `key` (else its own) comes; nothing after."""
        key = alert.key if key is None else key
        if key in self._said:
            return []
        self._said.add(key)
        return [alert]

    def _alert(self, kind: str, message: str, at: float, **about) -> Alert:
        job, run_id = self._run
        return Alert(kind, AlertState.FIRING, message, at=at, **{"job": job, "run_id": run_id, **about})

    # -- GPUs ------------------------------------------------------------------------------------

    def _stats(self, event: NodeStatsUpdated) -> list[Alert]:
        rules, alerts = self.rules, []
        if rules.budget_per_day is not None or rules.budget_per_run is not None:
            alerts += self._spend(event)
        if rules.gpu_temperature is None and rules.gpu_memory_percent is None:
            return alerts
        for gpu in event.stats.gpus:
            index = int(gpu.index) if _is_number(gpu.index) else 0
            alerts += self._level("gpu_temperature", rules.gpu_temperature, TEMPERATURE_MARGIN, gpu.temp,
                                  event, index, _temperature_words)
            alerts += self._level("gpu_memory", rules.gpu_memory_percent, MEMORY_MARGIN, gpu.mem_percent,
                                  event, index, _memory_words)
        return alerts

    def _level(self, kind: str, threshold: float | None, margin: float, value: object, event: NodeStatsUpdated,
               gpu: int, words: Callable[[str, float, float, bool], str]) -> list[Alert]:
        """Fire at or above `threshold`; clear at or below `threshold - margin`; between, nothing changes."""
        if threshold is None or not _is_number(value):
            return []
        where = f"{event.node} GPU {gpu}"
        if value >= threshold:
            return self._fire(self._alert(kind, words(where, value, threshold, True), event.at, node=event.node,
                                          gpu=gpu, value=float(value), threshold=threshold))
        if value <= threshold - margin:
            return self._clear(_key(kind, node=event.node, gpu=gpu), event.at,
                               words(where, value, threshold - margin, False), float(value))
        return []

    # -- budgets ---------------------------------------------------------------------------------

    def _spend(self, event: NodeStatsUpdated) -> list[Alert]:
        """Add what each GPU of the node cost since its previous sample to the day's and its run's cost, and what
        the rest of the machine cost (RAPL, or its idle_watts estimate) to the day's."""
        alerts = self._new_day(event.at)
        host = self._steps.step((event.node, "host"), event.at, event.stats.host_power, event.stats.host_energy)
        if host is not None:
            self._add_to_day(host)
        for position, gpu in enumerate(event.stats.gpus):
            key = (event.node, int(gpu.index) if _is_number(gpu.index) else position)
            step = self._steps.step(key, event.at, gpu.power, gpu.energy)
            if step is None:
                continue
            cost = self._add_to_day(step)
            run_id = self._run[1]
            if run_id and any(_is_worker_of(process.owner, run_id) for process in gpu.processes):
                self._run_cost[run_id] = self._run_cost.get(run_id, 0.0) + cost
        return alerts + self._over_budget(event.at)

    def _add_to_day(self, step: Step) -> float:
        """What `step` cost at its moment's price, added to the day's cost."""
        cost = step.joules / JOULES_PER_KWH * self.tariff.price_at(step.middle)
        self._day = (self._day[0], self._day[1] + cost)
        return cost

    def _new_day(self, at: float) -> list[Alert]:
        """At local midnight the day's cost starts again from 0, and the day's budget alert clears."""
        today = time.strftime("%Y-%m-%d", time.localtime(at))
        if today == self._day[0]:
            return []
        self._day = (today, 0.0)
        return self._clear(_key("budget_per_day"), at, f"a new day ({today}): its electricity starts from 0", 0.0)

    def _over_budget(self, at: float) -> list[Alert]:
        rules, currency, alerts = self.rules, self.tariff.currency, []
        day_cost = self._day[1]
        if rules.budget_per_day is not None and day_cost >= rules.budget_per_day:
            alerts += self._fire(self._alert(
                "budget_per_day", f"the cluster's electricity has cost {_money(day_cost, currency)} today, over the "
                f"budget of {_money(rules.budget_per_day, currency)}", at, value=day_cost,
                threshold=rules.budget_per_day))
        job, run_id = self._run
        run_cost = self._run_cost.get(run_id, 0.0)
        if rules.budget_per_run is not None and run_id and run_cost >= rules.budget_per_run:
            alerts += self._once(self._alert(
                "budget_per_run", f"{job} (run {run_id}) has cost {_money(run_cost, currency)} in electricity, over "
                f"its budget of {_money(rules.budget_per_run, currency)}", at, value=run_cost,
                threshold=rules.budget_per_run))
        return alerts

    # -- nodes -----------------------------------------------------------------------------------

    def _node_state(self, event: NodeStateChanged) -> list[Alert]:
        node = event.node
        if event.state is NodeState.ONLINE:
            self._online_once.add(node)
            since, _ = self._offline.pop(node, (event.at, ""))
            return self._clear(_key("node_offline", node=node), event.at,
                               f"{node} is back online after {_duration(event.at - since)}", event.at - since)
        if event.state is NodeState.ASLEEP:  # put to sleep: not a fault, and no offline alert while it sleeps
            since, _ = self._offline.pop(node, (event.at, ""))
            return self._clear(_key("node_offline", node=node), event.at, f"{node} is asleep", event.at - since)
        if node not in self._online_once:
            return []
        since, why = self._offline.get(node, (event.at, ""))
        if event.state is not NodeState.CONNECTING:  # "connecting" says nothing of why it went
            why = event.state.value + (f": {event.reason}" if event.reason else "")
        self._offline[node] = (since, why)
        return self._offline_due(node, event.at)

    def _offline_due(self, node: str, now: float) -> list[Alert]:
        limit = self.rules.node_offline_seconds
        since, why = self._offline[node]
        if limit is None or now - since < limit:
            return []
        message = f"{node} has been offline for {_duration(now - since)}" + (f" ({why})" if why else "")
        return self._fire(self._alert("node_offline", message, now, node=node, value=now - since, threshold=limit))

    # -- runs ------------------------------------------------------------------------------------

    def _job_state(self, event: JobStateChanged) -> list[Alert]:
        rules, alerts = self.rules, []
        if not event.state.finished:
            self._run = (event.job, event.run_id)
        stalled = bool(_STALLED.search(event.detail))
        run = f"{event.job} (run {event.run_id})"
        if stalled and rules.job_stalled:
            alert = self._alert("job_stalled", f"{run} stalled: {event.detail}", event.at, job=event.job,
                                run_id=event.run_id)
            alerts += self._fire(alert)
        if event.state is JobState.FAILED and rules.job_failed:
            alerts += self._once(self._alert("job_failed", f"{run} failed: {event.detail or 'no detail'}",
                                             event.at, job=event.job, run_id=event.run_id))
        if rules.run_shrunk and event.regroup == SHRUNK:
            alerts += self._once(self._alert("run_shrunk", f"{run}: {event.detail}", event.at, job=event.job,
                                             run_id=event.run_id), key=("run_shrunk", event.run_id, event.generation))
        if event.state is JobState.SUCCEEDED and rules.job_succeeded:
            alerts += self._once(self._alert("job_succeeded", f"{run} succeeded", event.at, job=event.job,
                                             run_id=event.run_id))
        if event.state.finished:
            alerts += self._end_run(event, ("straggler",) if stalled else ("straggler", "job_stalled"))
        return alerts

    def _end_run(self, event: JobStateChanged, kinds: tuple[str, ...]) -> list[Alert]:
        """Clear the alerts of `kinds` still firing about the run that ended; forget its stragglers."""
        if self._run[1] == event.run_id:
            self._run = ("", "")
        self._flagged = {flag: epoch for flag, epoch in self._flagged.items() if flag[0] != event.run_id}
        ended = [key for key, alert in self._firing.items() if alert.kind in kinds and alert.run_id == event.run_id]
        return [cleared for key in ended
                for cleared in self._clear(key, event.at, f"{event.job} (run {event.run_id}) {event.state.value}")]

    def _metric(self, event: WorkerMetric) -> list[Alert]:
        metric = event.metric
        if not metric.progressed:
            return []
        alerts = self._clear(_key("job_stalled", run_id=event.run_id), event.at,
                             f"{event.job} (run {event.run_id}) makes progress again: {event.worker} "
                             f"reported {metric.event} {metric.step or metric.epoch or ''}".rstrip())
        flag, epoch = (event.run_id, event.worker), metric.epoch
        if metric.event == "epoch" and flag in self._flagged and epoch is not None and epoch >= self._flagged[flag] + 2:
            del self._flagged[flag]  # the epoch after the flagged one passed without a flag
            alerts += self._clear(_key("straggler", worker=event.worker, run_id=event.run_id), event.at,
                                  f"{event.worker} keeps pace again (epoch {epoch})")
        return alerts

    def _straggler(self, event: Straggler) -> list[Alert]:
        if not self.rules.straggler:
            return []
        flag = (event.run_id, event.worker)
        epoch = event.epoch if event.epoch is not None else 0
        self._flagged[flag] = max(self._flagged.get(flag, epoch), epoch)
        message = (f"{event.worker} is a straggler in {event.job} (run {event.run_id}): "
                   f"{event.examples_per_sec:.0f} {event.unit} against {event.others_median:.0f} for the others"
                   f"{event.cause_text}")
        return self._fire(Alert("straggler", AlertState.FIRING, message, worker=event.worker, job=event.job,
                                run_id=event.run_id, value=event.examples_per_sec,
                                threshold=event.others_median, at=event.at))

    # -- serve's queue ---------------------------------------------------------------------------

    def _queued_run(self, event: QueueRunChanged) -> list[Alert]:
        """One alert per entry and state (the runner may say a state twice, with or without the run id)."""
        if not self.rules.queued_runs or event.state not in QUEUED_STATES:
            return []
        alert = Alert(f"queued_run_{event.state}", AlertState.FIRING, _queued_words(event), job=event.job,
                      run_id=event.run_id, queue_id=event.entry_id, at=event.at)
        return self._once(alert, ("queued_run", event.entry_id, event.state))


_HANDLERS = {
    NodeStatsUpdated: AlertEvaluator._stats,
    NodeStateChanged: AlertEvaluator._node_state,
    JobStateChanged: AlertEvaluator._job_state,
    WorkerMetric: AlertEvaluator._metric,
    Straggler: AlertEvaluator._straggler,
    QueueRunChanged: AlertEvaluator._queued_run,
}


def _key(kind: str, node: str = "", gpu: int | None = None, worker: str = "", run_id: str = "") -> tuple:
    """The key of the alert these would make (Alert.key), to find it while it fires."""
    return Alert(kind, AlertState.FIRING, "", node=node, gpu=gpu, worker=worker, run_id=run_id, at=0.0).key


def _is_number(value: object) -> bool:
    """A measured number (the stats parser's NA is a str; a bool is no measurement either)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _temperature_words(where: str, value: float, threshold: float, firing: bool) -> str:
    if firing:
        return f"{where} is at {value:.0f} °C (alert at {threshold:g} °C)"
    return f"{where} cooled to {value:.0f} °C (at or below {threshold:g} °C)"


def _memory_words(where: str, value: float, threshold: float, firing: bool) -> str:
    if firing:
        return f"{where} has {value:.0f}% of its memory in use (alert at {threshold:g}%)"
    return f"{where} memory use is down to {value:.0f}% (at or below {threshold:g}%)"


def _queued_words(event: QueueRunChanged) -> str:
    """The alert's sentence: `q-12 (train epochs=20) started as run R`, `q-12 (train) failed: why`, `q-13 (train)
    cancelled`: the job with the entry's own settings, as `homegpu queue` names it."""
    words = f"{event.entry_id} ({' '.join((event.job, *event.settings))}) {event.state}"
    if event.state == "started" and event.run_id:
        return f"{words} as run {event.run_id}"
    if event.reason:
        return f"{words}: {event.reason}"
    return f"{words} (run {event.run_id})" if event.run_id else words


def _is_worker_of(owner: object, run_id: str) -> bool:
    """Whether a GPU process's owner (the agent's word on it, or None) is a worker of homegpu's run `run_id`."""
    return getattr(owner, "kind", "") == "worker" and getattr(owner, "run_id", "") == run_id


def _money(amount: float, currency: str) -> str:
    return f"{amount:.2f} {currency}".rstrip()


def _duration(seconds: float) -> str:
    seconds = max(0, round(seconds))
    if seconds < 60:
        return f"{seconds} s"
    minutes, seconds = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes} min {seconds} s" if seconds else f"{minutes} min"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes} min"

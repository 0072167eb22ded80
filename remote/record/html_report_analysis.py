"""What the run's data says, in words: its outcome, its figures, and what limited it.

Pure functions of a :class:`Timeline`, the workers' series and run.json's bandwidth matrix; the report
puts the sentences on the page and `homegpu report` prints them.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from homegpu.remote.events import BandwidthMatrix
from homegpu.remote.net import allreduce_seconds, format_duration, format_gbits
from homegpu.remote.record.experiment import find_stragglers
from homegpu.remote.record.html_report_svg import format_clock as _clock
from homegpu.remote.record.timeline_schema import Series, Timeline, WorkerTimeline

LOW_GPU_UTIL = 50.0  # % busy while the workers ran, below which the GPUs were waiting on something
BUSY_CPU = 85.0
NETWORK_SHARE = 0.5  # all-reduce time / step time above which the network sets the pace


@dataclass(frozen=True)
class RunFigures:
    """The run's headline numbers; None where the data has none."""

    outcome: str
    outcome_detail: str
    duration: float
    restarts: int
    final: dict
    rates: dict[str, float]
    gpu_util: float | None
    cpu: float | None
    step_seconds: float | None
    params: int | None
    batch_size: int | None
    shares: dict[str, int] = field(default_factory=dict)  # a balanced run's last share of a step, per worker


def _outcome(timeline: Timeline) -> tuple[str, str]:
    ends = timeline.events_of("end")
    if not ends:
        return "unfinished", "no end recorded (still running, or the controller stopped first)"
    details = ends[-1].details
    return details.get("state", "ended"), details.get("detail", "")


def running_windows(timeline: Timeline) -> list[tuple[float, float]]:
    """Spans from each `running` event to the next restart, stop or end (or the timeline's end)."""
    windows, opened = [], None
    for event in timeline.events:
        if event.kind == "running" and opened is None:
            opened = event.at
        elif event.kind in ("restart", "stop", "end") and opened is not None:
            windows.append((opened, event.at))
            opened = None
    if opened is not None and timeline.end is not None:
        windows.append((opened, timeline.end))
    return windows or ([(timeline.start, timeline.end)] if timeline.start is not None else [])


def _mean_within(series: list[Series], windows: list[tuple[float, float]]) -> float | None:
    values = [v for s in series for t, v in zip(s.times, s.values)
              if v is not None and any(a <= t <= b for a, b in windows)]
    return sum(values) / len(values) if values else None


def _steady_rate(worker: WorkerTimeline) -> float | None:
    """Median examples/s, leaving out each worker's first line (it includes the warm-up)."""
    values = worker.examples_per_sec.measured
    values = values[1:] if len(values) > 2 else values
    return statistics.median(values) if values else None


def _last(series: Series) -> float | None:
    return next((v for v in reversed(series.values) if v is not None), None)


def run_figures(timeline: Timeline, workers: tuple[WorkerTimeline, ...]) -> RunFigures:
    state, detail = _outcome(timeline)
    windows = running_windows(timeline)
    rates = {w.name: rate for w in workers if (rate := _steady_rate(w)) is not None}
    final = {}
    if workers:  # every worker prints the same (global) loss and accuracy: the chief's will do
        chief = workers[0]
        for name, epochs, steps in (("loss", chief.epoch_loss, chief.loss),
                                    ("accuracy", chief.epoch_accuracy, chief.accuracy),
                                    ("val_loss", chief.val_loss, Series()),
                                    ("val_accuracy", chief.val_accuracy, Series())):
            value = _last(epochs) if epochs.measured else _last(steps)
            if value is not None:
                final[name] = value
    starts = [e.details for e in timeline.events_of("worker_start")]
    params = next((d["params"] for d in starts if isinstance(d.get("params"), int)), None)
    batch = next((d["batch_size"] for d in starts if isinstance(d.get("batch_size"), int)), None)
    median_rate = statistics.median(rates.values()) if rates else 0
    step = batch / median_rate if batch and median_rate else None
    return RunFigures(
        outcome=state, outcome_detail=detail, duration=timeline.duration, restarts=len(timeline.events_of("restart")),
        final=final, rates=rates,
        gpu_util=_mean_within([g.util for n in timeline.nodes for g in n.gpus], windows),
        cpu=_mean_within([n.cpu for n in timeline.nodes], windows), step_seconds=step, params=params,
        batch_size=batch, shares={w.name: int(share) for w in workers if (share := _last(w.share)) is not None})


def _straggler_sentences(timeline: Timeline, figures: RunFigures) -> list[str]:
    """Workers the run flagged as stragglers (with what held their GPUs back, where the flag saw it), and
    any whose steady rate shows it without a flag. Not a balanced run's slowest: its share followed its speed, so
    the others did not wait for it (the shares' chart shows it)."""
    found = {e.worker: (e.details.get("examples_per_sec"), e.details.get("others_median"), _held_back(e.details))
             for e in timeline.events_of("straggler")}
    for worker, median in find_stragglers(figures.rates):
        found.setdefault(worker, (figures.rates[worker], median, ""))
    return [f"{worker} was a straggler: {rate:,.0f} examples/s against {others:,.0f} for the others, and "
            f"synchronous training waits for the slowest worker at every step.{held}"
            for worker, (rate, others, held) in found.items()
            if rate is not None and others is not None and worker not in figures.shares]


def _held_back(details: dict) -> str:
    """" Held back: GPU 0 thermal slowdown ...; improve the case's airflow." (the Straggler event's
    sentences, as the timeline kept them), or "" where none were seen or the record lacks them."""
    causes = [cause for cause in details.get("held_back") or () if isinstance(cause, str)]
    return f" Held back: {'. '.join(causes)}." if causes else ""


def human_duration(seconds: float) -> str:
    """`42 s`, `12 min 5 s`, `1 h 02 min`: a run's length."""
    seconds = int(round(seconds))
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min {seconds % 60} s"
    return f"{seconds // 3600} h {seconds % 3600 // 60:02d} min"


def _network_sentence(figures: RunFigures, matrix: BandwidthMatrix | None) -> str | None:
    if not (matrix and figures.params and figures.step_seconds and len(figures.rates) > 1):
        return None
    slow = matrix.slowest()
    if slow is None:
        return None
    allreduce = allreduce_seconds(figures.params, len(figures.rates), slow.gbits)
    if allreduce < NETWORK_SHARE * figures.step_seconds:
        return None
    return (f"The network: an all-reduce of {figures.params:,} parameters over the slowest link ({slow.src} → "
            f"{slow.dst}, {format_gbits(slow.gbits)}) takes about {format_duration(allreduce)}, "
            f"{allreduce / figures.step_seconds:.0%} of a {format_duration(figures.step_seconds)} step, "
            "wherever it cannot overlap the compute.")


def _waiting_sentence(figures: RunFigures) -> str | None:
    if figures.gpu_util is None or figures.gpu_util >= LOW_GPU_UTIL:
        return None
    step = f" while a step took {format_duration(figures.step_seconds)}" if figures.step_seconds else ""
    if figures.cpu is not None and figures.cpu >= BUSY_CPU:
        return (f"The GPUs were busy only {figures.gpu_util:.0f}% of the time{step}, with the CPUs at "
                f"{figures.cpu:.0f}%: the input pipeline on the CPU held them back.")
    return (f"The GPUs were busy only {figures.gpu_util:.0f}% of the time{step}: the workers waited, "
            "most likely on the network (gradients exchanged every step) or on data.")


def _interruption_sentences(timeline: Timeline) -> list[str]:
    sentences = []
    for restart in timeline.events_of("restart"):
        if restart.details.get("regroup"):
            continue  # said below, with who trains now
        back = next((e.at for e in timeline.events if e.kind == "running" and e.at > restart.at), None)
        lost = f"; training stood still for {human_duration(back - restart.at)}" if back else ""
        reason = restart.details.get("detail") or "no reason given"
        sentences.append(f"The run restarted at {_at(timeline, restart.at)} after {reason}{lost}.")
    for change in timeline.events:  # who trains changed: a machine left for good, or came back (jobs/fewer.py)
        if change.details.get("regroup"):
            sentences.append(f"At {_at(timeline, change.at)}, {change.details.get('detail')}.")
    for offline in _offline_spells(timeline):
        back = next((e.at for e in timeline.events if e.kind == "node_online" and e.node == offline.node
                     and e.at > offline.at), None)
        how_long = f" for {human_duration(back - offline.at)}" if back else " until the end"
        sentences.append(f"{offline.node} was offline{how_long}.")
    return sentences


def _offline_spells(timeline: Timeline) -> list:
    """Each node_offline event that began a spell: a node away is told offline again at each try (a new reason)."""
    away: set[str] = set()
    spells = []
    for event in timeline.events:
        if event.kind == "node_online":
            away.discard(event.node)
        elif event.kind == "node_offline" and event.node not in away:
            away.add(event.node)
            spells.append(event)
    return spells


def _at(timeline: Timeline, at: float) -> str:
    return _clock(at - timeline.start) if timeline.start is not None else "?"


def what_limited(timeline: Timeline, figures: RunFigures, matrix: BandwidthMatrix | None) -> list[str]:
    """Sentences naming what held the run back, most telling first; empty when the data shows nothing."""
    sentences = _straggler_sentences(timeline, figures)
    sentences += [s for s in (_network_sentence(figures, matrix), _waiting_sentence(figures)) if s]
    sentences += _interruption_sentences(timeline)
    if not sentences and figures.gpu_util is not None:
        sentences.append(f"Nothing held the GPUs back: they were busy {figures.gpu_util:.0f}% of the time.")
    elif not sentences and figures.cpu is not None and figures.cpu >= BUSY_CPU:
        sentences.append(f"No GPU recorded on these nodes: the CPUs did the training, {figures.cpu:.0f}% busy "
                         "while the workers ran.")
    return sentences


def summary_text(job: str, run_id: str, figures: RunFigures, limits: list[str]) -> str:
    """The plain-text summary `homegpu report` prints."""
    restarts = f" after {figures.restarts} restart{'s' * (figures.restarts != 1)}" if figures.restarts else ""
    lines = [f"{job} {run_id}: {figures.outcome}{restarts} in {human_duration(figures.duration)}"
             + (f" ({figures.outcome_detail})" if figures.outcome_detail else "")]
    if figures.final:
        lines.append("final " + ", ".join(f"{k} {v:.4g}" for k, v in figures.final.items()))
    if figures.rates:
        lines.append("throughput " + ", ".join(f"{w} {r:,.0f} examples/s" for w, r in figures.rates.items()))
    if figures.shares:
        total = sum(figures.shares.values())
        lines.append("balanced by speed: each step's examples " + ", ".join(
            f"{w} {share}/{total}" for w, share in figures.shares.items()) + " (at the end)")
    if figures.gpu_util is not None:
        lines.append(f"GPU util {figures.gpu_util:.0f}% while running"
                     + (f", CPU {figures.cpu:.0f}%" if figures.cpu is not None else ""))
    lines += [f"limited by: {sentence}" for sentence in limits]
    return "\n".join(lines)

"""The workers' logs as a run follows them, and read to their end when it stops.

Every line keeps its worker alive for the stall watchdog, is read for a traceback (the track keeps the
last, for the script-error verdict) and goes to experiments/RUN-ID/logs/. A worker's end (its supervisor's
last line, or a container's log ending) nudges the watch loop to poll. It reaches the hub once: a
log line as its LogLine, a metric line as a WorkerMetric (and into the run's latest figures); once
every worker has reported an epoch their rates are compared for a straggler, which says what holds
its GPUs back where its node's stats show something.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Callable, Iterable, Mapping

from homegpu.remote.events import RATE_UNITS, EventHub, LogLine, Straggler, WorkerMetric
from homegpu.remote.jobs.resume_check import FirstEpochs
from homegpu.remote.jobs.watch import EXIT_NOTE, WorkerTrack
from homegpu.remote.logs import TracebackReader
from homegpu.remote.record import ExperimentLog, find_stragglers
from homegpu.trainer import shares

LOG_DRAIN_SECONDS = 60.0  # to read an ended worker's log to its end (a flood of megabytes over SSH)

HeldBack = Callable[[str], Iterable[str]]  # a worker -> what holds its GPUs back now, in sentences


class WorkerLines:
    """Follows one generation of a run's workers, each line into its track, the experiment and the hub."""

    def __init__(self, job: str, run_id: str, hub: EventHub, tracks: dict[str, WorkerTrack],
                 experiment: ExperimentLog | None, held_back: HeldBack | None = None,
                 nudge: Callable[[], None] = lambda: None) -> None:
        self.job, self.run_id, self.hub, self.tracks, self.experiment = job, run_id, hub, tracks, experiment
        self.held_back, self.nudge = held_back, nudge

    def follow(self, generation: int, batch_size: int | None, recorded: Mapping[str, int] | None = None) -> None:
        """Start a tail of every worker's output (`batch_size`: the built-in trainer's, for examples/s).
        `recorded`: worker -> lines of this generation the experiment already holds (an attach): not written again."""
        for track in self.tracks.values():
            track.last_activity = time.monotonic()
            track.tracebacks, track.first_epochs = TracebackReader(), FirstEpochs()  # this generation's
            track.tail = track.runtime.tail(self.run_id, track.label, generation,
                                            on_line=self._taker(track, (recorded or {}).get(track.label, 0)),
                                            on_end=self.nudge,
                                            worker=track.label, batch_size=batch_size,
                                            epoch_numbers=track.epoch_numbers).start()

    def _taker(self, track: WorkerTrack, recorded: int):
        skipped = 0

        def take(line: LogLine) -> None:
            nonlocal skipped
            track.last_activity = time.monotonic()
            track.tracebacks.feed(line.text)
            new = skipped >= recorded
            skipped += not new
            if self.experiment and new:
                self.experiment.log_line(track.label, line.text)
            if EXIT_NOTE.match(line.text):
                self.nudge()
            metric = line.metric
            if metric is None:
                self.hub.publish(line)
                return
            track.progressed = track.progressed or metric.progressed
            track.first_epochs.note(metric)
            if metric.event in ("epoch", "end"):  # the summary's figures: the latest of each
                track.last_metric = track.last_metric.merged(metric)
            if self.experiment and new:
                self.experiment.metric(track.label, metric)
            self.hub.publish(WorkerMetric(self.job, self.run_id, track.label, track.slot.index, metric))
            if metric.event == "epoch" and (metric.epoch or 0) >= 2:  # epoch 1 includes warm-up
                self._check_stragglers(metric.epoch)
        return take

    def _check_stragglers(self, epoch: int) -> None:
        """Compare the workers' rates for `epoch` once every worker has reported it: examples/s,
        else steps/s (Keras's own output gives steps; examples need the script's batch size)."""
        for key, unit in RATE_UNITS.items():
            rates = {t.label: t.last_metric.number(key) for t in self.tracks.values() if t.last_metric.epoch == epoch}
            rates = {label: rate for label, rate in rates.items() if rate is not None}
            if len(rates) == len(self.tracks):
                for worker, median in find_stragglers(rates):
                    causes = tuple(self.held_back(worker)) if self.held_back else ()
                    self.hub.publish(Straggler(self.job, self.run_id, worker, rates[worker], median, unit=unit,
                                               epoch=epoch, held_back=causes,
                                               balanced=balanced_words(self.tracks[worker], self.tracks)))
                return


def balanced_words(track: WorkerTrack, tracks: Mapping[str, WorkerTrack]) -> str:
    """What a balanced run's shares (its last line's) gave a worker, in words; "" for a run not balanced. A worker
    so slow that even its smallest share outlasts the others' whole step without it is named so, with the figures
    of the workers' last epoch lines, and how to leave it out."""
    split = track.last_metric.shares
    if not split:
        return ""
    if len(split) != len(tracks):
        return "Balanced: its share of each step follows its speed, so the others do not wait for it"
    return _slows_the_run(track, tracks, split) or (
        f"Balanced: it does {split[track.slot.index]} of the {sum(split)} examples of each step, by its speed, so "
        "the others do not wait for it")


def _slows_the_run(track: WorkerTrack, tracks: Mapping[str, WorkerTrack], split: list[int]) -> str:
    """"Balanced, laptop slows the run even at its smallest share: …", or "" where it adds to the run (or a
    worker's compute speed is not known)."""
    ordered = sorted(tracks.values(), key=lambda other: other.slot.index)
    speeds = [other.last_metric.compute_examples_per_sec for other in ordered]
    if None in speeds:
        return ""
    slow = next((slow for slow in shares.slows_the_run(sum(split), speeds) if slow.rank == track.slot.index), None)
    if slow is None:
        return ""
    others = list(dict.fromkeys(other.slot.node.name for other in ordered if other is not track))
    return (f"Balanced, {slow.line(track.label, sum(split))}: the job trains faster without it "
            f"(nodes = {json.dumps(others)} in the job leaves it out)")


async def stop_tails(tracks: Iterable[WorkerTrack]) -> None:
    await asyncio.sleep(0.3)  # let the last lines of an ended worker arrive
    await asyncio.gather(*(t.tail.stop() for t in tracks if t.tail))


async def finish_tails(tracks: Iterable[WorkerTrack], run_id: str) -> tuple[str, ...]:
    """Read every ended worker's log to its last byte; "WORKER: where the full log is" for each
    that could not be (its node gone)."""
    tailed = [t for t in tracks if t.tail]
    done = await asyncio.gather(*(t.tail.finish(LOG_DRAIN_SECONDS) for t in tailed))
    return tuple(f"{t.label}: the full log is on {t.slot.node.name} in {t.runtime.run_dir(run_id)}"
                 for t, complete in zip(tailed, done) if not complete)

"""The workers' logs as a run follows them, and read to their end when it stops.

Every line keeps its worker alive for the stall watchdog and goes to experiments/RUN-ID/logs/;
a metric line becomes a Metric event (and the run's latest figures), and once every worker has
reported an epoch their rates are compared for a straggler.
"""

from __future__ import annotations

import asyncio
import time
from typing import Iterable

from homegpu.remote.jobs.failure import PROGRESS_EVENTS
from homegpu.remote.jobs.watch import WorkerTrack
from homegpu.remote.logs import LogLine
from homegpu.remote.nodes import EventHub, Metric, Straggler
from homegpu.remote.record import ExperimentLog, find_stragglers

LOG_DRAIN_SECONDS = 60.0  # to read an ended worker's log to its end (a flood of megabytes over SSH)


class WorkerLines:
    """Follows one generation of a run's workers, each line into its track, the experiment and the hub."""

    def __init__(self, job: str, run_id: str, hub: EventHub, tracks: dict[str, WorkerTrack],
                 experiment: ExperimentLog | None) -> None:
        self.job, self.run_id, self.hub, self.tracks, self.experiment = job, run_id, hub, tracks, experiment

    def follow(self, generation: int, batch_size: int | None) -> None:
        """Start a tail of every worker's output (`batch_size`: the built-in trainer's, for examples/s)."""
        for track in self.tracks.values():
            track.last_activity = time.monotonic()
            track.tail = track.runtime.tail(self.run_id, track.label, generation, hub=self.hub,
                                            on_line=self._taker(track), worker=track.label,
                                            batch_size=batch_size).start()

    def _taker(self, track: WorkerTrack):
        def take(line: LogLine) -> None:
            track.last_activity = time.monotonic()
            if self.experiment:
                self.experiment.log_line(track.label, line.text)
            data = line.metric
            if data is not None and data.get("event") in PROGRESS_EVENTS:
                track.progressed = True
            if data is not None:
                if data.get("event") in ("epoch", "end"):  # the summary's figures: the latest of each
                    track.last_metric = {**track.last_metric, **data}
                if self.experiment:
                    self.experiment.metric(track.label, data)
                self.hub.publish(Metric(self.job, self.run_id, track.label, track.slot.index, data))
                if data.get("event") == "epoch" and data.get("epoch", 0) >= 2:  # epoch 1 includes warm-up
                    self._check_stragglers(data["epoch"])
        return take

    def _check_stragglers(self, epoch: int) -> None:
        """Compare the workers' rates for `epoch` once every worker has reported it: examples/s,
        else steps/s (Keras's own output gives steps; examples need the script's batch size)."""
        for key, unit in (("examples_per_sec", "examples/s"), ("steps_per_sec", "steps/s")):
            rates = {t.label: float(t.last_metric[key]) for t in self.tracks.values()
                     if t.last_metric.get("epoch") == epoch and isinstance(t.last_metric.get(key), (int, float))}
            if len(rates) == len(self.tracks):
                for worker, median in find_stragglers(rates):
                    self.hub.publish(Straggler(self.job, self.run_id, worker, rates[worker], median, unit=unit,
                                               epoch=epoch))
                return


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

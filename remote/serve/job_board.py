"""The runs going on right now and each worker's latest figures, from the hub's job events: what
`/metrics` says of jobs. A run leaves the board when it ends (its series end with it in Prometheus)."""

from __future__ import annotations

from dataclasses import dataclass, field

from homegpu.remote.events import NO_METRIC, JobStateChanged, Metric, WorkerMetric


@dataclass
class RunFigures:
    job: str
    run_id: str
    restarts: int = 0
    workers: dict[str, Metric] = field(default_factory=dict)  # worker label -> its latest figure of each kind


class JobBoard:
    """Feed it every hub event (handle); read `runs`."""

    def __init__(self) -> None:
        self.runs: dict[str, RunFigures] = {}  # by run id

    def handle(self, event: object) -> None:
        if isinstance(event, JobStateChanged):
            if event.state.finished:
                self.runs.pop(event.run_id, None)
            else:
                self._run(event.job, event.run_id).restarts = event.restarts
        elif isinstance(event, WorkerMetric):
            figures = self._run(event.job, event.run_id).workers
            figures[event.worker] = figures.get(event.worker, NO_METRIC).merged(event.metric)

    def _run(self, job: str, run_id: str) -> RunFigures:
        return self.runs.setdefault(run_id, RunFigures(job, run_id))

"""A run's folder, experiments/RUN-ID/: the one place where its files are named.

docs/jobs.md ("What a run leaves") describes them: logs/WORKER.log, metrics.jsonl, output/, run.json,
timeline.sqlite and report.html. Everything that writes or reads a run's record asks here.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

TIMELINE_NAME = "timeline.sqlite"
METRICS_NAME = "metrics.jsonl"


@dataclass(frozen=True)
class RunFolder:
    """experiments/RUN-ID/ (`path`), whether or not its files exist yet."""

    path: Path

    @classmethod
    def of(cls, experiments: Path, run_id: str) -> RunFolder:
        return cls(Path(experiments) / run_id)

    @property
    def run_id(self) -> str:
        return self.path.name

    @property
    def logs(self) -> Path:
        """Each worker's log, as a terminal would finally show it."""
        return self.path / "logs"

    def log(self, worker: str) -> Path:
        return self.logs / f"{worker}.log"

    @property
    def metrics(self) -> Path:
        """Every metric line, one JSON object each (with its worker_label)."""
        return self.path / METRICS_NAME

    @property
    def output(self) -> Path:
        """What the chief wrote in its output dir (jobs/outputs.py brings it home)."""
        return self.path / "output"

    @property
    def manifest(self) -> Path:
        """run.json: the job's settings, each worker's TF_CONFIG and the bandwidth matrix."""
        return self.path / "run.json"

    @property
    def timeline(self) -> Path:
        return self.path / TIMELINE_NAME

    @property
    def report(self) -> Path:
        return self.path / "report.html"


def timelines(experiments: Path) -> list[Path]:
    """Every run's timeline under `experiments` (experiments/*/timeline.sqlite)."""
    return list(Path(experiments).glob(f"*/{TIMELINE_NAME}"))

"""The run's record on the machine that runs homegpu: experiments/RUN-ID/{logs/LABEL.log, metrics.jsonl, model/}."""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import IO


class ExperimentLog:
    """Appends every worker's log lines and every metric as they arrive; closes cleanly."""

    def __init__(self, root: Path, run_id: str) -> None:
        self.dir = root / run_id
        self.logs_dir = self.dir / "logs"
        self.logs_dir.mkdir(parents=True, exist_ok=True)
        self.output_dir = self.dir / "output"  # what the chief wrote in its output dir (remote/jobs/outputs.py)
        self._logs: dict[str, IO[str]] = {}
        self._metrics = open(self.dir / "metrics.jsonl", "a", encoding="utf-8")

    def log_line(self, worker: str, text: str) -> None:
        handle = self._logs.get(worker)
        if handle is None:
            handle = self._logs[worker] = open(self.logs_dir / f"{worker}.log", "a", encoding="utf-8")
        handle.write(text + "\n")
        handle.flush()

    def metric(self, worker: str, data: dict) -> None:
        self._metrics.write(json.dumps({"worker_label": worker, **data}) + "\n")
        self._metrics.flush()

    def close(self) -> None:
        for handle in [*self._logs.values(), self._metrics]:
            handle.close()


def find_stragglers(rates: dict[str, float], threshold: float = 0.6) -> list[tuple[str, float]]:
    """Workers whose examples/s is below `threshold` × the median of the others.

    Returns (worker, median of the others) pairs. Needs at least two workers with a rate.
    """
    slow = []
    for worker, rate in rates.items():
        others = [other for name, other in rates.items() if name != worker]
        if others:
            median = statistics.median(others)
            if median > 0 and rate < threshold * median:
                slow.append((worker, median))
    return slow


RUN_MANIFEST = "run.json"


def write_run_manifest(run_dir: Path, job_settings: dict, tf_configs: dict[str, str],
                       bandwidth: dict | None = None) -> Path:
    """Write run_dir/run.json: the job's settings, each worker's TF_CONFIG and the bandwidth matrix.

    The report reads it to show how the run was set up. Called at launch.

    Args:
        job_settings: the job's settings as plain JSON values (name, script, epochs, image, ...).
        tf_configs: worker label -> that worker's TF_CONFIG (the JSON text it was given).
        bandwidth: the matrix as bandwidth_store keeps it ({"at": ..., "links": links_json(matrix)}),
            or None when none was measured.
    """
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / RUN_MANIFEST
    manifest = {"run_id": run_dir.name, "job": job_settings, "tf_configs": tf_configs, "bandwidth": bandwidth}
    path.write_text(json.dumps(manifest, indent=2, default=str) + "\n", encoding="utf-8")
    return path

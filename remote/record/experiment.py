"""The run's record on the machine that runs homegpu: its workers' logs and metrics as they arrive, and run.json."""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import IO

from homegpu.remote.events import Metric
from homegpu.remote.record.live_runs import hold_recording
from homegpu.remote.record.run_folder import RunFolder


class ExperimentLog:
    """Appends every worker's log lines and every metric as they arrive; closes cleanly."""

    def __init__(self, root: Path, run_id: str) -> None:
        self.folder = RunFolder.of(root, run_id)
        self.folder.logs.mkdir(parents=True, exist_ok=True)
        self._logs: dict[str, IO[str]] = {}
        self._metrics = open(self.folder.metrics, "a", encoding="utf-8")
        hold_recording(self._metrics)  # `homegpu status` shows the run while it is held (live_runs.py)

    def log_line(self, worker: str, text: str) -> None:
        handle = self._logs.get(worker)
        if handle is None:
            handle = self._logs[worker] = open(self.folder.log(worker), "a", encoding="utf-8")
        handle.write(text + "\n")
        handle.flush()

    def recorded_lines(self, worker: str, generation: int) -> int:
        """How many lines of `worker`'s `generation` this record already holds (from that generation's start
        note on): a controller that attaches to the run again reads the generation from its start, and
        skips these rather than record them twice."""
        try:
            lines = self.folder.log(worker).read_text(encoding="utf-8", errors="replace").splitlines()
        except FileNotFoundError:
            return 0
        start = f"=== homegpu: {worker} generation {generation} starting ==="  # node_side/scripts/worker_process.py
        starts = [index for index, line in enumerate(lines) if line == start]
        return len(lines) - starts[-1] if starts else 0

    def metric(self, worker: str, metric: Metric) -> None:
        self._metrics.write(json.dumps({"worker_label": worker, **metric.fields}) + "\n")
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


def write_run_manifest(run_dir: Path, job_settings: dict, tf_configs: dict[str, str],
                       bandwidth: dict | None = None, tariff: dict | None = None,
                       torchrun: dict[str, str] | None = None, jax: dict[str, str] | None = None,
                       pinned: dict[str, int] | None = None) -> Path:
    """Write run_dir/run.json: the job's settings, each worker's TF_CONFIG (or, for a PyTorch job, each
    node's torchrun; for a JAX job, each process's launch), the bandwidth matrix and the electricity tariff
    that prices the run's energy (Tariff.as_dict).

    The report reads it to show how the run was set up. Called at launch.

    Args:
        job_settings: the job's settings as plain JSON values (name, script, epochs, image, ...).
        tf_configs: worker label -> that worker's TF_CONFIG (the JSON text it was given); empty for PyTorch.
        torchrun: node label -> the torchrun its node ran, as a user would type it (PyTorch jobs).
        jax: process label -> its JAX variables and command, as a user would type them (JAX jobs).
        pinned: node -> the one GPU the run had there, where the queue shared cards by gpu_memory.
        bandwidth: the matrix as bandwidth_store keeps it ({"at": ..., "links": links_json(matrix)}),
            or None when none was measured.
    """
    run_dir.mkdir(parents=True, exist_ok=True)
    path = RunFolder(run_dir).manifest
    manifest = {"run_id": run_dir.name, "job": job_settings, "tf_configs": tf_configs, "bandwidth": bandwidth,
                "tariff": tariff, **({"torchrun": torchrun} if torchrun else {}), **({"jax": jax} if jax else {}),
                **({"pinned": pinned} if pinned else {})}
    path.write_text(json.dumps(manifest, indent=2, default=str) + "\n", encoding="utf-8")
    return path

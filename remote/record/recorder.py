"""A run's record beside its logs: the timeline (every event and sample while it runs), run.json
(how it was set up) and, when it ends, report.html. The recorder is one more subscriber of the
cluster's event hub, so recording changes nothing in how a run is driven.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterable, Mapping

from homegpu.remote.config import JobSpec
from homegpu.remote.net import bandwidth_store
from homegpu.remote.nodes import Cluster
from homegpu.remote.record.experiment import write_run_manifest
from homegpu.remote.record.energy import RunEnergy, energy_of
from homegpu.remote.record.html_report import ReportError, write_report
from homegpu.remote.record.run_folder import RunFolder
from homegpu.remote.record.timeline import TimelineRecorder

LAUNCH_KEYS = {"pytorch": "torchrun", "jax": "jax"}  # where run.json keeps a PyTorch or JAX job's launch lines

class RunRecord:
    """Records one run into `run_dir` from start() until close().

    Args:
        cluster: whose hub to follow.
        run_dir: experiments/RUN-ID (made if missing).
        nodes: the job's nodes (the hub carries every node of the cluster; only these are recorded).
    """

    def __init__(self, cluster: Cluster, run_dir: Path, nodes: Iterable[str], run_id: str, job: str) -> None:
        self.cluster, self.run_dir = cluster, Path(run_dir)
        self.recorder = TimelineRecorder(RunFolder(self.run_dir).timeline, nodes=list(nodes))
        self.recorder.set_meta(run_id=run_id, job=job)
        self.energy: RunEnergy | None = None  # the run's GPU energy, once close() wrote the report

    def start(self) -> "RunRecord":
        """Subscribe now: whatever the run publishes from here on is recorded."""
        self.recorder.follow(self.cluster)
        return self

    def describe_setup(self, job: JobSpec, launches: Mapping[str, str], pinned: Mapping[str, int] | None = None) -> str:
        """run.json: the job's settings, what each worker was given (its TF_CONFIG, or for a PyTorch job
        its node's torchrun line, for a JAX job its process's launch), the latest bandwidth matrix, and for a run
        the queue put on one GPU of each node (`pinned`) which.

        Returns:
            "" or one line naming the saved matrix, damaged and left out (bandwidth_store.read).
        """
        matrix, problem = bandwidth_store.read(self.cluster.spec)
        bandwidth = {"at": matrix.at, "links": bandwidth_store.links_json(matrix)} if matrix else None
        settings = job.settings()
        tf_configs = dict(launches) if job.is_tensorflow else {}
        lines = {} if job.is_tensorflow else {LAUNCH_KEYS[job.framework]: dict(launches)}
        write_run_manifest(self.run_dir, {**settings, "env": dict(job.env)}, tf_configs, bandwidth,
                           self.cluster.spec.tariff.as_dict(), pinned=dict(pinned or {}), **lines)
        return problem

    async def close(self, report: bool = True) -> tuple[Path | None, str]:
        """Stop recording (the events still queued are kept) and, with `report`, write the report.

        Returns:
            (report.html's path, its text summary), or (None, why there is no report).
        """
        await self.recorder.stop()
        if not report:
            return None, "not written: the run goes on"
        self.energy = energy_of(self.run_dir)
        try:
            return write_report(self.run_dir)
        except ReportError as exc:
            return None, str(exc)

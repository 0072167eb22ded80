"""Who this worker is, from TF_CONFIG: a pure parse, so it is table-tested without TensorFlow.

MultiWorkerMirroredStrategy reads the same variable itself; this module only answers the questions
the trainer asks before and around it (rank for metric lines, chief or not, how many workers).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Mapping


class ClusterConfigError(ValueError):
    """TF_CONFIG is present but not something MultiWorkerMirroredStrategy can use."""


@dataclass(frozen=True)
class WorkerRole:
    """This process's place in the job.

    `rank` numbers every task 0..workers-1 with the chief first: a cluster with a "chief" task
    makes it rank 0 and worker i rank i+1; a cluster of "worker" tasks only (what homegpu writes)
    has rank == task index, and worker 0 is the chief.
    """

    task_type: str | None
    task_index: int
    rank: int
    workers: int

    @property
    def is_chief(self) -> bool:
        return self.rank == 0

    @property
    def multi_worker(self) -> bool:
        return self.workers > 1


SINGLE = WorkerRole(task_type=None, task_index=0, rank=0, workers=1)


def worker_role(env: Mapping[str, str]) -> WorkerRole:
    """The role TF_CONFIG in `env` gives this process; no or empty TF_CONFIG means one worker.

    Raises:
        ClusterConfigError: TF_CONFIG is not JSON, or its cluster/task do not fit together.
    """
    text = (env.get("TF_CONFIG") or "").strip()
    if not text:
        return SINGLE
    try:
        config = json.loads(text)
    except ValueError as exc:
        raise ClusterConfigError(f"TF_CONFIG is not valid JSON: {exc}") from None
    if not isinstance(config, dict):
        raise ClusterConfigError("TF_CONFIG must be a JSON object with 'cluster' and 'task'")
    cluster = config.get("cluster") or {}
    task = config.get("task") or {}
    if not isinstance(cluster, dict) or not isinstance(task, dict):
        raise ClusterConfigError("TF_CONFIG 'cluster' and 'task' must be JSON objects")
    chiefs = _addresses(cluster, "chief")
    workers = _addresses(cluster, "worker")
    if len(chiefs) > 1:
        raise ClusterConfigError("TF_CONFIG lists more than one chief")
    if not task and not chiefs and not workers:
        return SINGLE
    task_type = task.get("type")
    task_index = task.get("index", 0)
    if task_type not in ("chief", "worker"):
        raise ClusterConfigError(
            f"TF_CONFIG task type {task_type!r} is not supported; use 'worker' (or 'chief')")
    if not isinstance(task_index, int) or isinstance(task_index, bool):
        raise ClusterConfigError(f"TF_CONFIG task index {task_index!r} is not an integer")
    members = chiefs if task_type == "chief" else workers
    if not 0 <= task_index < len(members):
        raise ClusterConfigError(
            f"TF_CONFIG task {task_type} #{task_index} is not in the cluster "
            f"({len(members)} {task_type} address(es))")
    rank = task_index if task_type == "chief" else task_index + len(chiefs)
    return WorkerRole(task_type=task_type, task_index=task_index, rank=rank,
                      workers=len(chiefs) + len(workers))


def _addresses(cluster: dict, kind: str) -> list[str]:
    value = cluster.get(kind, [])
    if not isinstance(value, list) or not all(isinstance(a, str) and a for a in value):
        raise ClusterConfigError(f"TF_CONFIG cluster.{kind} must be a list of 'host:port' strings")
    return value

"""A run that goes on with fewer machines (issue 37): the job on the nodes left, its batch, and the line that says so.

TensorFlow's MultiWorkerMirroredStrategy is not elastic, so a machine gone for good (past reconnect_timeout, or
refusing homegpu until someone acts) is handled as torchrun's `--nnodes=MIN:MAX` and Ray Train handle one: every
worker left restarts, fewer, from the last finished epoch. Nothing has to be copied for that: every worker of the
built-in trainer keeps the same backup on its own disk (trainer/backup.py), so losing the chief's machine loses no
epoch; the first node left in the job's order becomes the chief. The job's `min_workers` (0: every worker) says
how few may go on; `on_fewer_workers` what happens to the batch. A lost node that is back rejoins the same way
(`rejoin`: at the end of the epoch it came back in, else at the next restart).

Pure: JobRun (run.py) lays the new job out and restarts it.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Sequence

from homegpu.remote.config import KEEP_GLOBAL_BATCH, JobSpec


class FewerWorkersRefused(Exception):
    """The run cannot go on with the workers left; the message says why and what to set."""


def job_without(job: JobSpec, every_node: Sequence[str], lost: Sequence[str]) -> JobSpec:
    """`job` on the nodes of `every_node` (its nodes in TF_CONFIG order) that are not `lost`, in that order."""
    return replace(job, nodes=tuple(name for name in every_node if name not in lost))


def job_with(job: JobSpec, every_node: Sequence[str], back: Sequence[str]) -> JobSpec:
    """`job` with the nodes in `back` again, every node in `every_node`'s order (the chief is the first again)."""
    return replace(job, nodes=tuple(name for name in every_node if name in job.nodes or name in back))


def check_enough(job: JobSpec, workers: int, first_workers: int, gone: str) -> None:
    """Raises FewerWorkersRefused when `workers` is fewer than the job's min_workers (or it has none)."""
    if not job.min_workers:
        raise FewerWorkersRefused(gone)
    if workers < job.min_workers:
        raise FewerWorkersRefused(f"{gone}; {workers} of {first_workers} workers left, fewer than the job's "
                                  f"min_workers = {job.min_workers}")


def batch_for(job: JobSpec, first_batch: int, first_workers: int, workers: int) -> tuple[int, str]:
    """The per-worker batch_size for `workers` workers (fewer than at the start, or as many again), and the words.

    keep-global-batch: the first generation's global batch, each worker's share larger; keep-worker-batch: each
    worker's batch as it was, the global one smaller. A script's batch is its own: unchanged.

    Raises:
        FewerWorkersRefused: the global batch does not split evenly over the workers left.
    """
    if not job.uses_trainer:
        return job.batch_size, "the script's own batch"
    global_batch = first_batch * first_workers
    if workers == first_workers:
        return first_batch, f"global batch {global_batch} as at the start: {first_batch} per worker"
    if job.on_fewer_workers != KEEP_GLOBAL_BATCH:
        return first_batch, (f"global batch {first_batch * workers} of {global_batch}: {first_batch} per worker; "
                             "the learning rate may need to follow")
    if global_batch % workers:
        raise FewerWorkersRefused(f"the global batch {global_batch} does not split evenly over {workers} workers; "
                                  f"set batch_size so that it does, or on_fewer_workers = \"keep-worker-batch\"")
    per_worker = global_batch // workers
    return per_worker, f"global batch {global_batch} kept: {per_worker} per worker"


def going_on_line(lost: Sequence[tuple[str, str]], waited: float, left: Sequence[str], epochs_done: int | None,
                  batch: str) -> str:
    """`node3 lost (offline 300 s): going on with node1, node2 from epoch 4 (global batch 256 kept: 128 per worker)`.

    Args:
        lost: (node, its state) for each node gone.
        waited: how long it was waited for (the job's reconnect_timeout).
        epochs_done: the last epoch the workers left finished (None: a script, which resumes from its own
            checkpoint if it keeps one).
    """
    gone = ", ".join(f"{name} lost ({state} {waited:g} s)" for name, state in lost)
    return f"{gone}: going on with {', '.join(left)} {_resuming(epochs_done)} ({batch})"


def rejoining_line(back: Sequence[str], members: Sequence[str], epochs_done: int | None, batch: str) -> str:
    """`node3 back: rejoining with node1, node2, node3 from epoch 5 (global batch 96 kept: 32 per worker)`."""
    return f"{', '.join(back)} back: rejoining with {', '.join(members)} {_resuming(epochs_done)} ({batch})"


def _resuming(epochs_done: int | None) -> str:
    if epochs_done is None:
        return "from the script's own checkpoint if it keeps one, else from its start"
    return f"from epoch {epochs_done + 1}"

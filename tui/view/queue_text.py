"""The queue in words, for `homegpu queue` and the TUI's queue panel alike: one row per entry, running
first, then waiting in the order they will start, then the latest finished.
"""

from __future__ import annotations

from typing import Sequence

from homegpu.remote.nodes import visible
from homegpu.remote.queue import EntryState, QueueEntry
from homegpu.remote.slurm import SlurmJob, status_words
from homegpu.tui.view.text import table

COLUMNS = ("ID", "JOB", "STATE", "FOR", "RUN", "WHY")
FINISHED_SHOWN = 10  # the latest finished entries shown unless all are asked for
EMPTY = "the queue is empty: `homegpu submit JOB` adds a run of a job of the cluster file"


def ordered(entries: Sequence[QueueEntry], finished_shown: int | None = FINISHED_SHOWN) -> list[QueueEntry]:
    """Active entries, then waiting ones in start order, then finished ones newest first
    (the latest `finished_shown` of them; None: all)."""
    active = sorted((e for e in entries if e.state.active), key=lambda e: e.started or 0.0)
    waiting = sorted((e for e in entries if e.state is EntryState.WAITING), key=lambda e: e.order)
    done = sorted((e for e in entries if e.state.finished), key=lambda e: -(e.ended or e.submitted))
    return active + waiting + (done if finished_shown is None else done[:finished_shown])


def job_words(entry: QueueEntry) -> str:
    """"train epochs=5 batch_size=128": the job and the settings its run was given."""
    return visible(" ".join((entry.job, *entry.overrides)))


def age(seconds: float) -> str:
    seconds = max(0.0, seconds)
    if seconds < 60:
        return f"{seconds:.0f} s"
    if seconds < 3600:
        return f"{seconds / 60:.0f} min"
    if seconds < 86400:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} d"


def how_long(entry: QueueEntry, now: float) -> str:
    """How long it has waited or run, or how long it ran."""
    if entry.state is EntryState.WAITING:
        return age(now - entry.submitted)
    if entry.state.active:
        return age(now - (entry.started or entry.submitted))
    if entry.started is not None and entry.ended is not None:
        return age(entry.ended - entry.started)
    return "-"


def why(entry: QueueEntry) -> str:
    if entry.reason:
        return visible(entry.reason)
    if entry.state is EntryState.WAITING:
        return "its turn comes next" if not entry.after else "after " + ", ".join(entry.after)
    return ""


def queue_row(entry: QueueEntry, now: float) -> tuple[str, ...]:
    priority = f" (priority {entry.priority})" if entry.priority else ""
    return (entry.id, job_words(entry), entry.state.value + priority, how_long(entry, now), entry.run_id or "-",
            why(entry))


def format_queue(entries: Sequence[QueueEntry], now: float, finished_shown: int | None = FINISHED_SHOWN) -> str:
    """What `homegpu queue` prints."""
    shown = ordered(entries, finished_shown)
    if not shown:
        return EMPTY
    text = table(COLUMNS, [queue_row(entry, now) for entry in shown])
    hidden = sum(1 for e in entries if e.state.finished) - sum(1 for e in shown if e.state.finished)
    if hidden > 0:
        text += f"\n  … and {hidden} older finished (homegpu queue --all lists every one)"
    return text


SLURM_COLUMNS = ("SLURM ID", "JOB", "STATE", "RUN", "WHY")
SLURM_EMPTY = "Slurm lists no job of homegpu's: `homegpu run JOB` submits one"


def format_slurm_queue(jobs: Sequence[SlurmJob]) -> str:
    """`homegpu queue` on a Slurm cluster: homegpu's Slurm jobs as squeue lists them, why each waits in homegpu's
    words, where each runs, how each ended."""
    if not jobs:
        return SLURM_EMPTY
    rows = [(job.job_id, visible(job.job or "?"), job.homegpu_state, visible(job.run_id), visible(status_words(job)))
            for job in jobs]
    return table(SLURM_COLUMNS, rows)


def slurm_job_fields(job: SlurmJob) -> dict:
    """One Slurm job for `homegpu queue --json`."""
    return {"slurm_id": job.job_id, "job": job.job, "run_id": job.run_id, "state": job.homegpu_state,
            "slurm_state": job.state, "why": status_words(job), "nodes": job.nodes(), "partition": job.partition,
            "elapsed": job.elapsed, "time_limit": job.time_limit}

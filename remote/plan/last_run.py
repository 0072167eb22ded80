"""What a job's last run says about each worker's own speed, for the pace advice (and, for gpu_memory = "auto",
how much GPU memory it held).

Under MultiWorkerMirroredStrategy every worker steps together, so the examples/s each worker
reports is the job's pace, not its own: a GPU worker beside a slow CPU worker reports the CPU's
rate. What tells them apart is how busy each one's device was meanwhile: a GPU busy 7% of the time
could have gone about 14× faster alone. So a worker's own speed is estimated as its examples/s
divided by its GPUs' mean utilisation while it trained; a CPU worker counts as always busy (it is
what the others wait for). A worker whose GPUs left no utilisation in the timeline gets no
estimate, and then the GPU table decides for the whole job (pace.advise_pace). A balanced run
(trainer/shares.py) measured each replica's own compute as it trained (`compute_examples_per_sec`
on its worker's epoch lines): that, times the worker's replicas, is its speed whatever its device,
and it comes first.
"""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path
from typing import Sequence

from homegpu.remote.events import Metric
from homegpu.remote.nodes import MIB
from homegpu.remote.plan.worker_devices import WorkerDevices
from homegpu.remote.record import (
    NodeTimeline, RunFolder, Timeline, TimelineDamaged, WorkerTimeline, load_timeline, read_meta, timelines,
)
from homegpu.trainer.gpu_budget import budget_text

AUTO_HEADROOM = 1.1  # gpu_memory = "auto": the last run's peak and a tenth more, for a batch that varies
MIN_BUSY = 0.02  # below this a GPU's utilisation says "idle", not "50× faster": no estimate


def last_timeline(experiments: Path, job: str) -> Timeline | None:
    """The timeline of `job`'s most recent run under `experiments` that trained; None without one.

    A damaged timeline is passed over without a word: whose run it was cannot be read from it, so
    naming it here would name other jobs' files too; `homegpu report` names it for its run.
    """
    runs = sorted(timelines(experiments), key=_mtime, reverse=True)
    for path in runs:
        try:  # the meta table first: other jobs' runs are never read whole
            timeline = load_timeline(path) if read_meta(path).get("job") == job else None
        except (TimelineDamaged, OSError):  # OSError: gone, or unreadable, since it was listed
            continue
        if timeline and any(w.examples_per_sec.measured for w in timeline.workers):
            return timeline
    return None


def last_shares(experiments: Path, job: str, workers: Sequence[str]) -> tuple[int, ...] | None:
    """The shares of a step `job`'s most recent run ended with (its chief's last line that told them), where that
    run had the same workers, in the same order; None otherwise (a new machine, or one gone, starts even)."""
    for path in sorted(timelines(experiments), key=_mtime, reverse=True):
        try:
            if read_meta(path).get("job") != job:
                continue
            lines = [json.loads(line) for line in RunFolder(path.parent).metrics.read_text().splitlines()]
        except (TimelineDamaged, OSError, ValueError):
            continue
        ranks = {line.get("worker_label"): line.get("worker") for line in lines if isinstance(line, dict)}
        if ranks != {label: rank for rank, label in enumerate(workers)}:
            return None
        told = [Metric(line).shares for line in lines if line.get("worker_label") == workers[0]]
        return next((shares for shares in reversed(told) if shares), None)
    return None


def own_speeds(timeline: Timeline, workers: Sequence[WorkerDevices]) -> dict[str, float]:
    """Worker label -> estimated examples/s of its own, for the workers the timeline can speak for."""
    nodes = {node.name: node for node in timeline.nodes}
    ran = {worker.name: worker for worker in timeline.workers}
    speeds = {}
    for worker in workers:
        record = ran.get(worker.label)
        if record and record.compute_examples_per_sec.measured:  # a replica's (a process's): each of its GPUs
            speeds[worker.label] = statistics.median(record.compute_examples_per_sec.measured) * worker.replicas
            continue
        rates = record.examples_per_sec.measured if record else ()
        if not rates:
            continue
        busy = 1.0 if worker.on_cpu else _gpu_busy(nodes.get(worker.node), worker.gpus, record)
        if busy is not None:
            speeds[worker.label] = statistics.median(rates) / busy
    return speeds


def _gpu_busy(node: NodeTimeline | None, gpus: Sequence[int], record: WorkerTimeline) -> float | None:
    """The worker's GPUs' mean utilisation (0..1) while it reported throughput; None when unknown."""
    if node is None:
        return None
    start, end = min(record.examples_per_sec.times), max(record.examples_per_sec.times)
    utils = [value for gpu in node.gpus if gpu.index in gpus
             for t, value in zip(gpu.util.times, gpu.util.values) if value is not None and start <= t <= end]
    if not utils:
        return None
    busy = statistics.fmean(utils) / 100
    return busy if busy >= MIN_BUSY else None


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


def auto_gpu_memory(timeline: Timeline | None) -> tuple[int, str]:
    """gpu_memory = "auto": bytes each process may hold (the most any GPU held during the job's last run, plus a
    tenth) and how the plan says where that came from; (0, why) without a run that sampled a GPU's memory."""
    peaks = [max(gpu.mem_used.measured) for node in (timeline.nodes if timeline else ()) for gpu in node.gpus
             if gpu.mem_used.measured]
    if not peaks:
        return 0, "no earlier run of the job sampled a GPU's memory"
    peak = max(peaks) * MIB
    return math.ceil(peak * AUTO_HEADROOM / MIB) * MIB, f"auto: its last run's peak {budget_text(int(peak))}, plus a tenth"

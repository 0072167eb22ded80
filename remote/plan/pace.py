"""Who sets the pace of a synchronous job, and whether its slow workers are worth having.

MultiWorkerMirroredStrategy takes a step only when every worker has finished its part, so a job
moves at its slowest worker's pace times the number of workers. A CPU worker beside GPU workers
therefore makes the job faster only when it runs at more than (GPU workers)/(all workers) of the
GPU workers' pace; usually it runs at a few percent of it and slows the whole job down. PyTorch's
DDP is paced the same way, by its processes (each a GPU, or a CPU), since DistributedSampler gives
each the same share.

Each worker's speed comes from its last run (examples/s per worker, where the caller has a timeline)
or else from its devices (``gpu_speed``: the GPU model's relative speed times its GPUs, or a CPU).

A balanced job (its shares of a step follow speed: trainer/shares.py) is paced otherwise: every worker finishes
its share at once, so the workers add up, less what a slow worker's smallest share costs.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Mapping, Sequence

from homegpu.remote.plan.gpu_speed import CPU_SPEED, gpu_speed
from homegpu.remote.plan.worker_devices import WorkerDevices
from homegpu.trainer import shares

HOLD_BACK = 0.8  # a kept worker under this fraction of the fastest's pace is pointed out
WORKER, PROCESS = "worker", "process"  # what the advice calls each paced unit (TensorFlow, PyTorch)
NOMINAL_SHARE = 256  # a worker's even share of a step, for the balanced pace (the floor is a part of it)


@dataclass(frozen=True)
class PaceAdvice:
    """Each worker's estimated speed and what follows from it.

    Attributes:
        speeds: per worker, in plan order: examples/s when ``measured``, else relative (RTX 3090 = 1).
        measured: the speeds come from the last run, not from the GPU table.
        leave_out: nodes the job is faster without (empty when every node helps).
        gain: the job's pace without ``leave_out`` divided by its pace with every node (1.0 when
            ``leave_out`` is empty).
        sentences: plain advice for the user, empty when the workers are evenly matched.
    """

    speeds: tuple[float, ...]
    measured: bool
    leave_out: tuple[str, ...]
    gain: float
    sentences: tuple[str, ...]
    balanced: bool = False


def worker_speed(worker: WorkerDevices) -> float:
    """A worker's relative speed from its devices: the sum of its GPUs' speeds, or a CPU's."""
    if worker.on_cpu:
        return CPU_SPEED
    return sum(gpu_speed(name) for name in worker.gpu_names)


def job_pace(speeds: Sequence[float], balanced: bool = False) -> float:
    """Synchronous data parallel: every step waits for the slowest, so pace = min × workers; balanced, each
    worker's share follows its speed and the pace is the global batch over its slowest share's time."""
    if not speeds:
        return 0.0
    if not balanced:
        return min(speeds) * len(speeds)
    global_batch = NOMINAL_SHARE * len(speeds)
    return global_batch / shares.step_seconds(shares.split(global_batch, speeds), speeds)


def advise_pace(workers: Sequence[WorkerDevices], measured: Mapping[str, float] | None = None,
                unit: str = WORKER, balanced: bool = False) -> PaceAdvice:
    """Estimate every worker's speed, find the nodes the job is faster without, and say so.

    Args:
        workers: the plan's workers, in order.
        measured: examples/s per worker label from the job's last run; used only when it covers
            every worker (a partial timeline would compare unlike units).
        unit: what the sentences call each of ``workers``: a TensorFlow worker, or for a PyTorch
            job a process (each of a node's GPUs, or its CPU), which DDP paces alike.
        balanced: the job's shares of a step follow speed (the built-in trainers, balance = "speed").
    """
    use_measured = bool(measured) and all(measured.get(w.label, 0) > 0 for w in workers)
    speeds = tuple(measured[w.label] if use_measured else worker_speed(w) for w in workers)
    pairs = list(zip(workers, speeds))
    keep = _best_nodes(pairs, balanced)
    kept = [(w, s) for w, s in pairs if w.node in keep]
    leave_out = tuple(dict.fromkeys(w.node for w, _ in pairs if w.node not in keep))
    gain = job_pace([s for _, s in kept], balanced) / job_pace(speeds, balanced)
    sentences = []
    if leave_out:
        held = "; ".join(_share(node, pairs, kept, unit) for node in leave_out)
        sentences.append(f"{held}: leave {'it' if len(leave_out) == 1 else 'them'} out with "
                         f"nodes = {json.dumps(list(keep))} (the job would train {gain:.1f}× as fast "
                         f"on {_count(len(kept), unit)})")
    fastest = max(s for _, s in kept)
    slow = list(dict.fromkeys(w.node for w, s in kept if s < HOLD_BACK * fastest))
    others = [(w, s) for w, s in kept if w.node not in slow]
    if slow and not others:  # one node, unlike GPUs: nothing to leave out, but say who is slow
        worker, pace = min(kept, key=lambda pair: pair[1])
        who = worker.node if unit == PROCESS else worker.label
        sentences.append(f"{who} ({worker.device_text}) sets the pace, at about "
                         f"{100 * pace / fastest:.0f}% of the fastest {unit}'s")
    elif slow:
        with_them = job_pace([s for _, s in kept], balanced) / job_pace([s for _, s in others], balanced)
        held = "; ".join(_share(node, pairs, others, unit) for node in slow)
        but = "; balanced by speed, " if balanced else ", but "
        sentences.append(f"{held}{but}with {'it' if len(slow) == 1 else 'them'} the job "
                         f"{'' if balanced else 'still '}trains {with_them:.2f}× as fast as the other "
                         f"{_count(len(others), unit)} alone")
    return PaceAdvice(speeds, use_measured, leave_out, gain, tuple(sentences), balanced)


def _best_nodes(pairs: Sequence[tuple[WorkerDevices, float]], balanced: bool = False) -> list[str]:
    """The nodes whose workers together train fastest: drop the slowest nodes while that helps.

    A node's pace is its slowest worker's; keeping the nodes at or above some pace is the only
    kind of subset worth trying, since adding a faster node never lowers the minimum.
    """
    nodes = list(dict.fromkeys(w.node for w, _ in pairs))
    node_pace = {n: min(s for w, s in pairs if w.node == n) for n in nodes}
    best, best_pace = nodes, job_pace([s for _, s in pairs], balanced)
    for floor in sorted(set(node_pace.values())):
        chosen = [n for n in nodes if node_pace[n] >= floor]
        pace = job_pace([s for w, s in pairs if w.node in chosen], balanced)
        if pace > best_pace * 1.0001:  # a strict gain: on a tie, keep more nodes
            best, best_pace = chosen, pace
    return best


def _share(node: str, pairs: Sequence[tuple[WorkerDevices, float]],
           others: Sequence[tuple[WorkerDevices, float]], unit: str) -> str:
    """"laptop (CPU) would run at about 5% of the GPU workers' pace"."""
    mine = [(w, s) for w, s in pairs if w.node == node]
    worker, pace = min(mine, key=lambda pair: pair[1])
    gpus_only = all(not w.on_cpu for w, _ in others) and worker.on_cpu
    share = 100 * pace / min(s for _, s in others)
    figure = f"{share:.0f}%" if share >= 1 else "under 1%"
    return (f"{node} ({worker.device_text}) would run at about {figure} of "
            f"the {'GPU' if gpus_only else 'other'} {_plural(unit)}' pace")


def _plural(unit: str) -> str:
    return unit + ("es" if unit.endswith("s") else "s")


def _count(count: int, unit: str) -> str:
    return f"{count} {unit if count == 1 else _plural(unit)}"

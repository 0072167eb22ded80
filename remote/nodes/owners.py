"""Who owns each GPU process, in words, and the preflight warning about GPU memory others hold.

The node's agent finds the owners (remote/node_side/agent/process_owners.py); this turns them into what `status`,
the TUI and a run's preflight say. Pure: no I/O.
"""

from __future__ import annotations

from typing import Iterable

from homegpu.remote.config import size_text
from homegpu.remote.events import NA, GpuProcess, GpuStats, NodeStats, ProcessOwner
from homegpu.remote.nodes.units import gib, is_number

FOREIGN_SHARE = 0.10  # another process holding more than this share of a job's GPU is worth a warning


def owner_text(owner: ProcessOwner | None, run_id: str = "") -> str:
    """"this job's worker 0", "homegpu worker 1 of run R", "container NAME (user U)", "user nobody".

    Args:
        run_id: the run on screen, if any: its workers read as "this job's".
    """
    if owner is None or owner.kind == "unknown":
        return "owner unknown"
    if owner.kind == "worker":
        index = f" {owner.index}" if owner.index is not NA else ""
        if run_id and owner.run_id == run_id:
            return f"this job's worker{index}"
        job = f" of job {owner.job}" if owner.job else ""
        return f"homegpu worker{index}{job} run {owner.run_id}"
    user = f"user {owner.user}" if owner.user is not NA else ""
    if owner.kind == "container":
        name = owner.container_name or owner.container
        return f"container {name}" + (f" ({user})" if user else "")
    return user or "owner unknown"


def worker_budget(owner: ProcessOwner | None) -> int:
    """The bytes of GPU memory a worker's job holds it to (its gpu_memory); 0 for any other process."""
    if owner is None or owner.kind != "worker" or not is_number(owner.gpu_memory) or owner.gpu_memory <= 0:
        return 0
    return int(owner.gpu_memory)


def budget_text(owner: ProcessOwner | None) -> str:
    """"gpu_memory 5.0 GiB" for a worker whose job holds it to a budget; "" for any other process."""
    budget = worker_budget(owner)
    return f"gpu_memory {size_text(budget)}" if budget else ""


def budgeted_workers(processes: Iterable[GpuProcess]) -> dict[tuple[object, object], list[GpuProcess]]:
    """(run id, worker index) -> the processes of each worker held to a gpu_memory: a worker's children inherit its
    markers, and its budget with them, so its budget counts once for them all."""
    workers: dict[tuple[object, object], list[GpuProcess]] = {}
    for process in processes:
        if worker_budget(process.owner):
            workers.setdefault((process.owner.run_id, process.owner.index), []).append(process)
    return workers


def card_budgets(gpu: GpuStats) -> str:
    """"budgets 15.0 GiB of 80.0 GiB, for 3 runs" for a card held by workers of runs with a gpu_memory; "" where
    none is."""
    workers = budgeted_workers(gpu.processes)
    if not workers:
        return ""
    runs = len({run for run, _ in workers})
    budgets = sum(worker_budget(found[0].owner) for found in workers.values())
    total = f" of {gib(gpu.mem_total)} GiB" if is_number(gpu.mem_total) else ""
    return f"budgets {size_text(budgets)}{total}, for {runs} run{'s' * (runs != 1)}"


def is_run_worker(process: GpuProcess, run_id: str) -> bool:
    """The process is one of run `run_id`'s workers (or their children)."""
    owner = process.owner
    return owner is not None and owner.kind == "worker" and bool(run_id) and owner.run_id == run_id


def foreign_memory_warnings(node: str, stats: NodeStats | None, gpus: Iterable[int] | None, run_id: str,
                            share: float = FOREIGN_SHARE) -> list[str]:
    """One line per process outside run `run_id` holding more than `share` of a GPU the job uses.

    Args:
        node: the node's name, which each line starts with.
        stats: the node's latest stats (None: nothing known, nothing said).
        gpus: the GPU indices the job's workers use there; None for all of the node's GPUs.
        run_id: the run being launched; its own workers (a reattached run's) are not warned about.
    """
    if stats is None:
        return []
    wanted = None if gpus is None else set(gpus)
    lines = []
    for gpu in stats.gpus:
        total = gpu.mem_total
        if (wanted is not None and gpu.index not in wanted) or not isinstance(total, (int, float)) or total <= 0:
            continue
        for process in gpu.processes:
            mem = process.mem
            if is_run_worker(process, run_id) or not isinstance(mem, (int, float)) or mem <= share * total:
                continue
            lines.append(f"{node}: GPU {gpu.index} already holds {gib(mem)} GiB ({100 * mem / total:.0f}%) for "
                         f"pid {process.pid} {process.name} ({owner_text(process.owner, run_id)}); the job's "
                         "workers there get that much less memory")
    return lines

"""Which devices every worker of a job gets: a pure function of the nodes' GPUs and the job's layout.

MultiWorkerMirroredStrategy puts one replica on each GPU a worker sees (one on the CPU when it sees
none) and needs the same number of replicas on every worker; NCCL moves tensors between GPUs only,
so one CPU worker makes RING the only collective that works. This module decides all of that before
anything starts, and refuses a layout TensorFlow would fail on with one line saying what to set.

Layouts (``workers_per_node``):
- ``"per-gpu"``: one worker per GPU, each seeing exactly its GPU; one CPU worker on a node without
  GPUs.
- an integer N: N workers per node. On a GPU node its GPUs are split evenly between them; they never
  share a GPU unless ``share_gpus`` is set (then worker i gets GPU i mod the GPU count).

Workers are numbered in the job's node order (``tfconfig.job_node_specs``), then slot order within a
node, as TF_CONFIG lists them. The pace advice is in ``pace.py``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from homegpu.remote.config import PER_GPU
from homegpu.remote.nodes import MIB
from homegpu.remote.plan.pace import PROCESS, PaceAdvice, advise_pace
from homegpu.remote.plan.worker_devices import WorkerDevices
from homegpu.trainer import shares
from homegpu.trainer.cli import COLLECTIVE_ENV
from homegpu.trainer.gpu_budget import BUDGET_ENV, budget_text

NCCL, RING = "NCCL", "RING"
# A PyTorch job's backend: NCCL moves tensors between GPUs only, so one process on a CPU needs gloo.
TORCH_NCCL, TORCH_GLOO = "nccl", "gloo"
# JAX's collectives between processes: NCCL on GPUs, gloo on CPUs; one computation cannot mix the two.
JAX_NCCL, JAX_GLOO = "NCCL", "gloo"
HIDE_ALL_GPUS = "-1"  # CUDA_VISIBLE_DEVICES value that leaves a process no GPU at all


class DevicePlanError(ValueError):
    """The job's layout cannot run on these nodes; the message is one line naming node and fix."""


@dataclass(frozen=True)
class Gpu:
    """One GPU of a node as the stats agent reports it: its index on the node, its name and its memory (MiB,
    None where the agent could not read it)."""

    index: int
    name: str
    memory: float | None = None


@dataclass(frozen=True)
class BatchPlan:
    """The global batch: ``per_worker`` (the job's batch_size) × workers, split over the replicas."""

    per_worker: int
    workers: int
    replicas_per_worker: int

    @property
    def global_batch(self) -> int:
        return self.per_worker * self.workers

    @property
    def replicas(self) -> int:
        return self.replicas_per_worker * self.workers

    @property
    def per_replica(self) -> int:
        return self.global_batch // self.replicas

    @property
    def text(self) -> str:
        """"batch 64 per worker × 3 workers = 192 global, 64 per replica on 3 replicas"."""
        return (f"batch {self.per_worker} per worker × {self.workers} worker"
                f"{'s' if self.workers != 1 else ''} = {self.global_batch} global, "
                f"{self.per_replica} per replica on {self.replicas} replica{'s' if self.replicas != 1 else ''}")


@dataclass(frozen=True)
class DevicePlan:
    """Every worker's devices, the collective they all use, the batch arithmetic and who sets the pace."""

    workers: tuple[WorkerDevices, ...]
    collective: str  # TensorFlow's (NCCL, RING), PyTorch's backend (nccl, gloo) or JAX's (NCCL, gloo)
    batch: BatchPlan | None  # None for a user's script: its batch is its own
    pace: PaceAdvice
    framework: str = "tensorflow"  # pytorch: each worker is a torchrun on its node, a process per GPU (`replicas`)
    gpu_memory: int = 0  # bytes each process may hold on its GPU (the job's gpu_memory); 0: the whole card
    gpu_memory_source: str = ""  # where an "auto" budget came from, as the plan says it

    @property
    def pytorch(self) -> bool:
        return self.framework == "pytorch"

    @property
    def processes(self) -> int:
        """PyTorch's WORLD_SIZE: every node's processes."""
        return sum(w.replicas for w in self.workers)

    def workers_on(self, node: str) -> tuple[WorkerDevices, ...]:
        return tuple(w for w in self.workers if w.node == node)

    def lines(self, endpoints: Sequence[str] = ()) -> list[str]:
        """The plan as `homegpu tfconfig` and the launch dialog show it.

        Args:
            endpoints: each worker's TF_CONFIG address (host:port), in worker order, when known.
        """
        width = max(len(w.label) for w in self.workers)
        at = [f"{e}  " for e in endpoints] + [""] * (len(self.workers) - len(endpoints))
        wide = max(map(len, at))
        if self.pytorch:
            return self._torch_lines(width, at, wide)
        if self.framework == "jax":
            return self._jax_lines(width, at, wide)
        rows = [f"worker {w.index}  {w.label:<{width}}  {a:<{wide}}{w.device_text}"
                for w, a in zip(self.workers, at)]
        why = "every worker has a GPU" if self.collective == NCCL else "a worker runs on CPU"
        source = ["speeds from the job's last run (its examples/s and how busy each worker's GPUs were)"
                  ] if self.pace.measured and self.pace.sentences else []
        batch = [self.batch.text] if self.batch else []
        return rows + [f"collective {self.collective} ({why})", *batch, *self._shares_line(), *source,
                       *self.pace.sentences, *self._budget_line("worker")]

    def _budget_line(self, holder: str) -> list[str]:
        source = f" ({self.gpu_memory_source})" if self.gpu_memory_source else ""
        if not self.gpu_memory:
            return [f"gpu_memory auto{source}: each {holder} has its whole GPU"] if source else []
        held = f"each {holder} held to it on its GPU" if any(not w.on_cpu for w in self.workers) else \
            f"no {holder} has a GPU, so nothing is held"
        return [f"gpu_memory {budget_text(self.gpu_memory)}{source}: {held}"]

    def _shares_line(self) -> list[str]:
        """Each worker's share of a step in a balanced job, where its speeds split it unevenly."""
        if not (self.pace.balanced and self.batch):
            return []
        split = shares.split(self.batch.global_batch, self.pace.speeds)
        if split == shares.even(self.batch.global_batch, len(split)):
            return []
        given = ", ".join(f"{w.label} {n}" for w, n in zip(self.workers, split))
        return [f"each step's {self.batch.global_batch} examples split by speed (balance = \"speed\"): {given}"]


    def _torch_lines(self, width: int, at: Sequence[str], wide: int) -> list[str]:
        rows = [f"node {w.index}  {w.label:<{width}}  {a:<{wide}}{w.device_text}: "
                f"{w.replicas} process{'es' if w.replicas != 1 else ''}" for w, a in zip(self.workers, at)]
        why = "every process has a GPU" if self.collective == TORCH_NCCL else "a process runs on CPU"
        return rows + [f"torchrun on each node; WORLD_SIZE {self.processes}, backend {self.collective} ({why})",
                       *self.pace.sentences, *self._budget_line("process")]

    def _jax_lines(self, width: int, at: Sequence[str], wide: int) -> list[str]:
        rows = [f"process {w.index}  {w.label:<{width}}  {a:<{wide}}{w.device_text}"
                for w, a in zip(self.workers, at)]
        why = "every process has a GPU" if self.collective == JAX_NCCL else "every process runs on CPU"
        count = len(self.workers)
        return rows + [f"jax.distributed: {count} process{'es' if count != 1 else ''}, the coordinator on process 0; "
                       f"collectives {self.collective} ({why})", *self.pace.sentences, *self._budget_line("process")]


def gpu_inventory(source: Any) -> tuple[Gpu, ...]:
    """A node's GPUs from NodeStats (its ``gpus``), GpuStats-like objects or (index, name) pairs.

    A GPU the agent could not name or number (NA) keeps its position: its index is its place in the
    list and its name is "GPU".
    """
    items = getattr(source, "gpus", source) or ()
    gpus = []
    for position, item in enumerate(items):
        index, name = item if isinstance(item, tuple) else (getattr(item, "index"), getattr(item, "name"))
        index = index if isinstance(index, int) and not isinstance(index, bool) else position
        memory = getattr(item, "mem_total", None)
        memory = memory if isinstance(memory, (int, float)) and not isinstance(memory, bool) and memory > 0 else None
        gpus.append(Gpu(index, str(name) if name else "GPU", memory))
    return tuple(gpus)


def plan_devices(nodes: Mapping[str, Any], workers_per_node: int | str, batch_size: int | None,
                 share_gpus: bool = False, measured: Mapping[str, float] | None = None,
                 framework: str = "tensorflow", balanced: bool = False, gpu_memory: int = 0) -> DevicePlan:
    """Lay the job's workers out on its nodes.

    Args:
        nodes: the job's nodes in TF_CONFIG order, each mapped to its GPUs (see :func:`gpu_inventory`;
            an empty list for a CPU-only node, None while its GPUs are not known).
        workers_per_node: ``"per-gpu"`` or a positive integer (the job's ``workers_per_node``).
        batch_size: the job's per-worker batch size (the built-in trainer's); None for a user's script.
        share_gpus: let several workers of a node use one GPU when it has fewer GPUs than workers.
        measured: examples/s per worker label from the job's last run, for the pace advice
            (see ``pace.advise_pace``); without it the GPU models decide.
        framework: the job's. "pytorch": one worker (a torchrun) per node with all its GPUs, each node with as
            many processes as it has GPUs (nodes may differ), and the backend for the collective. "jax": a
            process per worker, every one on GPUs or every one on CPU (JAX cannot mix them), any device count.
        balanced: each worker's share of a step follows its speed (trainer/shares.py), for the pace advice.
        gpu_memory: the bytes each process may hold on its GPU (the job's gpu_memory); 0: the whole card.

    Raises:
        DevicePlanError: a node's GPUs are unknown, its GPUs do not split between its workers, the
            workers would have different replica counts, the batch does not split over replicas, or the
            processes on a GPU would need more than its memory.
    """
    if not nodes:
        raise DevicePlanError("the job has no nodes to run on")
    workers: list[WorkerDevices] = []
    for node, source in nodes.items():
        if source is None:
            raise DevicePlanError(f"node {node}: its GPUs are not known (is it online?); "
                                  "wait for its stats or leave it out with nodes = [...]")
        inventory = gpu_inventory(source)
        split = _split(node, inventory, workers_per_node, share_gpus)
        _check_budget_fits(node, inventory, split, gpu_memory)
        for slot, gpus in enumerate(split):
            workers.append(WorkerDevices(node, len(workers), slot, tuple(g.index for g in gpus),
                                         tuple(g.name for g in gpus), max(1, len(gpus))))
    every_gpu = all(not w.on_cpu for w in workers)
    if framework == "pytorch":
        return DevicePlan(tuple(workers), TORCH_NCCL if every_gpu else TORCH_GLOO, None,
                          advise_pace(_torch_processes(workers), unit=PROCESS, balanced=balanced), framework=framework,
                          gpu_memory=gpu_memory)
    if framework == "jax":
        return DevicePlan(tuple(workers), _jax_collective(workers), None,
                          advise_pace(workers, measured, unit=PROCESS, balanced=balanced), framework=framework,
                          gpu_memory=gpu_memory)
    replicas = _equal_replicas(workers)
    return DevicePlan(tuple(workers), NCCL if every_gpu else RING, _batch(batch_size, len(workers), replicas),
                      advise_pace(workers, measured, balanced=balanced), gpu_memory=gpu_memory)


def _check_budget_fits(node: str, inventory: tuple[Gpu, ...], split: list[tuple[Gpu, ...]], budget: int) -> None:
    """Every GPU of the node can hold its processes' budgets: one per worker that uses it (share_gpus puts
    several on one), each held to `budget` bytes. A GPU whose memory is not known is not refused."""
    if not budget:
        return
    for gpu in inventory:
        processes = sum(gpu in gpus for gpus in split)
        if gpu.memory is None or processes * budget <= gpu.memory * MIB:
            continue
        held = f"{processes} processes × {budget_text(budget)}" if processes > 1 else budget_text(budget)
        raise DevicePlanError(f"node {node}: GPU {gpu.index} ({gpu.name}, {budget_text(int(gpu.memory * MIB))}) "
                              f"cannot hold gpu_memory {held}: lower gpu_memory in the job"
                              + (", or workers_per_node" if processes > 1 else ", or leave the node out with nodes = [...]"))


def _jax_collective(workers: Sequence[WorkerDevices]) -> str:
    """NCCL when every process has a GPU, gloo when none has; a plan mixing them is refused, naming a CPU node."""
    on_cpu = [w for w in workers if w.on_cpu]
    if not on_cpu:
        return JAX_NCCL
    if len(on_cpu) == len(workers):
        return JAX_GLOO
    raise DevicePlanError(f"node {on_cpu[0].node}: it has no GPU and the others do, and a JAX computation runs on "
                          "one kind of device: leave it out with nodes = [...] in the job")


def _torch_processes(workers: Sequence[WorkerDevices]) -> list[WorkerDevices]:
    """A PyTorch job's processes as the pace advice weighs them: one per GPU of each node's torchrun,
    or one on a CPU-only node."""
    processes = []
    for w in workers:
        devices = [((gpu,), (name,)) for gpu, name in zip(w.gpus, w.gpu_names)] or [((), ())]
        processes += [WorkerDevices(w.node, w.index, slot, gpus, names, 1)
                      for slot, (gpus, names) in enumerate(devices)]
    return processes


def _split(node: str, gpus: tuple[Gpu, ...], layout: int | str, share: bool) -> list[tuple[Gpu, ...]]:
    """Each of the node's workers' GPUs (an empty tuple: a CPU worker)."""
    if layout == PER_GPU:
        return [(gpu,) for gpu in gpus] or [()]
    if isinstance(layout, bool) or not isinstance(layout, int) or layout < 1:
        raise DevicePlanError(f'workers_per_node = {layout!r}: use "per-gpu" or a positive integer')
    if not gpus:
        return [()] * layout
    count = len(gpus)
    if layout > count:
        if share:
            return [(gpus[slot % count],) for slot in range(layout)]
        raise DevicePlanError(
            f"node {node}: {layout} workers for {count} GPU{'s' if count != 1 else ''} would share a GPU: "
            f'set workers_per_node = "per-gpu" (or {count}), or share_gpus = true')
    if count % layout:
        raise DevicePlanError(
            f"node {node}: {count} GPUs do not split evenly between {layout} workers: "
            f'set workers_per_node = "per-gpu" (or a divisor of {count})')
    each = count // layout
    return [gpus[slot * each:(slot + 1) * each] for slot in range(layout)]


def _equal_replicas(workers: Sequence[WorkerDevices]) -> int:
    """The replica count every worker has; refuses, naming the odd node, when they differ."""
    counts = [w.replicas for w in workers]
    common = max(set(counts), key=lambda c: (counts.count(c), -c))  # most workers; fewer replicas on a tie
    odd = next((w for w in workers if w.replicas != common), None)
    if odd is None:
        return common
    raise DevicePlanError(
        f"node {odd.node}: its workers would have {odd.replicas} replica{'s' if odd.replicas != 1 else ''} "
        f"({odd.device_text}) and the others {common}; MultiWorkerMirroredStrategy needs the same "
        f'number on every worker: set workers_per_node = "per-gpu" (one GPU per worker)')


def _batch(batch_size: int | None, workers: int, replicas: int) -> BatchPlan | None:
    if batch_size is None:
        return None
    if batch_size < 1:
        raise DevicePlanError(f"batch_size = {batch_size}: use a positive integer")
    if batch_size % replicas:
        suggestion = (batch_size // replicas + 1) * replicas
        raise DevicePlanError(
            f"batch_size = {batch_size} per worker does not split over its {replicas} replicas: "
            f"set batch_size to a multiple of {replicas} (e.g. {suggestion})")
    return BatchPlan(batch_size, workers, replicas)


def process_env(plan: DevicePlan, worker: WorkerDevices) -> dict[str, str]:
    """The environment a process worker needs: exactly its GPUs visible, the collective, and its GPU budget."""
    visible = ",".join(map(str, worker.gpus)) if worker.gpus else HIDE_ALL_GPUS
    return {"CUDA_VISIBLE_DEVICES": visible, COLLECTIVE_ENV: plan.collective, **_budget_env(plan)}


def container_env(plan: DevicePlan, worker: WorkerDevices) -> dict[str, str]:
    """The environment of a container worker. Its device request already limits it to its GPUs,
    renumbered from 0 inside, so CUDA_VISIBLE_DEVICES is set only to hide GPUs from a CPU worker."""
    env = {COLLECTIVE_ENV: plan.collective, **_budget_env(plan)}
    if worker.on_cpu:
        env["CUDA_VISIBLE_DEVICES"] = HIDE_ALL_GPUS
    return env


def _budget_env(plan: DevicePlan) -> dict[str, str]:
    """The job's gpu_memory for the trainer's gpu_budget.py, which holds the framework to it."""
    return {BUDGET_ENV: str(plan.gpu_memory)} if plan.gpu_memory else {}


def docker_device_ids(worker: WorkerDevices) -> list[str]:
    """``device_ids`` for a ``DeviceRequest(device_ids=..., capabilities=[["gpu"]])``; empty for a
    CPU worker, which gets no device request at all."""
    return [str(index) for index in worker.gpus]


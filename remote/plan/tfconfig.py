"""TF_CONFIG for every worker of a job: a pure function of the cluster, the job and the addresses.

Workers follow the job's `nodes` in the order it lists them (every node in cluster.toml's order
without it), then slot order within a node when a node runs several workers; index 0 is the chief.
Each address is the node's resolved cluster address (NodeSession.address: `address` from
cluster.toml, else where its SSH connection reached) and the job port (+ slot).
"""

from __future__ import annotations

import ipaddress
import json
from dataclasses import dataclass, replace
from typing import Any, Mapping

from homegpu.remote.config import AUTO, ClusterSpec, JobSpec, NodeSpec
from homegpu.remote.plan.device_plan import DevicePlan, plan_devices
from homegpu.remote.plan.last_run import auto_gpu_memory, own_speeds
from homegpu.remote.record import Timeline


class JobConfigError(ValueError):
    """The job cannot be laid out on this cluster (no such job, no nodes)."""


@dataclass(frozen=True)
class WorkerSlot:
    """One worker: where it runs and which task index it has."""

    index: int
    node: NodeSpec
    slot: int
    port: int
    address: str

    @property
    def endpoint(self) -> str:
        address = self.address
        host = f"[{address}]" if ":" in address else address
        return f"{host}:{self.port}"

    @property
    def is_chief(self) -> bool:
        return self.index == 0

    @property
    def label(self) -> str:
        """The name logs and events use: the node, with the slot when a node runs several."""
        return self.node.name if self.slot == 0 else f"{self.node.name}#{self.slot}"


def find_job(cluster: ClusterSpec, name: str | None) -> JobSpec:
    """The named job; without a name, the only job there is."""
    if name is None:
        if len(cluster.jobs) == 1:
            return next(iter(cluster.jobs.values()))
        if not cluster.jobs:
            raise JobConfigError(f"{cluster.source} defines no jobs; add a [jobs.NAME] table (see docs/reference.md)")
        raise JobConfigError(f"{cluster.source} defines several jobs ({', '.join(cluster.jobs)}); name one")
    if name not in cluster.jobs:
        known = ", ".join(cluster.jobs) or "none"
        raise JobConfigError(f"no job named {name!r} in {cluster.source} (jobs: {known})")
    return cluster.jobs[name]


def job_node_specs(cluster: ClusterSpec, job: JobSpec) -> tuple[NodeSpec, ...]:
    """The job's nodes in TF_CONFIG order: as its `nodes` lists them (the first is the chief's), else
    every node in cluster.toml's order but the placement's login (ClusterSpec.login_only: sbatch runs there)."""
    if not job.nodes:
        return tuple(node for node in cluster.nodes if node.name != cluster.login_only)
    by_name = {node.name: node for node in cluster.nodes}
    return tuple(by_name[name] for name in job.nodes)


def machine_key(address: str) -> str:
    """Which machine an address is on, as far as ports go: every loopback address is this machine."""
    try:
        if ipaddress.ip_address(address).is_loopback:
            return "loopback"
    except ValueError:
        pass
    return address


def worker_slots(cluster: ClusterSpec, job: JobSpec, addresses: Mapping[str, str] | None = None,
                 counts: Mapping[str, int] | None = None) -> tuple[WorkerSlot, ...]:
    """Workers in job_node_specs() order. TensorFlow's server binds every interface of its machine, so
    workers on one machine (several per node, or nodes on loopback addresses) get consecutive ports.

    Args:
        addresses: node name -> resolved cluster address (Cluster.addresses()); a node missing from
            it (or no mapping at all) falls back to its configured `address` or host.
        counts: node name -> how many workers it runs (the device plan's, so "per-gpu" nodes may
            differ); a node missing from it runs the job's `workers_per_node` when that is a
            number, else one (a "per-gpu" node whose GPUs are not known yet).
    """
    slots = []
    taken: dict[str, int] = {}
    default = job.workers_per_node if isinstance(job.workers_per_node, int) else 1
    for node in job_node_specs(cluster, job):
        address = (addresses or {}).get(node.name) or node.cluster_address
        key = machine_key(address)
        for slot in range((counts or {}).get(node.name, default)):
            port = job.port + taken.get(key, 0)
            taken[key] = taken.get(key, 0) + 1
            slots.append(WorkerSlot(index=len(slots), node=node, slot=slot, port=port, address=address))
    if not slots:
        raise JobConfigError(f"job {job.name!r} has no nodes to run on")
    return tuple(slots)


def job_device_plan(cluster: ClusterSpec, job: JobSpec, gpus: Mapping[str, Any],
                    last_run: Timeline | None = None) -> DevicePlan:
    """The job's device plan on its nodes, in TF_CONFIG order.

    Args:
        gpus: node name -> its GPUs (NodeStats, or see device_plan.gpu_inventory); a node missing
            from it, or None, has unknown GPUs and makes the plan refuse.
        last_run: the job's last run's timeline (last_run.last_timeline): each worker's speed for
            the pace advice comes from it when it covers every worker, else from the GPU models; so does
            gpu_memory = "auto".

    Raises:
        DevicePlanError: the layout cannot run on these nodes (one line naming node and fix).
    """
    nodes = {node.name: gpus.get(node.name) for node in job_node_specs(cluster, job)}
    batch_size = job.batch_size if job.uses_trainer else None  # a script's batch is its own business
    # a script balances only if it asks (unknown here); the JAX demo keeps even shares
    balanced = job.uses_trainer and job.balance == "speed" and not job.is_jax
    gpu_memory, source = auto_gpu_memory(last_run) if job.gpu_memory == AUTO else (job.gpu_memory, "")
    plan = plan_devices(nodes, job.workers_per_node, batch_size, job.share_gpus, framework=job.framework,
                        balanced=balanced, gpu_memory=gpu_memory)
    speeds = own_speeds(last_run, plan.workers) if last_run else {}
    if speeds:
        plan = plan_devices(nodes, job.workers_per_node, batch_size, job.share_gpus, measured=speeds,
                            framework=job.framework, balanced=balanced, gpu_memory=gpu_memory)
    return replace(plan, gpu_memory_source=source)


def plan_counts(plan: DevicePlan) -> dict[str, int]:
    """node name -> how many workers the plan puts on it (worker_slots' `counts`)."""
    counts: dict[str, int] = {}
    for worker in plan.workers:
        counts[worker.node] = counts.get(worker.node, 0) + 1
    return counts


def tf_config(slots: tuple[WorkerSlot, ...], index: int) -> dict:
    """The TF_CONFIG dict for worker `index`: every worker's endpoint, and this worker's task."""
    return {
        "cluster": {"worker": [slot.endpoint for slot in slots]},
        "task": {"type": "worker", "index": index},
    }


def tf_config_json(slots: tuple[WorkerSlot, ...], index: int) -> str:
    return json.dumps(tf_config(slots, index), separators=(",", ":"))

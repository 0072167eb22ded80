"""A job laid out on its nodes: the device plan and the worker slots, from the nodes' latest stats.

The one place that turns a job into its workers: the run, `homegpu jobs`/`logs`/`stop`, the TUI's
launch dialog and `homegpu tfconfig` all call `lay_out`, so they cannot disagree about how many
workers a node runs or which GPUs each one gets.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass, replace
from typing import Any, Mapping

from homegpu.remote.config import ClusterSpec, JobSpec
from homegpu.remote.plan.device_plan import DevicePlan, DevicePlanError
from homegpu.remote.plan.tfconfig import (
    WorkerSlot, job_device_plan, job_node_specs, plan_counts, tf_config, worker_slots,
)
from homegpu.remote.plan.jax_env import JAX_DEMO_MODULE, jax_line
from homegpu.remote.plan.torchrun import TORCH_DEMO_MODULE, torchrun_args
from homegpu.remote.record import Timeline


@dataclass(frozen=True)
class JobLayout:
    """The job's workers in TF_CONFIG order, and the device plan that placed them.

    `plan` is None when it cannot be made: `silent` names the nodes that sent no stats yet (then a
    "per-gpu" node counts one worker), or `refusal` says in one line why the layout cannot run.
    """

    slots: tuple[WorkerSlot, ...]
    plan: DevicePlan | None = None
    silent: tuple[str, ...] = ()
    refusal: str = ""

    def why_no_plan(self) -> str:
        """What the launch dialog shows in place of the plan ("" when there is one)."""
        if self.refusal:
            return f"launch would be refused: {self.refusal}"
        if self.silent:
            return f"no device plan yet: no stats from {', '.join(self.silent)}"
        return ""

    def launch_line(self, job: JobSpec, slot: WorkerSlot, quote: bool = True) -> str:
        """What `slot` gets: its TF_CONFIG (quoted for a shell with `quote`), for a PyTorch job the torchrun its
        node runs, and for a JAX job its process's variables and command, as a user would type them."""
        if job.is_tensorflow:
            config = json.dumps(tf_config(self.slots, slot.index))
            return f"TF_CONFIG='{config}'" if quote else f"TF_CONFIG={config}"
        if job.is_jax:
            return jax_line(self.slots, slot, [job.script, *job.args] if job.script else ["-m", JAX_DEMO_MODULE, "..."])
        processes = self.plan.workers[slot.index].replicas if self.plan else 1
        program = [job.script, *job.args] if job.script else ["-m", TORCH_DEMO_MODULE, "..."]
        return shlex.join(["torchrun", *torchrun_args(self.slots, slot, processes, program)])

    def plan_lines(self) -> list[str]:
        """The plan as `homegpu tfconfig` and the launch dialog print it, or why there is none."""
        if self.plan:
            return self.plan.lines([slot.endpoint for slot in self.slots])
        return [self.why_no_plan()] if self.why_no_plan() else []


def _only_gpu(stats: Any, index: int) -> Any:
    """`stats` with GPU `index` alone among its GPUs."""
    return replace(stats, gpus=tuple(gpu for gpu in stats.gpus if gpu.index == index))


def lay_out(cluster: ClusterSpec, job: JobSpec, stats: Mapping[str, Any], addresses: Mapping[str, str] | None = None,
            last_run: Timeline | None = None, need_plan: bool = False,
            pinned: Mapping[str, int] | None = None) -> JobLayout:
    """Lay `job` out on its nodes.

    Args:
        stats: node name -> its latest NodeStats (its GPUs); a node missing from it, or None, is silent.
        addresses: node name -> resolved cluster address (Cluster.addresses()); see worker_slots.
        last_run: the job's last run's timeline, for the pace advice (plan.last_run.last_timeline).
        need_plan: a silent node is a refusal (a launch), not a plan still to come (a preview).
        pinned: node name -> the one GPU the run uses there (the queue shares a card by gpu_memory).
    """
    stats = {**stats, **{node: _only_gpu(stats[node], index) for node, index in (pinned or {}).items()
                         if stats.get(node) is not None}}
    silent = tuple(node.name for node in job_node_specs(cluster, job) if stats.get(node.name) is None)
    plan, refusal = None, ""
    if need_plan or not silent:
        try:
            plan = job_device_plan(cluster, job, stats, last_run)
        except DevicePlanError as exc:
            refusal = f"job {job.name}: {exc}"
    slots = worker_slots(cluster, job, addresses, plan_counts(plan) if plan else None)
    return JobLayout(slots, plan, silent, refusal)

"""homegpu.remote.plan: pure planning before a run: each worker's devices (the device plan), who sets
the pace (GPU models or the job's last run), the worker slots and the TF_CONFIG each gets.
"""

from __future__ import annotations

from homegpu.remote.plan.device_plan import DevicePlan, DevicePlanError, container_env, docker_device_ids, process_env
from homegpu.remote.plan.last_run import last_timeline
from homegpu.remote.plan.tfconfig import (
    JobConfigError, WorkerSlot, find_job, job_device_plan, job_nodes, plan_counts, tf_config, tf_config_json,
    worker_slots,
)
from homegpu.remote.plan.worker_devices import WorkerDevices

__all__ = [
    "DevicePlan", "DevicePlanError", "JobConfigError", "WorkerDevices", "WorkerSlot", "container_env",
    "docker_device_ids", "find_job", "job_device_plan", "job_nodes", "last_timeline", "plan_counts", "process_env",
    "tf_config", "tf_config_json", "worker_slots",
]

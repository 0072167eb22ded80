"""homegpu.remote.plan: pure planning before a run: each worker's devices (the device plan), who sets
the pace (GPU models or the job's last run), the worker slots and the TF_CONFIG each gets (or, for
PyTorch, the torchrun each node runs; for JAX, what each process's jax.distributed needs).
"""

from __future__ import annotations

from homegpu.remote.plan.device_plan import DevicePlan, DevicePlanError, container_env, docker_device_ids, process_env
from homegpu.remote.plan.gpu_speed import short_gpu_name
from homegpu.remote.plan.jax_env import JAX_DEMO_MODULE, jax_env
from homegpu.remote.plan.last_run import auto_gpu_memory, last_shares, last_timeline
from homegpu.remote.plan.layout import JobLayout, lay_out
from homegpu.remote.plan.tfconfig import (
    JobConfigError, WorkerSlot, find_job, job_node_specs, tf_config, tf_config_json,
    worker_slots,
)
from homegpu.remote.plan.torchrun import TORCH_DEMO_MODULE, torchrun_argv
from homegpu.remote.plan.worker_devices import WorkerDevices

__all__ = [
    "JAX_DEMO_MODULE", "TORCH_DEMO_MODULE", "DevicePlan", "DevicePlanError", "JobConfigError", "JobLayout",
    "WorkerDevices", "WorkerSlot", "container_env", "docker_device_ids", "find_job", "jax_env", "job_node_specs",
    "auto_gpu_memory", "last_shares", "last_timeline", "lay_out", "process_env", "short_gpu_name",
    "tf_config", "tf_config_json", "torchrun_argv", "worker_slots",
]

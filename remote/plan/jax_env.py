"""A JAX job's launch: what each process needs for `jax.distributed.initialize()` (and Keras 3's
`keras.distribution.initialize()`) to find the others with no arguments.

Process 0's cluster address and the job's port are the coordinator's; every process gets the count and its id
through homegpu's cluster environment (trainer/jax_cluster.py) and Keras's own three variables, and its own cluster
address for gloo and NCCL. A script that passes arguments to initialize() keeps them.
"""

from __future__ import annotations

import shlex
from typing import Sequence

from homegpu.remote.plan.tfconfig import WorkerSlot
from homegpu.trainer.jax_cluster import ADDRESS_ENV, COORDINATOR_ENV, PROCESS_COUNT_ENV, PROCESS_ID_ENV

JAX_DEMO_MODULE = "homegpu.trainer.jax_demo"  # the built-in JAX demo, shipped with the trainer


def jax_env(slots: Sequence[WorkerSlot], slot: WorkerSlot) -> dict[str, str]:
    """`slot`'s process's variables: the coordinator at process 0's endpoint, the count and this id."""
    coordinator, count, index = slots[0].endpoint, str(len(slots)), str(slot.index)
    return {COORDINATOR_ENV: coordinator, PROCESS_COUNT_ENV: count, PROCESS_ID_ENV: index, ADDRESS_ENV: slot.address,
            "KERAS_DISTRIBUTION_JOB_ADDRESSES": coordinator, "KERAS_DISTRIBUTION_NUM_PROCESSES": count,
            "KERAS_DISTRIBUTION_PROCESS_ID": index}


def jax_line(slots: Sequence[WorkerSlot], slot: WorkerSlot, program: Sequence[str]) -> str:
    """`slot`'s launch as a user would type it: JAX's own variables, then `python PROGRAM`."""
    env = jax_env(slots, slot)
    shown = (COORDINATOR_ENV, PROCESS_COUNT_ENV, PROCESS_ID_ENV)
    return shlex.join([*(f"{key}={env[key]}" for key in shown), "python", *program])

"""A PyTorch job's launch on each node: torchrun, with the rendezvous at the chief's address and port.

Each node runs `python -m torch.distributed.run` (what the `torchrun` command runs) with the node's
rank, its process count (one per GPU of its plan, one on a CPU-only node) and the chief's address:
the script then gets RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT exactly as under
torchrun by hand. Nodes may run different process counts; torchrun numbers the ranks across them.
homegpu restarts the whole job itself, so torchrun's own restarts stay off (its default).
"""

from __future__ import annotations

from typing import Sequence

from homegpu.remote.plan.tfconfig import WorkerSlot

TORCH_DEMO_MODULE = "homegpu.trainer.torch_demo"  # the built-in PyTorch demo, shipped with the trainer


def torchrun_argv(python: str, slots: Sequence[WorkerSlot], slot: WorkerSlot, processes: int,
                  program: Sequence[str]) -> tuple[str, ...]:
    """The node's command: torchrun for `slot` (its node rank is its index: one slot per node), then
    `program`: the script and its args, or `-m MODULE ARGS`."""
    chief = slots[0]
    return (python, "-m", "torch.distributed.run", f"--nnodes={len(slots)}", f"--nproc-per-node={processes}",
            f"--node-rank={slot.index}", f"--master-addr={chief.address}", f"--master-port={chief.port}",
            *program)

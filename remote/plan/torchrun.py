"""A PyTorch job's launch on each node: torchrun, with the rendezvous at the chief's address and port.

Each node runs torchrun (`python -m torch.distributed.run`, through homegpu.trainer.torchrun, which first
points gloo and NCCL at the interface holding the node's cluster address) with the node's rank, its process
count (one per GPU of its plan, one on a CPU-only node) and the chief's address: the script then gets RANK,
LOCAL_RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT exactly as under torchrun by hand. Nodes may run different process counts; torchrun numbers the ranks across them.
homegpu restarts the whole job itself, so torchrun's own restarts stay off (its default).
"""

from __future__ import annotations

from typing import Sequence

from homegpu.remote.plan.tfconfig import WorkerSlot

TORCH_DEMO_MODULE = "homegpu.trainer.torch_demo"  # the built-in PyTorch demo, shipped with the trainer
TORCHRUN_MODULE = "homegpu.trainer.torchrun"  # torchrun on the node's cluster interface, shipped too


def torchrun_argv(python: str, slots: Sequence[WorkerSlot], slot: WorkerSlot, processes: int,
                  program: Sequence[str]) -> tuple[str, ...]:
    """The node's command: torchrun for `slot` on its cluster address's interface, then `program`."""
    return (python, "-m", TORCHRUN_MODULE, "--address", slot.address,
            *torchrun_args(slots, slot, processes, program))


def torchrun_args(slots: Sequence[WorkerSlot], slot: WorkerSlot, processes: int,
                  program: Sequence[str]) -> tuple[str, ...]:
    """torchrun's arguments for `slot` (its node rank is its index: one slot per node), then `program`:
    the script and its args, or `-m MODULE ARGS`."""
    chief = slots[0]
    return (f"--nnodes={len(slots)}", f"--nproc-per-node={processes}", f"--node-rank={slot.index}",
            f"--master-addr={chief.address}", f"--master-port={chief.port}", *program)

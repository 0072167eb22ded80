"""One worker's place and devices: what the device plan decides and the pace advice reads."""

from __future__ import annotations

from dataclasses import dataclass

from homegpu.remote.plan.gpu_speed import short_gpu_name


@dataclass(frozen=True)
class WorkerDevices:
    """One worker's place and devices.

    Attributes:
        node: the node's name.
        index: the TF_CONFIG task index (0 is the chief).
        slot: the worker's number on its node, 0..workers_on_node-1 (the port offset on that node).
        gpus: the node's GPU indices this worker sees; empty for a CPU worker.
        gpu_names: their names, in the same order.
        replicas: MirroredStrategy replicas on this worker (its GPU count, 1 on CPU).
    """

    node: str
    index: int
    slot: int
    gpus: tuple[int, ...]
    gpu_names: tuple[str, ...]
    replicas: int

    @property
    def on_cpu(self) -> bool:
        return not self.gpus

    @property
    def label(self) -> str:
        """The name logs use: the node, with the slot when it is not the node's first worker."""
        return self.node if self.slot == 0 else f"{self.node}#{self.slot}"

    @property
    def device_text(self) -> str:
        """"GPU 0 RTX 3090", "GPUs 0,1 H100 NVL" or "CPU"."""
        if self.on_cpu:
            return "CPU"
        names = [short_gpu_name(n) for n in self.gpu_names]
        indices = ",".join(map(str, self.gpus))
        if len(set(names)) == 1:
            return f"GPU{'s' if len(self.gpus) > 1 else ''} {indices} {names[0]}"
        return "GPUs " + ", ".join(f"{i} {n}" for i, n in zip(self.gpus, names))

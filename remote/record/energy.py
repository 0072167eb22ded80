"""Energy from a run's samples: each GPU's joules as its energy counter measured them (NVML, Volta and
newer), else as the integral of its sampled draw; the rest of each machine's (CPUs, memory, the board) by RAPL's
counter where the node's user can read it, else integrated from the draw its idle_watts and busy_watts estimate
(NodeSpec.host_watts), else not counted ("GPU only"); in kWh and money.

Each step between two samples is energy/'s one rule (step_joules), priced at its midpoint's tariff, so a run
across a tariff boundary pays each rate for its own part (within one sample interval). Every figure says how
it was obtained (`method`).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Mapping

from homegpu.remote.config import Tariff
from homegpu.remote.energy import COUNTER, INTEGRATED, Energy, integrate
from homegpu.remote.record.html_report_inputs import ReportError, read_manifest
from homegpu.remote.record.run_folder import RunFolder
from homegpu.remote.record.timeline import load_timeline
from homegpu.remote.record.timeline_schema import GpuTimeline, NodeTimeline, Timeline, TimelineDamaged

RAPL = "measured by RAPL"  # the rest of a machine: its CPUs' and memory's energy counters
ESTIMATED = "estimated from CPU use (idle_watts, busy_watts)"
HOST_METHODS = {COUNTER: RAPL, INTEGRATED: ESTIMATED}  # a host's steps are counted or integrated as a GPU's are


def gpu_energy(gpu: GpuTimeline, price_at: Callable[[float], float] | None = None) -> Energy:
    """One GPU of a run's timeline: its energy counter's readings where its samples carry them, else its draw."""
    counters = gpu.energy.values if len(gpu.energy.values) == len(gpu.power.values) else ()
    return integrate(gpu.power.times, gpu.power.values, counters, price_at)


def host_energy(node: NodeTimeline, price_at: Callable[[float], float] | None = None) -> Energy | None:
    """The rest of one machine: by its RAPL counter where its samples carry one, else by its estimated draw;
    None where it has neither (the run counts its GPUs only)."""
    if any(value is not None for value in node.host_energy.values):
        found = integrate(node.host_energy.times, [None] * len(node.host_energy.times), node.host_energy.values,
                          price_at)
    elif any(value is not None for value in node.host_power.values):
        found = integrate(node.host_power.times, node.host_power.values, (), price_at)
    else:
        return None
    return replace(found, method=HOST_METHODS.get(found.method, found.method))


@dataclass(frozen=True)
class RunEnergy:
    """A run's energy: per node, its GPUs' together (`nodes`) and the rest of the machine (`hosts`, where
    measured or estimated), and in all, priced by `tariff`."""

    nodes: Mapping[str, Energy]
    tariff: Tariff
    epochs: int = 0  # epochs the run trained (its busiest worker's epoch lines, a repeated one counted again)
    hosts: Mapping[str, Energy] = field(default_factory=dict)

    @property
    def gpus(self) -> Energy:
        return sum(self.nodes.values(), Energy())

    @property
    def total(self) -> Energy:
        return sum(self.hosts.values(), self.gpus)

    def node_total(self, name: str) -> Energy:
        return self.nodes.get(name, Energy()) + self.hosts.get(name, Energy())

    def line(self) -> str:
        """One line for the run's summary: `energy 0.0123 kWh on GPUs (node3 0.0123 kWh; ...), cost 0.0043 EUR`,
        and with the rest of the machines where they were measured or estimated: `energy 0.0150 kWh (node3
        0.0150 kWh; GPUs 0.0123 kWh integrated from power samples, rest of node3 0.0027 kWh estimated ...)`."""
        total = self.total
        names = list(dict.fromkeys([*self.nodes, *self.hosts]))
        each = ", ".join(f"{name} {self.node_total(name).kwh:.4g} kWh" for name in names)
        if self.hosts:
            parts = [f"GPUs {self.gpus.kwh:.4g} kWh {self.gpus.method}"] if self.nodes else []
            parts += [f"rest of {name} {energy.kwh:.4g} kWh {energy.method}" for name, energy in self.hosts.items()]
            parts += [f"{name} GPU only" for name in self.nodes if name not in self.hosts]
            text = f"energy {total.kwh:.4g} kWh ({each}; {', '.join(parts)})"
        else:
            text = f"energy {total.kwh:.4g} kWh on GPUs ({each}; {total.method})"
        if self.epochs:
            text += f", {total.kwh / self.epochs:.3g} kWh per epoch"
        if total.gap_seconds:
            text += f", {total.gap_seconds:.0f} s without samples not counted"
        if self.tariff.priced:
            return text + f", cost {total.cost:.4g} {self.tariff.currency}".rstrip()
        return text + "; set price_per_kwh in [cluster] for its cost"


def run_energy(timeline: Timeline, tariff: Tariff) -> RunEnergy | None:
    """The energy of a run's timeline, or None when no GPU reported its power and no machine its own."""
    price_at = tariff.price_at if tariff.priced else None
    nodes, hosts = {}, {}
    for node in timeline.nodes:
        gpus = [gpu_energy(gpu, price_at) for gpu in node.gpus
                if any(value is not None for value in gpu.power.values + gpu.energy.values)]
        if gpus:
            nodes[node.name] = sum(gpus, Energy())
        if (host := host_energy(node, price_at)) is not None:
            hosts[node.name] = host
    epochs = max((len(worker.epoch_loss.times) for worker in timeline.workers), default=0)
    return RunEnergy(nodes, tariff, epochs, hosts) if nodes or hosts else None


def energy_of(run_dir: Path) -> RunEnergy | None:
    """The energy of the run in `run_dir` (experiments/RUN-ID), priced as run.json says it was when the run
    began; None when it has no readable timeline or no GPU power in it."""
    try:
        tariff = Tariff.from_dict(read_manifest(run_dir).get("tariff"))
        return run_energy(load_timeline(RunFolder(run_dir).timeline), tariff)
    except (OSError, ReportError, TimelineDamaged):
        return None

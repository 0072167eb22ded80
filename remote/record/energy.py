"""Energy from a run's samples: each GPU's joules as its energy counter measured them (NVML, Volta and
newer), else as the integral of its sampled draw; the rest of each machine's (CPUs, memory, the board) by RAPL's
counter where the node's user can read it, else integrated from the draw its idle_watts and busy_watts estimate
(NodeSpec.host_watts), else not counted ("GPU only"); in kWh and money.

Between two samples of a GPU no further apart than MAX_GAP_S, the energy is its counter's difference where
both samples carry the counter, else the draw is taken to change linearly (a trapezoid); a longer gap (the
node offline, homegpu not watching) is a gap: counted as such, never filled with a guess. Each step is priced
at its midpoint's tariff, so a run across a tariff boundary pays each rate for its own part (within one
sample interval). Every figure says how it was obtained (`method`). serve's history and the budget alerts
use the same step rule (step_joules), so a run's kWh agree wherever they are shown.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Hashable, Iterable, Mapping, NamedTuple, Sequence

from homegpu.remote.config import Tariff
from homegpu.remote.record.html_report_inputs import ReportError, read_manifest
from homegpu.remote.record.run_folder import RunFolder
from homegpu.remote.record.timeline import load_timeline
from homegpu.remote.record.timeline_schema import GpuTimeline, NodeTimeline, Timeline, TimelineDamaged

MAX_GAP_S = 10.0  # samples come every stats_interval (1 s): a few lost ones are bridged, a longer silence is not
JOULES_PER_KWH = 3.6e6
INTEGRATED = "integrated from power samples"
COUNTER = "measured by the GPUs' energy counters"
MIXED = "counters where the GPUs have them, else integrated from power samples"
RAPL = "measured by RAPL"  # the rest of a machine: its CPUs' and memory's energy counters
ESTIMATED = "estimated from CPU use (idle_watts, busy_watts)"
HOST_METHODS = {COUNTER: RAPL, INTEGRATED: ESTIMATED}  # a host's steps are counted or integrated as a GPU's are


@dataclass(frozen=True)
class Energy:
    """Joules over `seconds` of samples, what they cost, and `gap_seconds` that no sample covered."""

    joules: float = 0.0
    seconds: float = 0.0
    gap_seconds: float = 0.0
    cost: float = 0.0
    method: str = ""  # INTEGRATED, COUNTER or MIXED; "" for no energy at all

    @property
    def kwh(self) -> float:
        return self.joules / JOULES_PER_KWH

    def __add__(self, other: "Energy") -> "Energy":
        return Energy(self.joules + other.joules, max(self.seconds, other.seconds),
                      max(self.gap_seconds, other.gap_seconds), self.cost + other.cost,
                      _one_method({self.method, other.method}))


def _one_method(methods: Iterable[str]) -> str:
    """How a sum was obtained from how its parts were: their one way, MIXED, or "" for no energy at all."""
    found = set(methods) - {""}
    return found.pop() if len(found) == 1 else (MIXED if found else "")


def step_joules(span: float, watts: tuple[float | None, float | None],
                counters: tuple[float | None, float | None] = (None, None),
                max_gap: float = MAX_GAP_S) -> tuple[float, str] | None:
    """The joules a GPU used between two samples `span` seconds apart, and how they were obtained: its energy
    counter's difference when both samples carry it, else the trapezoid of its draw. None: a gap (too far
    apart, a reading missing, or a counter that went back because the driver reloaded)."""
    if not 0 < span <= max_gap:
        return None
    before, after = counters
    if before is not None and after is not None:
        return (after - before, COUNTER) if after >= before else None
    w0, w1 = watts
    if w0 is None or w1 is None:
        return None
    return (w0 + w1) / 2 * span, INTEGRATED


class Step(NamedTuple):
    """A GPU's energy between two of its samples: how much, how it was obtained, and the moment between them
    (where a tariff prices it)."""

    joules: float
    method: str
    middle: float


class EnergySteps:
    """Each GPU's energy since its previous sample, by step_joules, as samples come (serve's history, the budget
    alerts): a sample's readings are kept under the caller's key for the GPU's next one. A GPU's first sample,
    and one after forget(), has no step."""

    def __init__(self, max_gap: float = MAX_GAP_S) -> None:
        self.max_gap = max_gap
        self._last: dict[Hashable, tuple[float, float | None, float | None]] = {}

    def step(self, key: Hashable, at: float, power: object, counter: object) -> Step | None:
        """The energy since `key`'s previous sample (None: there is none, or a gap); `power` (W) and `counter`
        (J) as the stats say them (not a number: not read)."""
        reading = (at, _reading(power), _reading(counter))
        before, self._last[key] = self._last.get(key), reading
        if before is None:
            return None
        found = step_joules(at - before[0], (before[1], reading[1]), (before[2], reading[2]), self.max_gap)
        return Step(*found, (before[0] + at) / 2) if found else None

    def forget(self, node: object = None) -> None:
        """Start afresh: every GPU's readings, or those of `node` (the first part of each key)."""
        self._last = {key: reading for key, reading in self._last.items() if node is not None and key[0] != node}


def _reading(value: object) -> float | None:
    """A stats value as a float: not available (NA), not a number or not finite is None."""
    kind = type(value)
    return float(value) if (kind is int or kind is float) and value - value == 0 else None


def integrate(times: Sequence[float], watts: Sequence[float | None], counters: Sequence[float | None] = (),
              price_at: Callable[[float], float] | None = None, max_gap: float = MAX_GAP_S) -> Energy:
    """The energy of one GPU's samples (`times` ascending), each step by step_joules and priced at its midpoint;
    `counters` (the energy counter's readings, None where a sample has none) may be empty."""
    counters = counters or (None,) * len(times)
    joules = seconds = gaps = cost = 0.0
    methods = set()
    for i in range(1, len(times)):
        t0, t1 = times[i - 1], times[i]
        step = step_joules(t1 - t0, (watts[i - 1], watts[i]), (counters[i - 1], counters[i]), max_gap)
        if step is None:
            gaps += max(t1 - t0, 0.0)
            continue
        part, method = step
        joules, seconds = joules + part, seconds + (t1 - t0)
        methods.add(method)
        if price_at is not None:
            cost += part / JOULES_PER_KWH * price_at((t0 + t1) / 2)
    return Energy(joules, seconds, gaps, cost, _one_method(methods))


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

"""`/metrics`: the cluster as it is now, in Prometheus's text format, named the way Grafana users expect
(dcgm-exporter's and node_exporter's habits: a unit in every name, bytes, watts, celsius, ratios as percent).

Read at each scrape from the nodes' latest stats and the job board, nothing stored here. A value a node
cannot report (NA) is left out rather than written as 0, so a graph shows a gap, not a false zero.

Every label value is shown as the terminal commands show node text (nodes.visible: a control character as
its escape), since `curl .../metrics` in a terminal would otherwise run a GPU's or a process's name. A GPU's
processes are one series per name and owner, never per pid: each new pid would be a new series that
Prometheus keeps for its retention.

What holds a GPU back (issue 35) is its figures, not the words: each clock event reason as a 0/1 series
(0 for a known reason not active, none at all where the reasons are unknown), the clocks and their maximums,
the PCIe link now, what card and slot can do together (``_max``) and the card alone (``_gpu_max``), the
link's traffic each way (a ``direction`` label, NVML only), and the XIDs the driver logged since boot with the
last one's code. A dashboard or an alert rule then judges them as `homegpu status` does (remote/nodes/health.py).
"""

from __future__ import annotations

import time
from collections import defaultdict
from typing import Callable, Iterator, Sequence

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from homegpu.remote.events import NA, GpuStats, NodeState
from homegpu.remote.history import HOST
from homegpu.remote.node_side import THROTTLE_REASONS
from homegpu.remote.nodes import MIB, Cluster, is_number, visible
from homegpu.remote.serve.job_board import JobBoard

GPU_LABELS = ("cluster", "node", "gpu", "model", "uuid")
NODE_LABELS = ("cluster", "node")
WORKER_LABELS = ("cluster", "job", "run", "worker")
OWNER_LABELS = ("process", "user", "job", "run")  # what a GPU's processes are summed by

# (name, help, how to read it from a GpuStats)
GPU_GAUGES = (
    ("homegpu_gpu_utilization_percent", "GPU utilisation (percent of time a kernel ran)", lambda g: g.util),
    ("homegpu_gpu_memory_used_bytes", "GPU memory in use", lambda g: _bytes(g.mem_used)),
    ("homegpu_gpu_memory_total_bytes", "GPU memory in all", lambda g: _bytes(g.mem_total)),
    ("homegpu_gpu_temperature_celsius", "GPU temperature", lambda g: g.temp),
    ("homegpu_gpu_power_watts", "GPU power draw", lambda g: g.power),
    ("homegpu_gpu_power_limit_watts", "GPU power limit", lambda g: g.power_limit),
    ("homegpu_gpu_sm_clock_mhz", "GPU SM clock", lambda g: g.sm_clock),
    ("homegpu_gpu_sm_clock_max_mhz", "GPU SM clock's maximum", lambda g: g.sm_clock_max),
    ("homegpu_gpu_memory_clock_mhz", "GPU memory clock", lambda g: g.mem_clock),
    ("homegpu_gpu_memory_clock_max_mhz", "GPU memory clock's maximum", lambda g: g.mem_clock_max),
    ("homegpu_gpu_pcie_link_generation", "GPU PCIe link generation now (an idle card lowers it)",
     lambda g: g.pcie.gen),
    ("homegpu_gpu_pcie_link_width", "GPU PCIe link width (lanes) now", lambda g: g.pcie.width),
    ("homegpu_gpu_pcie_link_generation_max", "the highest PCIe generation the GPU and its slot can do together",
     lambda g: g.pcie.max_gen),
    ("homegpu_gpu_pcie_link_width_max", "the widest PCIe link the GPU and its slot can do together",
     lambda g: g.pcie.max_width),
    ("homegpu_gpu_pcie_link_generation_gpu_max", "the highest PCIe generation the GPU alone can do",
     lambda g: g.pcie.gpu_max_gen),
    ("homegpu_gpu_pcie_link_width_gpu_max", "the widest PCIe link the GPU alone can do",
     lambda g: g.pcie.gpu_max_width),
    ("homegpu_gpu_xid_errors", "XID errors the NVIDIA driver logged for the GPU since boot (the node's kernel log; "
     "none where its user cannot read it)", lambda g: g.xid.count if g.xid else NA),
    ("homegpu_gpu_last_xid", "the code of the last XID error the NVIDIA driver logged for the GPU",
     lambda g: g.xid.last if g.xid else NA),
)
# direction label -> the PcieLink field: MB/s the GPU sends (tx) and receives (rx)
PCIE_DIRECTIONS = (("tx", "tx_mbs"), ("rx", "rx_mbs"))
MB = 1000 * 1000
REASON_NAMES = tuple(name for _, name in THROTTLE_REASONS)  # NVML's documented clock event reasons
# (name, help, Metric property)
WORKER_GAUGES = (
    ("homegpu_job_epoch", "the last epoch the worker finished", "epoch"),
    ("homegpu_job_examples_per_second", "the worker's training rate over its last epoch", "examples_per_sec"),
    ("homegpu_job_steps_per_second", "the worker's steps per second (a script whose batch size is unknown)",
     "steps_per_sec"),
    ("homegpu_job_loss", "the worker's loss at its last epoch", "loss"),
    ("homegpu_job_accuracy", "the worker's accuracy at its last epoch", "accuracy"),
)


def _bytes(mib):
    return NA if mib is NA else mib * MIB


EnergyTotals = Callable[[], Sequence[tuple[str, int, str, str, float]]]  # HistoryRecorder.energy_totals


class ClusterCollector(Collector):
    """Collects `cluster`'s nodes and GPUs and `board`'s runs at each scrape, and the GPUs' energy counters
    from `energy` (the history's totals: they never go back, across serve's restarts)."""

    def __init__(self, cluster: Cluster, board: JobBoard, energy: EnergyTotals | None = None) -> None:
        self.cluster, self.board, self.energy = cluster, board, energy

    def collect(self) -> Iterator[GaugeMetricFamily]:
        yield from self._nodes()
        yield from self._gpus()
        yield from self._jobs()
        yield from self._energy()

    def _energy(self) -> Iterator[CounterMetricFamily]:
        if self.energy is None:
            return
        name = self.cluster.spec.name
        gpus = CounterMetricFamily("homegpu_gpu_energy_joules", "energy the GPU used while homegpu serve recorded it "
                                   "(its counter where NVML has one, else its power integrated)", labels=GPU_LABELS)
        hosts = CounterMetricFamily("homegpu_node_host_energy_joules", "energy the rest of the machine (CPUs, memory, "
                                    "board) used while homegpu serve recorded it: RAPL's counters where the node's "
                                    "user can read them, else estimated from idle_watts and busy_watts",
                                    labels=NODE_LABELS)
        nodes = CounterMetricFamily("homegpu_node_energy_joules", "energy the node used while homegpu serve recorded "
                                    "it: its GPUs', and the rest of the machine's where measured or estimated",
                                    labels=NODE_LABELS)
        per_node: dict[str, float] = defaultdict(float)
        for node, gpu, model, uuid, joules in self.energy():
            if gpu == HOST:
                hosts.add_metric([visible(name), visible(node)], joules)
            else:
                gpus.add_metric([visible(label) for label in (name, node, str(gpu), model, uuid)], joules)
            per_node[node] += joules
        for node, joules in per_node.items():
            nodes.add_metric([visible(name), visible(node)], joules)
        yield from (gpus, hosts, nodes)
        tariff = self.cluster.spec.tariff
        price = GaugeMetricFamily("homegpu_electricity_price_per_kwh", "the price of a kWh now (cluster.toml's "
                                  "price_per_kwh, or its tariff at this time of day)", labels=("cluster", "currency"))
        if tariff.priced:  # what the dashboard's cost panel multiplies the kWh by
            price.add_metric([visible(name), visible(tariff.currency)], tariff.price_at(time.time()))
        yield price

    def _nodes(self) -> Iterator[GaugeMetricFamily]:
        name = self.cluster.spec.name
        up = GaugeMetricFamily("homegpu_node_up", "1 while homegpu reaches the node over SSH, else 0", labels=NODE_LABELS)
        cpu = GaugeMetricFamily("homegpu_node_cpu_percent", "the node's CPU use", labels=NODE_LABELS)
        used = GaugeMetricFamily("homegpu_node_memory_used_bytes", "the node's memory in use", labels=NODE_LABELS)
        total = GaugeMetricFamily("homegpu_node_memory_total_bytes", "the node's memory in all", labels=NODE_LABELS)
        asleep = GaugeMetricFamily("homegpu_node_asleep", "1 while the node sleeps because homegpu put it to sleep "
                                   "(not a fault: work that needs it wakes it), else 0", labels=NODE_LABELS)
        for node in self.cluster.nodes.values():
            labels = [name, node.name]
            online = node.state is NodeState.ONLINE
            _add(up, labels, 1.0 if online else 0.0)
            _add(asleep, labels, 1.0 if node.state is NodeState.ASLEEP else 0.0)
            stats = node.latest if online else None
            if stats is not None:
                _add(cpu, labels, stats.cpu)
                _add(used, labels, _bytes(stats.mem_used))
                _add(total, labels, _bytes(stats.mem_total))
        yield from (up, asleep, cpu, used, total)

    def _gpus(self) -> Iterator[GaugeMetricFamily]:
        families = [GaugeMetricFamily(name, text, labels=GPU_LABELS) for name, text, _ in GPU_GAUGES]
        processes = GaugeMetricFamily(
            "homegpu_gpu_process_memory_used_bytes",
            "GPU memory held by the GPU's processes of one name and owner (summed over their pids)",
            labels=(*GPU_LABELS, *OWNER_LABELS))
        reasons = GaugeMetricFamily(
            "homegpu_gpu_clock_event_reason_active",
            "1 while the clock event reason holds the GPU's clocks down, else 0 (NVML's reasons, read every 5 s; "
            "gpu_idle is no fault)", labels=(*GPU_LABELS, "reason"))
        traffic = GaugeMetricFamily(
            "homegpu_gpu_pcie_throughput_bytes_per_second",
            "bytes a second over the GPU's PCIe link, sent (tx) or received (rx) by the GPU (NVML's 20 ms sample, "
            "read every 5 s)", labels=(*GPU_LABELS, "direction"))
        for node in self.cluster.nodes.values():
            stats = node.latest if node.state is NodeState.ONLINE else None
            for gpu in stats.gpus if stats else ():
                labels = self._gpu_labels(node.name, gpu)
                for family, (_, _, read) in zip(families, GPU_GAUGES):
                    _add(family, labels, read(gpu))
                for owner, mib in _memory_by_owner(gpu).items():
                    _add(processes, [*labels, *owner], _bytes(mib))
                for reason, active in _reasons(gpu).items():
                    _add(reasons, [*labels, reason], active)
                for direction, field in PCIE_DIRECTIONS:
                    _add(traffic, [*labels, direction], getattr(gpu.pcie, field) * MB)
        yield from (*families, processes, reasons, traffic)

    def _gpu_labels(self, node: str, gpu: GpuStats) -> list[str]:
        return [self.cluster.spec.name, node, _text(gpu.index), _text(gpu.name), _text(gpu.uuid)]

    def _jobs(self) -> Iterator[GaugeMetricFamily]:
        name = self.cluster.spec.name
        families = [GaugeMetricFamily(metric, text, labels=WORKER_LABELS) for metric, text, _ in WORKER_GAUGES]
        restarts = GaugeMetricFamily("homegpu_job_restarts", "restarts of the run so far",
                                     labels=("cluster", "job", "run"))
        for run in list(self.board.runs.values()):
            _add(restarts, [name, run.job, run.run_id], run.restarts)
            for worker, metric in run.workers.items():
                for family, (_, _, key) in zip(families, WORKER_GAUGES):
                    _add(family, [name, run.job, run.run_id, worker], getattr(metric, key))
        yield from (*families, restarts)


def _reasons(gpu: GpuStats) -> dict[str, int]:
    """Each clock event reason: 1 active, 0 not; a bit NVML had not documented only while active. None
    known where the node cannot read them (an older agent or driver): a 0 there would say "not held back"."""
    if gpu.throttle is None:
        return {}
    return {**dict.fromkeys(REASON_NAMES, 0), **dict.fromkeys(gpu.throttle, 1)}


def _memory_by_owner(gpu: GpuStats) -> dict[tuple[str, ...], float]:
    """MiB held on `gpu` by each (process name, user, job, run): the processes that share them summed. An owner
    none of whose processes says its memory (NA) is left out."""
    memory: dict[tuple[str, ...], float] = defaultdict(float)
    for process in gpu.processes:
        owner = process.owner
        key = (_text(process.name), *(_text(getattr(owner, field, NA)) for field in ("user", "job", "run_id")))
        if is_number(process.mem):
            memory[key] += process.mem
    return memory


def _add(family: GaugeMetricFamily, labels: Sequence[str], value: object) -> None:
    """One sample, unless the value is not a number (NA, None: the node or worker did not say); every label
    as a person may see it (control characters shown, never sent)."""
    if is_number(value):
        family.add_metric([visible(label) for label in labels], float(value))


def _text(value: object) -> str:
    return "" if value is NA or value is None else str(value)

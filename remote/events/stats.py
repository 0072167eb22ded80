"""A node's stats as frozen snapshots (what NodeStatsUpdated carries); nodes/stats.py parses the agent's lines.

The agent (``node_side/agent/stats_agent.py``, reading through ``gpu_nvml.py``, ``gpu_smi.py`` and
``host_proc.py``) writes ``null`` for anything a node cannot measure; here that becomes :data:`NA`,
a value that formats as "n/a" and is falsy, so widgets print ``f"{gpu.power:5.0f} W"`` without a
``None`` check per field (the habit nvitop's ``NA`` teaches, see STYLE.md).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any


# A format spec: [[fill]align][sign][#][0][width][grouping][.precision][type]
_SPEC = re.compile(
    r"(?P<fill>.?(?P<align>[<>=^]))?[+\- ]?#?0?(?P<width>\d+)?[,_]?(?:\.\d+)?(?P<type>[a-zA-Z%])?"
)


class NotAvailable(str):
    """The one "not available" value: falsy, prints as "n/a", and survives arithmetic.

    It is a ``str`` so it drops into text as is; numeric format specs keep only their width and
    alignment (``f"{NA:>6.1f}"`` is ``"   n/a"``), and arithmetic with it gives NA again, so derived
    values such as :attr:`GpuStats.mem_percent` need no special case.
    """

    _instance: NotAvailable | None = None

    def __new__(cls) -> NotAvailable:
        if cls._instance is None:
            cls._instance = super().__new__(cls, "n/a")
        return cls._instance

    def __bool__(self) -> bool:
        return False

    def __repr__(self) -> str:
        return "NA"

    def __float__(self) -> float:
        return math.nan

    def __format__(self, spec: str) -> str:
        match = _SPEC.fullmatch(spec)
        if not match or not match["type"] or match["type"] == "s":
            return super().__format__(spec)
        # A number spec: keep the column width, right-aligned like the numbers around it.
        fill = match["fill"] or ">"
        if match["align"] == "=":
            fill = fill[:-1] + ">"
        return super().__format__(fill + (match["width"] or ""))

    def _na(self, *_: Any) -> NotAvailable:
        return self

    __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = _na
    __truediv__ = __rtruediv__ = __floordiv__ = __rfloordiv__ = __neg__ = __abs__ = _na

    def __reduce__(self) -> tuple[type, tuple[()]]:
        return (NotAvailable, ())

    def __copy__(self) -> NotAvailable:
        return self

    def __deepcopy__(self, memo: dict[int, Any]) -> NotAvailable:
        return self


NA = NotAvailable()

Number = int | float | NotAvailable
Text = str | NotAvailable


def _percent(part: Number, whole: Number) -> float | NotAvailable:
    if not isinstance(part, (int, float)) or not isinstance(whole, (int, float)) or whole <= 0:
        return NA
    return 100.0 * part / whole


@dataclass(frozen=True)
class ProcessOwner:
    """Who a GPU process belongs to, as the node's agent found out (remote/node_side/agent/process_owners.py).

    ``kind``: "worker" (a homegpu worker: ``run_id``, ``job``, ``index``, and ``gpu_memory``, its budget in
    bytes, where its job has one), "container" (another
    container: ``container``, ``container_name``), "process" (a user's process) or "unknown" (the
    agent could not see it). ``user`` is the process's user name wherever it was readable.
    """

    kind: str
    user: Text = NA
    uid: Number = NA
    run_id: Text = NA
    job: Text = NA
    index: Number = NA
    container: Text = NA
    container_name: Text = NA
    gpu_memory: Number = NA


@dataclass(frozen=True)
class GpuProcess:
    """A compute process on a GPU; ``mem`` in MiB (NA on Windows/WDDM and in some containers).
    ``owner`` is None where the agent did not say (an older agent, or none could be looked up)."""

    pid: Number
    name: Text
    mem: Number
    owner: ProcessOwner | None = None


@dataclass(frozen=True)
class PcieLink:
    """A GPU's PCIe link: its generation and width now, what the card and its slot can do together
    (``max_gen``, ``max_width``), what the card alone can (``gpu_max_gen``, ``gpu_max_width``), and the
    MB/s the GPU sends and receives over it (``tx_mbs``, ``rx_mbs``: NVML only); NA where the node cannot
    tell (node_side/agent/gpu_health.py)."""

    gen: Number = NA
    width: Number = NA
    max_gen: Number = NA
    max_width: Number = NA
    gpu_max_gen: Number = NA
    gpu_max_width: Number = NA
    tx_mbs: Number = NA
    rx_mbs: Number = NA


@dataclass(frozen=True)
class XidErrors:
    """The XID errors the NVIDIA driver logged for a GPU since boot (node_side/agent/gpu_xid.py): how many, the last
    one's code and its unix time (NA while there is none)."""

    count: Number
    last: Number = NA
    last_at: Number = NA


@dataclass(frozen=True)
class GpuStats:
    """One GPU at one moment: util %, memory MiB, temperature C, power W, SM clock MHz.

    ``mem_used`` is what nvidia-smi shows, without the memory the driver reserves for itself;
    ``mem_reserved`` is that reservation where the node's NVML reports it (NA otherwise).
    Its health, read every few seconds by the agent: ``throttle`` names the clock event reasons
    active now (node_side/agent/gpu_health.py's names; None where unknown, () for none), the memory
    clock and both maximum clocks in MHz, and its PCIe link (``remote/nodes/health.py`` judges them);
    ``xid`` its XIDs since boot, None where the node cannot read its kernel log (or the agent predates it),
    and ``bus_id`` its PCI address (``00000000:2D:00.0``).
    """

    index: Number
    name: Text
    uuid: Text
    util: Number
    mem_used: Number
    mem_total: Number
    temp: Number
    power: Number
    power_limit: Number
    sm_clock: Number
    processes: tuple[GpuProcess, ...] = ()
    mem_reserved: Number = NA
    energy: Number = NA  # joules since the driver loaded, where NVML counts them (Volta and newer)
    throttle: tuple[str, ...] | None = None
    mem_clock: Number = NA
    sm_clock_max: Number = NA
    mem_clock_max: Number = NA
    pcie: PcieLink = PcieLink()
    xid: XidErrors | None = None
    bus_id: Text = NA

    @property
    def mem_percent(self) -> float | NotAvailable:
        return _percent(self.mem_used, self.mem_total)

    @property
    def power_percent(self) -> float | NotAvailable:
        return _percent(self.power, self.power_limit)


@dataclass(frozen=True)
class NodeStats:
    """One agent line: the node's GPUs plus CPU %, load, memory MiB and free disk MiB."""

    timestamp: float
    source: str
    gpus: tuple[GpuStats, ...]
    driver: Text
    cuda: Text
    cpu: Number
    load: tuple[Number, Number, Number]
    mem_used: Number
    mem_total: Number
    disk_free: Number
    errors: tuple[str, ...] = ()
    host_energy: Number = NA  # the CPUs' and memory's RAPL joules since the agent began (node_side/agent/host_power.py)
    host_power: Number = NA  # without RAPL: the draw besides the GPUs estimated from `cpu` (NodeSpec.host_watts)
    sleeping: bool = False  # logind said the machine is about to sleep (node_side/agent/sleep_watch.py)
    health_pending: bool = False  # a streaming agent's light first line: GPU health and XIDs come on the next

    @property
    def mem_percent(self) -> float | NotAvailable:
        return _percent(self.mem_used, self.mem_total)

    @property
    def has_gpus(self) -> bool:
        return bool(self.gpus)

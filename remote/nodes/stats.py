"""Node stats on the controller: the stats agent's JSON lines turned into frozen snapshots.

The agent (``node_side/stats_agent.py``, reading through ``gpu_nvml.py``, ``gpu_smi.py`` and
``host_proc.py``) writes ``null`` for anything a node cannot measure; here that becomes :data:`NA`,
a value that formats as "n/a" and is falsy, so widgets print ``f"{gpu.power:5.0f} W"`` without a
``None`` check per field (the habit nvitop's ``NA`` teaches, see STYLE.md).
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from dataclasses import dataclass, fields
from typing import Any

from homegpu.remote.node_side import GPU_SOURCES, PROTOCOL_VERSION


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


class StatsParseError(ValueError):
    """A stats line that is not what the agent protocol says; the message names the bad field."""


def _percent(part: Number, whole: Number) -> float | NotAvailable:
    if not isinstance(part, (int, float)) or not isinstance(whole, (int, float)) or whole <= 0:
        return NA
    return 100.0 * part / whole


OWNER_KINDS = ("worker", "container", "process", "unknown")


@dataclass(frozen=True)
class ProcessOwner:
    """Who a GPU process belongs to, as the node's agent found out (remote/node_side/process_owners.py).

    ``kind``: "worker" (a homegpu worker: ``run_id``, ``job``, ``index``), "container" (another
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
    tell (node_side/gpu_health.py)."""

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
    """The XID errors the NVIDIA driver logged for a GPU since boot (node_side/gpu_xid.py): how many, the last
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
    active now (node_side/gpu_health.py's names; None where unknown, () for none), the memory
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
    host_energy: Number = NA  # the CPUs' and memory's joules by RAPL since the agent began (node_side/host_power.py)
    host_power: Number = NA  # without RAPL: the draw besides the GPUs estimated from `cpu` (NodeSpec.host_watts)
    sleeping: bool = False  # logind said the machine is about to sleep (node_side/sleep_watch.py)

    @property
    def mem_percent(self) -> float | NotAvailable:
        return _percent(self.mem_used, self.mem_total)

    @property
    def has_gpus(self) -> bool:
        return bool(self.gpus)


PCIE_KEYS = tuple(field.name for field in fields(PcieLink))


# --- parsing -------------------------------------------------------------------------------------

def _fail(where: str, expected: str, value: Any) -> StatsParseError:
    return StatsParseError(f"stats line: {where}: expected {expected}, got {value!r}")


def _as_number(value: Any, where: str) -> Number:
    if value is None:
        return NA
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise _fail(where, "a number or null", value)
    return value


def _number(obj: dict[str, Any], key: str, where: str) -> Number:
    return _as_number(obj.get(key), where + key)


def _text(obj: dict[str, Any], key: str, where: str) -> Text:
    value = obj.get(key)
    if value is None:
        return NA
    if not isinstance(value, str):
        raise _fail(where + key, "a string or null", value)
    return value


def _list(obj: dict[str, Any], key: str, where: str) -> list[Any]:
    value = obj.get(key)
    if value is None:
        return []
    if not isinstance(value, list):
        raise _fail(where + key, "a list", value)
    return value


def _object(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise _fail(where, "an object", value)
    return value


def _throttle(obj: dict[str, Any], where: str) -> tuple[str, ...] | None:
    value = obj.get("throttle")
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(name, str) for name in value):
        raise _fail(where + "throttle", "a list of strings or null", value)
    return tuple(value)


def _pcie(value: Any, where: str) -> PcieLink:
    if value is None:
        return PcieLink()
    obj = _object(value, where)
    return PcieLink(**{key: _number(obj, key, where + ".") for key in PCIE_KEYS})


def _xid(value: Any, where: str) -> XidErrors | None:
    if value is None:
        return None
    obj = _object(value, where)
    count = _number(obj, "count", where + ".")
    if count is NA:
        raise _fail(where + ".count", "a number", None)
    return XidErrors(count, _number(obj, "last", where + "."), _number(obj, "last_at", where + "."))


def _owner(value: Any, where: str) -> ProcessOwner | None:
    if value is None:
        return None
    obj = _object(value, where)
    dot = where + "."
    kind = obj.get("kind")
    if kind not in OWNER_KINDS:
        raise _fail(dot + "kind", " or ".join(map(repr, OWNER_KINDS)), kind)
    return ProcessOwner(
        kind, **{key: _text(obj, key, dot) for key in ("user", "run_id", "job", "container", "container_name")},
        **{key: _number(obj, key, dot) for key in ("uid", "index")})


def _process(value: Any, where: str) -> GpuProcess:
    obj = _object(value, where)
    where += "."
    return GpuProcess(_number(obj, "pid", where), _text(obj, "name", where), _number(obj, "mem", where),
                      _owner(obj.get("owner"), where + "owner"))


def _gpu(value: Any, where: str) -> GpuStats:
    obj = _object(value, where)
    dot = where + "."
    numbers = {
        key: _number(obj, key, dot)
        for key in ("index", "util", "mem_used", "mem_total", "mem_reserved", "temp", "power", "power_limit",
                    "sm_clock", "energy", "mem_clock", "sm_clock_max", "mem_clock_max")
    }
    processes = tuple(
        _process(p, f"{dot}processes[{i}]") for i, p in enumerate(_list(obj, "processes", dot))
    )
    return GpuStats(
        name=_text(obj, "name", dot), uuid=_text(obj, "uuid", dot), processes=processes,
        throttle=_throttle(obj, dot), pcie=_pcie(obj.get("pcie"), dot + "pcie"), xid=_xid(obj.get("xid"), dot + "xid"),
        bus_id=_text(obj, "bus_id", dot), **numbers
    )


def _load(obj: dict[str, Any]) -> tuple[Number, Number, Number]:
    values = obj.get("load")
    if values is None:
        return (NA, NA, NA)
    if not isinstance(values, list) or len(values) != 3:
        raise _fail("load", "a list of 3 numbers or null", values)
    one, five, fifteen = (_as_number(v, f"load[{i}]") for i, v in enumerate(values))
    return (one, five, fifteen)


def _header(obj: dict[str, Any]) -> tuple[float, str]:
    if obj.get("v") != PROTOCOL_VERSION:
        raise _fail("v", f"protocol version {PROTOCOL_VERSION}", obj.get("v"))
    timestamp = _number(obj, "t", "")
    if timestamp is NA:
        raise _fail("t", "a unix time", None)
    source = obj.get("source")
    if source not in GPU_SOURCES:
        raise _fail("source", " or ".join(map(repr, GPU_SOURCES)), source)
    return float(timestamp), source


def parse_agent_line(line: str) -> NodeStats:
    """Turn one JSON line from the stats agent into a :class:`NodeStats`; null becomes :data:`NA`.

    Missing optional fields are NA too (an older or newer agent may omit some); a field of the
    wrong type is not guessed at.

    Raises:
        StatsParseError: the line is not JSON, not an object, of another protocol version, or has
            a field of the wrong type; the message names the field (e.g. ``gpus[1].mem_used``).
    """
    try:
        value = json.loads(line)
    except ValueError as exc:
        raise StatsParseError(f"stats line: not JSON ({exc}): {line[:120]!r}") from None
    obj = _object(value, "line")
    timestamp, source = _header(obj)
    errors = _list(obj, "errors", "")
    if not all(isinstance(e, str) for e in errors):
        raise _fail("errors", "a list of strings", errors)
    return NodeStats(
        timestamp=timestamp,
        source=source,
        gpus=tuple(_gpu(g, f"gpus[{i}]") for i, g in enumerate(_list(obj, "gpus", ""))),
        driver=_text(obj, "driver", ""),
        cuda=_text(obj, "cuda", ""),
        cpu=_number(obj, "cpu", ""),
        load=_load(obj),
        mem_used=_number(obj, "mem_used", ""),
        mem_total=_number(obj, "mem_total", ""),
        disk_free=_number(obj, "disk_free", ""),
        errors=tuple(errors),
        host_energy=_number(obj, "host_energy", ""),
        sleeping=obj.get("sleeping") is True,
    )


def describe_gpus(stats: NodeStats | None) -> str:
    """What a node trains on, in words (for doctor and a run's preflight line).

    Returns:
        "2 GPUs: 2× NVIDIA H100 NVL" (names grouped, so eight identical cards stay one line),
        "CPU only", or "GPUs unknown (no stats yet)" for None.
    """
    if stats is None:
        return "GPUs unknown (no stats yet)"
    if not stats.gpus:
        return "CPU only"
    names = Counter(str(gpu.name) for gpu in stats.gpus)
    kinds = ", ".join(f"{count}× {gpu}" for gpu, count in names.items())
    return f"{len(stats.gpus)} GPU{'s' if len(stats.gpus) != 1 else ''}: {kinds}"

"""The stats agent's JSON lines turned into frozen snapshots (events/stats.py's NodeStats), or one error."""

from __future__ import annotations

import json
import math
from collections import Counter
from dataclasses import fields
from typing import Any

from homegpu.remote.events import (
    NA, GpuProcess, GpuStats, NodeStats, Number, PcieLink, ProcessOwner, Text, XidErrors,
)
from homegpu.remote.node_side import GPU_SOURCES, PROTOCOL_VERSION


OWNER_KINDS = ("worker", "container", "process", "unknown")
PCIE_KEYS = tuple(field.name for field in fields(PcieLink))


class StatsParseError(ValueError):
    """A stats line that is not what the agent protocol says; the message names the bad field."""


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
        **{key: _number(obj, key, dot) for key in ("uid", "index", "gpu_memory")})


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
        health_pending=obj.get("health_pending") is True,
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

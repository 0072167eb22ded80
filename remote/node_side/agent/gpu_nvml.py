"""The stats agent's NVML source: GPU stats straight from the driver's library through ``pynvml``.

Standard library only, Python 3.8+: it runs on the nodes with the agent (see ``stats_agent.py``).
``pynvml`` is the node's own or the controller's, shipped as source and compiled here only where
the driver's NVML library loads (``load_pynvml``). The readings go through ``_nvml_call``, so one
a GPU does not have is a ``null``, never a failed sample; a new reading is one more ``call(...)``
in ``_nvml_gpu`` (through ``_once`` where it does not change).
"""

from __future__ import annotations

import sys
import time
import types

if __package__:  # how the node_side modules import each other: see stats_agent.py's docstring
    from . import gpu_health
    from .agent_common import MIB, describe
else:
    import gpu_health
    from agent_common import MIB, describe

STATIC_REFRESH_S = 60.0  # how long NVML names, UUIDs and power limits are kept before asking again
# NVML's documented nvmlClockType_t values, for a pynvml-like module that lacks the constants.
NVML_CLOCK_SM, NVML_CLOCK_MEM = 1, 2
# A direction -> its nvmlPcieUtilCounter_t constant and documented value: what the GPU sends (tx), receives (rx).
PCIE_COUNTERS = {"tx": ("NVML_PCIE_UTIL_TX_BYTES", 0), "rx": ("NVML_PCIE_UTIL_RX_BYTES", 1)}


# --- readings ------------------------------------------------------------------------------------

def _nvml_call(nvml, errors, label, thunk):
    """Call ``thunk``; any failure makes this one value None instead of failing the sample.

    NVMLError is how NVML says "this GPU has no such reading" (power on many GeForce cards,
    utilisation in MIG mode), so it is silent; anything else is unexpected and is reported.
    """
    try:
        return thunk()
    except Exception as exc:  # noqa: BLE001 - one bad field must never stop the stream
        if not isinstance(exc, getattr(nvml, "NVMLError", ())):
            errors.append(f"nvml {label}: {describe(exc)}")
        return None


def _text(value):
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    return value if isinstance(value, str) and value else None


def _scaled(value, divisor, floor=False):
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return None
    return value // divisor if floor else value / divisor


def _proc_name(pid):
    """Fallback process name for when NVML cannot tell it (permissions, older drivers)."""
    try:
        with open(f"/proc/{pid}/comm") as handle:
            return handle.read().strip() or None
    except OSError:
        return None


def _nvml_processes(nvml, handle, call):
    procs = call("processes", lambda: nvml.nvmlDeviceGetComputeRunningProcesses(handle)) or []
    result = []
    for proc in procs:
        pid = getattr(proc, "pid", None)
        name = _text(call("process_name", lambda: nvml.nvmlSystemGetProcessName(pid)))
        mem = _scaled(getattr(proc, "usedGpuMemory", None), MIB, floor=True)
        result.append({"pid": pid, "name": name or _proc_name(pid), "mem": mem})
    return result


def _once(device, key, thunk, again=False):
    """``device[key]``, asking ``thunk`` until it has given a value, or ``again`` (see ``NvmlReader``)."""
    if again or device.get(key) is None:
        device[key] = thunk()
    return device[key]


def _nvml_memory(nvml, handle, call, device):
    """(used, total, reserved) MiB as nvidia-smi shows them; reserved is None where unknown.

    Version 1 of nvmlDeviceGetMemoryInfo counts the driver's reservation as used (480 MiB more
    than nvidia-smi and nvitop on an H100 80GB HBM3: tests/fixtures/gpu/h100-80gb-hbm3/README.md);
    version 2 reports it apart. Version 1 stands in where pynvml or the driver lacks version 2,
    which is remembered in ``device`` once version 1 has worked where version 2 did not.
    """
    version = getattr(nvml, "nvmlMemory_v2", None)
    if version is not None and device.get("memory_v2") is not False:
        try:
            memory = nvml.nvmlDeviceGetMemoryInfo(handle, version=version)
        except Exception:  # noqa: BLE001 - NVMLError_FunctionNotFound, a TypeError from an old pynvml
            memory = None
        if memory is not None:
            device["memory_v2"] = True
            return tuple(_scaled(getattr(memory, key, None), MIB, floor=True)
                         for key in ("used", "total", "reserved"))
    memory = call("memory", lambda: nvml.nvmlDeviceGetMemoryInfo(handle))
    if memory is not None and version is not None and device.get("memory_v2") is None:
        device["memory_v2"] = False
    return (_scaled(getattr(memory, "used", None), MIB, floor=True),
            _scaled(getattr(memory, "total", None), MIB, floor=True), None)


def _ask(call, label, nvml, names, *args):
    """``call`` the first function of ``names`` that pynvml has and the driver answers; None if none.

    A newer name (nvmlDeviceGetCurrentClocksEventReasons) may be in pynvml but not in an older
    driver (NVMLError_FunctionNotFound), where the deprecated one still answers.
    """
    for name in names:
        fn = getattr(nvml, name, None)
        if fn is not None:
            value = call(label, lambda: fn(*args))
            if value is not None:
                return value
    return None


def _link_caps(nvml, handle, call):
    """What the card and its slot can do: maximum clocks and PCIe link. They do not change, so
    ``_nvml_health`` asks for them once (again after ``STATIC_REFRESH_S``, as for names)."""
    sm, mem = getattr(nvml, "NVML_CLOCK_SM", NVML_CLOCK_SM), getattr(nvml, "NVML_CLOCK_MEM", NVML_CLOCK_MEM)
    pci = _ask(call, "pci_info", nvml, ("nvmlDeviceGetPciInfo",), handle)
    bus_id = _text(getattr(pci, "busId", None))
    return {
        "bus_id": bus_id,
        "sm_clock_max": _ask(call, "sm_clock_max", nvml, ("nvmlDeviceGetMaxClockInfo",), handle, sm),
        "mem_clock_max": _ask(call, "mem_clock_max", nvml, ("nvmlDeviceGetMaxClockInfo",), handle, mem),
        "max_gen": _ask(call, "pcie_max_gen", nvml, ("nvmlDeviceGetMaxPcieLinkGeneration",), handle),
        "max_width": _ask(call, "pcie_max_width", nvml, ("nvmlDeviceGetMaxPcieLinkWidth",), handle),
        "gpu_max_gen": _ask(call, "pcie_gpu_max_gen", nvml, ("nvmlDeviceGetGpuMaxPcieLinkGeneration",), handle),
        "gpu_max_width": gpu_health.card_max_width(bus_id),
    }


def _pcie_mbs(nvml, handle, call, direction):
    """MB/s over the PCIe link, ``direction`` "tx" or "rx": nvmlDeviceGetPcieThroughput's KB/s (it measures
    20 ms, so each call takes about as long: only at the health cadence)."""
    name, value = PCIE_COUNTERS[direction]
    counter = getattr(nvml, name, value)
    return _scaled(_ask(call, f"pcie_{direction}", nvml, ("nvmlDeviceGetPcieThroughput",), handle, counter), 1000)


def _nvml_health(nvml, handle, call, device):
    """The GPU's health keys (``gpu_health.py``): what holds it back now, against what it can do."""
    caps = _once(device, "link_caps", lambda: _link_caps(nvml, handle, call))
    mem = getattr(nvml, "NVML_CLOCK_MEM", NVML_CLOCK_MEM)
    reasons = _ask(call, "clocks_event_reasons", nvml, (
        "nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons"), handle)
    return {
        "throttle": gpu_health.throttle_names(reasons),
        "mem_clock": _ask(call, "mem_clock", nvml, ("nvmlDeviceGetClockInfo",), handle, mem),
        "sm_clock_max": caps["sm_clock_max"],
        "mem_clock_max": caps["mem_clock_max"],
        "pcie": {
            "gen": _ask(call, "pcie_gen", nvml, ("nvmlDeviceGetCurrPcieLinkGeneration",), handle),
            "width": _ask(call, "pcie_width", nvml, ("nvmlDeviceGetCurrPcieLinkWidth",), handle),
            **{key: caps[key] for key in ("max_gen", "max_width", "gpu_max_gen", "gpu_max_width")},
            **{f"{direction}_mbs": _pcie_mbs(nvml, handle, call, direction) for direction in PCIE_COUNTERS},
        },
        "bus_id": caps["bus_id"],
    }


def _nvml_gpu(nvml, index, handle, errors, device=None, apps=True, health=True):
    """One GPU's reading. ``device`` holds what does not change between samples (name, UUID, power
    limit, which memory call works) once it is known, and the last process list and health; a
    fresh dict asks for everything. ``apps`` (``health``) False keeps that process list (health)
    instead of asking again."""
    device = {} if device is None else device

    def call(label, thunk):
        return _nvml_call(nvml, errors, f"gpu{index}.{label}", thunk)

    util = call("util", lambda: nvml.nvmlDeviceGetUtilizationRates(handle))
    used, total, reserved = _nvml_memory(nvml, handle, call, device)
    gpu = {
        "index": index,
        "name": _once(device, "name", lambda: _text(call("name", lambda: nvml.nvmlDeviceGetName(handle)))),
        "uuid": _once(device, "uuid", lambda: _text(call("uuid", lambda: nvml.nvmlDeviceGetUUID(handle)))),
        "util": getattr(util, "gpu", None),
        "mem_used": used,
        "mem_total": total,
        "mem_reserved": reserved,
        "temp": call(
            "temp", lambda: nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU)
        ),
        "power": _scaled(call("power", lambda: nvml.nvmlDeviceGetPowerUsage(handle)), 1000.0),
        # joules since the driver loaded (Volta and newer; NVML counts mJ): energy measured, not integrated
        "energy": _scaled(call("energy", lambda: nvml.nvmlDeviceGetTotalEnergyConsumption(handle)), 1000.0),
        "power_limit": _once(device, "power_limit", lambda: _scaled(
            call("power_limit", lambda: nvml.nvmlDeviceGetPowerManagementLimit(handle)), 1000.0)),
        "sm_clock": call(
            "sm_clock", lambda: nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_SM)
        ),
        "processes": list(_once(device, "processes", lambda: _nvml_processes(nvml, handle, call), apps)),
    }
    if health or "health" in device:
        gpu.update(_once(device, "health", lambda: _nvml_health(nvml, handle, call, device), health))
    else:  # not asked yet (NvmlReader's light first read): unknown until it is
        gpu.update(gpu_health.no_health())
    return gpu


def read_nvml(nvml, errors=None, cache=None, apps=True, health=True):
    """Read every GPU through an initialised ``pynvml``-like module ``nvml`` (injectable in tests).

    ``cache`` (a dict the caller keeps between samples, see ``NvmlReader``) holds each GPU's
    handle and unchanging readings, and its last process list and health, which are asked for
    again only when ``apps`` (``health``) is true; it is emptied when the GPU count changes.
    Without it every reading is asked for.
    """
    errors = [] if errors is None else errors
    cache = {} if cache is None else cache
    count = _nvml_call(nvml, errors, "device_count", nvml.nvmlDeviceGetCount) or 0
    if cache.get("count") != count:
        cache.clear()
        cache["count"] = count
    gpus = []
    for index in range(count):
        device = cache.setdefault(index, {})
        handle = _once(device, "handle", lambda: _nvml_call(
            nvml, errors, f"gpu{index}.handle", lambda: nvml.nvmlDeviceGetHandleByIndex(index)))
        if handle is not None:
            gpus.append(_nvml_gpu(nvml, index, handle, errors, device, apps, health))
    return gpus


def read_nvml_versions(nvml, errors=None):
    """Return (driver version, CUDA version) as strings, e.g. ("550.54.14", "12.4")."""
    errors = [] if errors is None else errors
    driver = _text(_nvml_call(nvml, errors, "driver", nvml.nvmlSystemGetDriverVersion))
    cuda = _nvml_call(nvml, errors, "cuda", nvml.nvmlSystemGetCudaDriverVersion)
    if isinstance(cuda, int) and cuda > 0:
        return driver, f"{cuda // 1000}.{cuda % 1000 // 10}"
    return driver, None


class NvmlReader:
    """GPU stats straight from the driver's NVML library through ``pynvml``.

    Names, UUIDs, handles and power limits are asked for once and kept (a power limit read costs
    179 µs on an H100, more than all the changing readings together), then asked for again every
    ``STATIC_REFRESH_S`` so a limit changed with ``nvidia-smi -pl`` shows within a minute. Compute
    processes change slowly and cost a call per GPU and one per process (its name), so as with
    ``SmiReader`` they are asked for on every ``apps_every``-th read only; health (``gpu_health.py``:
    ten calls a GPU, some of them slow on some cards) on every ``health_every``-th. With ``light_first`` (a
    streaming agent) the first read leaves health to the second, as ``gpu_smi.SmiHealth`` does: a node's first
    screen waits for the first line.
    """

    source = "nvml"

    def __init__(self, nvml, clock=time.monotonic, apps_every=1, owners=None, health_every=1, light_first=False):
        nvml.nvmlInit()  # raises when there is no driver: the caller falls back
        self.nvml = nvml
        self.driver, self.cuda = read_nvml_versions(nvml)
        self.clock = clock
        self.cache = {}
        self.cached_at = clock()
        self.apps_every = max(1, apps_every)
        self._reads_since_apps = self.apps_every  # the first read asks
        self.health_every = max(1, health_every)
        self._reads_since_health = self.health_every - 1 if light_first else self.health_every
        self.owners = owners

    def read(self, errors):
        if self.clock() - self.cached_at > STATIC_REFRESH_S:
            self.cache.clear()
            self.cached_at = self.clock()
        apps = self._reads_since_apps >= self.apps_every
        self._reads_since_apps = 1 if apps else self._reads_since_apps + 1
        health = self._reads_since_health >= self.health_every
        self._reads_since_health = 1 if health else self._reads_since_health + 1
        gpus = read_nvml(self.nvml, errors, self.cache, apps, health)
        if apps and self.owners is not None:  # the lists are kept between asks, owners with them
            self.owners.annotate(gpu["processes"] for gpu in gpus)
        return gpus, self.driver, self.cuda


# --- pynvml --------------------------------------------------------------------------------------

def load_pynvml(shipped=b""):
    """Return the ``pynvml`` module, or why there is none (a string for the node's notes).

    ``shipped`` is the controller's pynvml source, passed in by the bundle's bootstrap. It is
    compiled only where the driver's NVML library loads: compiling it costs about 50 ms of CPU,
    which a CPU-only node would spend on every connect for nothing. Without it (the agent run as
    a script) the node's own pynvml is used, if it has one.
    """
    if shipped:
        missing = nvml_library_error()
        if missing:
            return missing
        module = compile_pynvml(shipped)
        if module is not None:
            return module
    try:
        import pynvml
    except Exception:  # noqa: BLE001 - a broken install is the same as a missing one here
        return "pynvml is not importable"
    return pynvml


def nvml_library_error():
    """Why the driver's NVML library does not load here, worded as pynvml would; None if it does.

    Only Linux is checked (pynvml loads ``libnvidia-ml.so.1`` there); elsewhere nvmlInit() decides.
    """
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    try:
        ctypes.CDLL("libnvidia-ml.so.1")
    except OSError as exc:
        return f"NVMLError_LibraryNotFound: {exc}"
    return None


def compile_pynvml(source):
    """Make a ``pynvml`` module from its source; None when this Python cannot run that source."""
    module = sys.modules["pynvml"] = types.ModuleType("pynvml")  # its code looks itself up there
    try:
        exec(compile(source, "pynvml.py", "exec"), module.__dict__)
    except Exception:  # noqa: BLE001 - too new for this Python, say: fall back as without it
        del sys.modules["pynvml"]
        return None
    return module

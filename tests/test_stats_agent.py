"""The stats agent: NVML through an injected fake, nvidia-smi through a replaying stand-in, the
bundle's bootstrap over a real pipe, and how the process ends.

Every GPU value fed in below is a recorded one (tests/fixtures/gpu/README.md says where from).
"""

from __future__ import annotations

import ast
import json
import os
import select
import shlex
import signal
import subprocess
import sys
import time
import zlib
from collections import Counter
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest

from homegpu.remote.events import NA, GpuProcess, NodeStats
from homegpu.remote.node_side import AGENT_MODULES
from homegpu.remote.node_side.agent import gpu_nvml, gpu_smi, host_proc, stats_agent
from homegpu.remote.node_side.agent.gpu_nvml import (
    NvmlReader,
    compile_pynvml,
    load_pynvml,
    nvml_library_error,
    read_nvml,
    read_nvml_versions,
)
from homegpu.remote.node_side.agent.gpu_smi import SmiReader
from homegpu.remote.node_side.agent.host_proc import (
    cpu_percent,
    disk_free_mib,
    parse_loadavg,
    parse_meminfo,
    parse_proc_stat,
)
from homegpu.remote.node_side.agent.smi_parse import LoopIterations, parse_nvidia_smi_gpus
from homegpu.remote.node_side.agent.stats_agent import NoGpuReader, PROTOCOL_VERSION, open_reader
from homegpu.remote.nodes.agent_bundle import (
    BOOTSTRAP,
    agent_command,
    agent_payload,
    pynvml_source,
)
from homegpu.remote.nodes.stats import parse_agent_line
from gpu_replay import FIXTURES, FORMAT, GPU_QUERY, is_loop, replay_calls, write_replay_nvidia_smi
from helpers import wait_for

AGENT = Path(stats_agent.__file__)
OWNERS = AGENT.with_name("process_owners.py")
MODULE_FILES = [AGENT.with_name(f"{name}.py") for name in AGENT_MODULES]  # what the bundle ships with it
MIB = 1024 * 1024
MASKED_UUID = "GPU-00000000-0000-0000-0000-000000000000"


# --- a fake pynvml ---------------------------------------------------------------------------------

class FakeNVMLError(Exception):
    """Stands in for pynvml.NVMLError, which the agent must treat as "no such reading"."""


class FakeNotSupported(FakeNVMLError):
    pass



def recorded_fields(processes) -> tuple[GpuProcess, ...]:
    """The processes as recorded (pid, name, memory): their owners are this machine's, whatever
    process has a recorded pid here (tests/test_process_owners.py maps them onto real ones)."""
    return tuple(replace(process, owner=None) for process in processes)

def device(name, uuid, util, used_mib, total_mib, temp, power_mw, limit_mw, sm, procs=(), energy_mj=None):
    """A fake GPU; without `energy_mj` it has no energy counter reading (NVML: not supported; the recordings
    these come from did not read it)."""
    return {
        "energy": FakeNotSupported("energy counter") if energy_mj is None else energy_mj,
        "name": name, "uuid": uuid,
        "util": util if isinstance(util, BaseException) else SimpleNamespace(gpu=util, memory=0),
        "memory": SimpleNamespace(used=used_mib * MIB, total=total_mib * MIB),
        "temp": temp, "power": power_mw, "limit": limit_mw, "sm": sm,
        "procs": [SimpleNamespace(pid=pid, usedGpuMemory=mib * MIB) for pid, mib in procs],
    }


def _value(value):
    if isinstance(value, BaseException):
        raise value
    return value


# pynvml device function -> (key in the device dict, the extra arguments the agent must pass).
DEVICE_GETTERS = {
    "nvmlDeviceGetName": ("name", ()),
    "nvmlDeviceGetUUID": ("uuid", ()),
    "nvmlDeviceGetUtilizationRates": ("util", ()),
    "nvmlDeviceGetMemoryInfo": ("memory", ()),
    "nvmlDeviceGetTemperature": ("temp", (0,)),  # NVML_TEMPERATURE_GPU
    "nvmlDeviceGetPowerUsage": ("power", ()),
    "nvmlDeviceGetTotalEnergyConsumption": ("energy", ()),
    "nvmlDeviceGetPowerManagementLimit": ("limit", ()),
    "nvmlDeviceGetComputeRunningProcesses": ("procs", ()),
    # health (tests/test_gpu_health.py): a device without the key has no such reading
    "nvmlDeviceGetCurrentClocksEventReasons": ("reasons", ()),
    "nvmlDeviceGetCurrPcieLinkGeneration": ("gen", ()),
    "nvmlDeviceGetCurrPcieLinkWidth": ("width", ()),
    "nvmlDeviceGetMaxPcieLinkGeneration": ("max_gen", ()),
    "nvmlDeviceGetMaxPcieLinkWidth": ("max_width", ()),
    "nvmlDeviceGetGpuMaxPcieLinkGeneration": ("gpu_max_gen", ()),
    "nvmlDeviceGetPciInfo": ("pci", ()),
}
# nvmlDeviceGetPcieThroughput's counter (NVML_PCIE_UTIL_TX_BYTES, _RX_BYTES) -> key in the device dict: KB/s
PCIE_COUNTERS = {0: "pcie_tx", 1: "pcie_rx"}
# (function, NVML_CLOCK_SM or NVML_CLOCK_MEM) -> key in the device dict; counted as "function" for
# the SM clock, "function_mem" for the memory clock.
CLOCK_GETTERS = {
    ("nvmlDeviceGetClockInfo", 1): "sm", ("nvmlDeviceGetClockInfo", 2): "mem_clock",
    ("nvmlDeviceGetMaxClockInfo", 1): "sm_max", ("nvmlDeviceGetMaxClockInfo", 2): "mem_max",
}


class FakeNvml:
    """Just the part of pynvml the agent calls; a value that is an exception is raised instead.

    It has no ``nvmlMemory_v2``, like a pynvml too old for version 2 of the memory info; every
    device call is counted in ``calls`` by function name.
    """

    NVMLError = FakeNVMLError
    NVML_TEMPERATURE_GPU = 0
    NVML_CLOCK_SM = 1
    NVML_CLOCK_MEM = 2
    NVML_PCIE_UTIL_TX_BYTES = 0
    NVML_PCIE_UTIL_RX_BYTES = 1

    def __init__(self, devices, driver, cuda, names=None, init_error=None):
        self.devices, self.driver, self.cuda = devices, driver, cuda
        self.names = names or {}
        self.init_error = init_error
        self.calls = Counter()

    def nvmlInit(self):
        _value(self.init_error)

    def nvmlSystemGetDriverVersion(self):
        return _value(self.driver)

    def nvmlSystemGetCudaDriverVersion(self):
        return _value(self.cuda)

    def nvmlSystemGetProcessName(self, pid):
        return _value(self.names.get(pid, FakeNVMLError("not found")))

    def nvmlDeviceGetCount(self):
        return len(self.devices)

    def nvmlDeviceGetHandleByIndex(self, index):
        self.calls["nvmlDeviceGetHandleByIndex"] += 1
        return self.devices[index]

    def nvmlDeviceGetClockInfo(self, handle, clock):
        return self._clock("nvmlDeviceGetClockInfo", handle, clock)

    def nvmlDeviceGetMaxClockInfo(self, handle, clock):
        return self._clock("nvmlDeviceGetMaxClockInfo", handle, clock)

    def nvmlDeviceGetPcieThroughput(self, handle, counter):
        self.calls["nvmlDeviceGetPcieThroughput"] += 1
        return _value(handle.get(PCIE_COUNTERS[counter], FakeNotSupported("nvmlDeviceGetPcieThroughput")))

    def _clock(self, name, handle, clock):
        self.calls[name + ("_mem" if clock == self.NVML_CLOCK_MEM else "")] += 1
        return _value(handle.get(CLOCK_GETTERS[name, clock], FakeNotSupported(name)))

    def __getattr__(self, name):
        if name not in DEVICE_GETTERS:
            raise AttributeError(name)
        key, expected = DEVICE_GETTERS[name]

        def getter(handle, *args):
            assert args == expected, (name, args)
            self.calls[name] += 1
            return _value(handle.get(key, FakeNotSupported(name)))

        return getter


# H200 idle capture; name as bytes, as older pynvml returns it.
H200 = device(b"NVIDIA H200", MASKED_UUID, 0, 0, 143771, 37, 85120, 700000, 345)
# The two H100 NVL of thamada/nvidia-smi nvsim/H100NVLx2_smi.py.
H100_NVL = [
    device("NVIDIA H100 NVL", "GPU-806f8ea2-6428-1096-a076-bb687fb45fb0", 0, 0, 95830, 32, 61620,
           310000, 345),
    device("NVIDIA H100 NVL", "GPU-db6d02a2-1413-eccf-8a17-d99eac29d365", 0, 0, 95830, 31, 62110,
           310000, 345),
]


def h100_mig():
    """The H100 MIG capture under load: MIG mode has no utilisation reading."""
    return device("NVIDIA H100 80GB HBM3", MASKED_UUID, FakeNotSupported("MIG"), 11125, 81559, 53,
                  433780, 700000, 1980, procs=[(21180, 2296), (21181, 1272), (21198, 7484)])


MIG_NAMES = {21180: "/root/tools/memhog", 21181: "/root/tools/memhog", 21198: "./gpu_burn"}


# A GPU whose health NVML does not report (the recordings these come from did not read it).
NO_HEALTH = {"throttle": None, "mem_clock": None, "sm_clock_max": None, "mem_clock_max": None,
             "pcie": dict.fromkeys(("gen", "width", "max_gen", "max_width", "gpu_max_gen", "gpu_max_width", "tx_mbs",
                                    "rx_mbs")), "bus_id": None}


def gpu_json(index, name, uuid, util, used, total, temp, power, limit, sm, processes=(), reserved=None, energy=None):
    return {
        "index": index, "name": name, "uuid": uuid, "util": util, "mem_used": used,
        "mem_total": total, "mem_reserved": reserved, "temp": temp, "power": power, "energy": energy,
        "power_limit": limit, "sm_clock": sm, "processes": list(processes), **NO_HEALTH,
    }


def test_nvml_one_gpu() -> None:
    errors: list[str] = []
    nvml = FakeNvml([H200], "580.173.02", 13000)
    assert read_nvml(nvml, errors) == [
        gpu_json(0, "NVIDIA H200", MASKED_UUID, 0, 0, 143771, 37, 85.12, 700.0, 345)
    ]
    assert read_nvml_versions(nvml) == ("580.173.02", "13.0")
    assert errors == []


def test_nvml_energy_counter_in_joules() -> None:
    """nvmlDeviceGetTotalEnergyConsumption counts mJ since the driver loaded (NVML's documented unit)."""
    counting = dict(H200, energy=987654321)
    [gpu] = read_nvml(FakeNvml([counting], "580.173.02", 13000))
    assert gpu["energy"] == 987654.321 and parse_agent_line(json.dumps(
        {"v": PROTOCOL_VERSION, "t": 1.0, "source": "nvml", "gpus": [gpu]})).gpus[0].energy == 987654.321


def test_nvml_two_gpus() -> None:
    nvml = FakeNvml(H100_NVL, "550.54.14", 12040)
    assert read_nvml(nvml) == [
        gpu_json(0, "NVIDIA H100 NVL", "GPU-806f8ea2-6428-1096-a076-bb687fb45fb0", 0, 0, 95830, 32,
                 61.62, 310.0, 345),
        gpu_json(1, "NVIDIA H100 NVL", "GPU-db6d02a2-1413-eccf-8a17-d99eac29d365", 0, 0, 95830, 31,
                 62.11, 310.0, 345),
    ]
    assert read_nvml_versions(nvml) == ("550.54.14", "12.4")


def test_nvml_mig_gpu_has_null_util_and_its_processes() -> None:
    errors: list[str] = []
    [gpu] = read_nvml(FakeNvml([h100_mig()], "590.48.01", 13010, MIG_NAMES), errors)
    assert gpu["util"] is None
    assert (gpu["mem_used"], gpu["mem_total"], gpu["power"], gpu["sm_clock"]) == (
        11125, 81559, 433.78, 1980)
    assert gpu["processes"] == [
        {"pid": 21180, "name": "/root/tools/memhog", "mem": 2296},
        {"pid": 21181, "name": "/root/tools/memhog", "mem": 1272},
        {"pid": 21198, "name": "./gpu_burn", "mem": 7484},
    ]
    assert errors == []  # NVMLError means "no such reading", not a fault


# --- the H100 80GB HBM3 recordings: NVML memory as nvidia-smi shows it ----------------------------

H100_DIR = FIXTURES / "h100-80gb-hbm3"
NVML_MEMORY_V2 = 0x02000028  # pynvml.nvmlMemory_v2


def recorded_gpu(name: str) -> dict:
    """The one GPU of a `homegpu --local status --json` recorded on the H100 (NVML source)."""
    [node] = json.loads((H100_DIR / name).read_text())["nodes"]
    [gpu] = node["stats"]["gpus"]
    return gpu


class FakeNvmlV2(FakeNvml):
    """A pynvml and driver that have version 2 of the memory info (``version=nvmlMemory_v2``)."""

    nvmlMemory_v2 = NVML_MEMORY_V2

    def nvmlDeviceGetMemoryInfo(self, handle, version=None):
        self.calls["nvmlDeviceGetMemoryInfo" + ("_v2" if version else "")] += 1
        if version is None:
            return _value(handle["memory"])
        assert version == NVML_MEMORY_V2
        return _value(handle["memory_v2"])


def h100_idle(memory_v2=None):
    """The idle H100 as NVML reported it there, fed from the recorded status line.

    Version 1 memory (used 480 = the driver's reservation) is what the agent's NVML source
    recorded in status_idle.json; version 2 (used 0, reserved 480, total 81559) is what that
    machine's NVML returned for ``version=nvmlMemory_v2`` (the recordings' README), and
    nvidia-smi's ``memory.used,memory.total,memory.reserved`` printed the same.
    """
    gpu = recorded_gpu("status_idle.json")
    handle = device(gpu["name"], gpu["uuid"], gpu["util"], gpu["mem_used"], gpu["mem_total"], gpu["temp"],
                    round(gpu["power"] * 1000), round(gpu["power_limit"] * 1000), gpu["sm_clock"])
    handle["memory_v2"] = memory_v2 if memory_v2 is not None else SimpleNamespace(
        used=0, reserved=480 * MIB, total=81559 * MIB, free=(81559 - 480) * MIB)
    return handle


def test_recorded_h100_nvml_v1_memory_counts_the_reservation() -> None:
    """What the recordings show, before the fix: NVML v1 480 MiB above nvidia-smi, idle and loaded."""
    smi_idle = parse_nvidia_smi_gpus((H100_DIR / "gpus_idle.csv").read_text())[0]
    smi_load = parse_nvidia_smi_gpus((H100_DIR / "gpus_load.csv").read_text())[0]
    assert recorded_gpu("status_idle.json")["mem_used"] - smi_idle["mem_used"] == 480
    nvml_lines = [parse_agent_line(line) for line in (H100_DIR / "agent_nvml.jsonl").read_text().splitlines()]
    smi_lines = [parse_agent_line(line) for line in (H100_DIR / "agent_smi.jsonl").read_text().splitlines()]
    assert {s.gpus[0].mem_used for s in nvml_lines} == {20564}
    assert {s.gpus[0].mem_used for s in smi_lines} == {smi_load["mem_used"]} == {20085}
    assert all(s.gpus[0].mem_reserved is NA for s in nvml_lines + smi_lines)  # recorded before the field


def test_nvml_v2_memory_matches_nvidia_smi_on_the_h100() -> None:
    nvml = FakeNvmlV2([h100_idle()], "580.159.04", 13000)
    errors: list[str] = []
    [gpu] = read_nvml(nvml, errors)
    smi = parse_nvidia_smi_gpus((H100_DIR / "gpus_idle.csv").read_text())[0]
    for key in ("name", "uuid", "util", "mem_used", "mem_total", "power_limit", "sm_clock"):
        assert gpu[key] == smi[key], key
    assert (gpu["mem_used"], gpu["mem_reserved"], gpu["mem_total"]) == (0, 480, 81559)
    assert nvml.calls["nvmlDeviceGetMemoryInfo_v2"] == 1 and nvml.calls["nvmlDeviceGetMemoryInfo"] == 0
    assert errors == []


@pytest.mark.parametrize("why", [FakeNVMLError("Function Not Found"), TypeError("unexpected keyword 'version'")])
def test_nvml_without_v2_falls_back_to_v1_and_remembers(why: Exception) -> None:
    """A driver without nvmlDeviceGetMemoryInfo_v2, or a pynvml whose call takes no version."""
    nvml = FakeNvmlV2([h100_idle(memory_v2=why)], "580.159.04", 13000)
    reader = NvmlReader(nvml)
    for _ in range(3):
        [gpu], _, _ = reader.read([])
        assert (gpu["mem_used"], gpu["mem_reserved"], gpu["mem_total"]) == (480, None, 81559)
    assert nvml.calls["nvmlDeviceGetMemoryInfo_v2"] == 1  # tried once, then v1 only
    assert nvml.calls["nvmlDeviceGetMemoryInfo"] == 3


def test_a_pynvml_without_v2_uses_v1() -> None:
    [gpu] = read_nvml(FakeNvml([h100_idle()], "580.159.04", 13000))
    assert (gpu["mem_used"], gpu["mem_reserved"]) == (480, None)


def test_nvml_reader_asks_for_what_does_not_change_once() -> None:
    """Name, UUID, handle and power limit (179 µs a call on the H100) once, not every sample;
    again after STATIC_REFRESH_S, so a changed power limit shows."""
    now = [1000.0]
    nvml = FakeNvmlV2([h100_idle(), h100_idle()], "580.159.04", 13000)
    reader = NvmlReader(nvml, clock=lambda: now[0])
    lines = [reader.read([])[0] for _ in range(5)]
    assert all(line == lines[0] for line in lines) and lines[0][0]["power_limit"] == 700.0
    for static in ("nvmlDeviceGetName", "nvmlDeviceGetUUID", "nvmlDeviceGetPowerManagementLimit",
                   "nvmlDeviceGetHandleByIndex"):
        assert nvml.calls[static] == 2, static  # two GPUs, once each
    for changing in ("nvmlDeviceGetUtilizationRates", "nvmlDeviceGetMemoryInfo_v2", "nvmlDeviceGetTemperature",
                     "nvmlDeviceGetPowerUsage", "nvmlDeviceGetClockInfo"):
        assert nvml.calls[changing] == 10, changing
    nvml.devices[0]["limit"] = 450000  # nvidia-smi -pl 450
    now[0] += gpu_nvml.STATIC_REFRESH_S + 1
    [first, _], _, _ = reader.read([])
    assert first["power_limit"] == 450.0 and nvml.calls["nvmlDeviceGetPowerManagementLimit"] == 4


def test_nvml_processes_are_asked_for_every_nth_read_and_kept_between() -> None:
    """The process list at its slower cadence, as with nvidia-smi: a call per GPU and one per
    process (its name) on every ``apps_every``-th read; the reads between show the last list."""
    nvml = FakeNvml([h100_mig()], "590.48.01", 13010, names=MIG_NAMES)
    reader = NvmlReader(nvml, apps_every=5)
    lines = [reader.read([])[0] for _ in range(12)]
    assert nvml.calls["nvmlDeviceGetComputeRunningProcesses"] == 3  # reads 1, 6 and 11
    assert nvml.calls["nvmlDeviceGetUtilizationRates"] == 12
    expected = [{"pid": 21180, "name": "/root/tools/memhog", "mem": 2296},
                {"pid": 21181, "name": "/root/tools/memhog", "mem": 1272},
                {"pid": 21198, "name": "./gpu_burn", "mem": 7484}]
    assert all(gpus[0]["processes"] == expected for gpus in lines)
    nvml.devices[0]["procs"] = []  # the jobs ended: the next asking read shows it
    assert [reader.read([])[0][0]["processes"] for _ in range(5)] == [expected] * 3 + [[], []]  # 16 asks


def test_nvml_cache_starts_over_when_the_gpu_count_changes() -> None:
    nvml = FakeNvmlV2([h100_idle(), dict(H100_NVL[0], memory_v2=FakeNVMLError("v2"))], "550.54.14", 12040)
    reader = NvmlReader(nvml)
    assert [g["name"] for g in reader.read([])[0]] == ["NVIDIA H100 80GB HBM3", "NVIDIA H100 NVL"]
    nvml.devices.pop(0)  # a GPU fell off the bus: index 0 is another card now
    [gpu], _, _ = reader.read([])
    assert (gpu["name"], gpu["uuid"]) == ("NVIDIA H100 NVL", H100_NVL[0]["uuid"])


def test_a_failed_static_reading_is_asked_again() -> None:
    flaky = h100_idle()
    flaky["name"] = RuntimeError("driver busy")
    nvml = FakeNvmlV2([flaky], "580.159.04", 13000)
    reader = NvmlReader(nvml)
    errors: list[str] = []
    assert reader.read(errors)[0][0]["name"] is None and errors == ["nvml gpu0.name: RuntimeError: driver busy"]
    flaky["name"] = "NVIDIA H100 80GB HBM3"
    assert reader.read([])[0][0]["name"] == "NVIDIA H100 80GB HBM3"


def test_recorded_loop_output_gives_one_iteration_per_row_with_changing_values() -> None:
    """nvidia-smi --loop-ms=1000 on the H100 under load: 8 iterations, values moving."""
    first, *rest = (H100_DIR / "gpus_loop_load.csv").read_text().splitlines()
    iterations = LoopIterations()
    assert iterations.feed(first + "\n", []) is None  # how many rows make one is not known yet...
    done = [iterations.close()]  # ...until the output goes quiet, a second before the next row
    done += [iterations.feed(line + "\n", []) for line in rest]
    assert len(done) == 8 and all(len(gpus) == 1 for gpus in done)
    assert [gpus[0]["temp"] for gpus in done] == [54, 54, 56, 57, 57, 58, 59, 59]
    assert [gpus[0]["sm_clock"] for gpus in done] == [1395, 1380, 1335, 1335, 1350, 1335, 1380, 1365]


def test_the_agent_on_the_recorded_h100_nvidia_smi(tmp_path: Path) -> None:
    """The agent's nvidia-smi source on the H100's recorded output gives the line it gave there."""
    path = replay_path(tmp_path, "h100-80gb-hbm3/gpus_load.csv", "h100-80gb-hbm3/apps_load.csv",
                       "h100-80gb-hbm3/smi_version.txt")
    stats = run_agent(tmp_path, "--source", "nvidia-smi", path=path)
    recorded = parse_agent_line((H100_DIR / "agent_smi.jsonl").read_text().splitlines()[0])
    assert (stats.source, stats.driver, stats.cuda, stats.errors) == ("nvidia-smi", "580.159.04", "13.0", ())
    [gpu], [then] = stats.gpus, recorded.gpus
    for key in ("index", "name", "uuid", "util", "mem_used", "mem_total", "power_limit"):
        assert getattr(gpu, key) == getattr(then, key), key
    assert (gpu.temp, gpu.power, gpu.sm_clock) == (52, 702.84, 1410)  # gpus_load.csv's moment
    # The recorded pid 468 is the H100 machine's: here the agent looks up whatever has that pid now
    # (tests/test_process_owners.py maps recorded pids onto real processes to check owners).
    assert recorded_fields(gpu.processes) == (GpuProcess(468, "python3", 20076),) == then.processes
    assert gpu.processes[0].owner is not None


@pytest.mark.parametrize("field", ["name", "uuid", "util", "memory", "temp", "power", "limit", "sm"])
def test_nvml_error_on_one_field_nulls_only_that_field(field: str) -> None:
    broken = dict(H100_NVL[1], **{field: FakeNVMLError(field)})
    errors: list[str] = []
    good, bad = read_nvml(FakeNvml([H100_NVL[0], broken], "550.54.14", 12040), errors)
    assert good == read_nvml(FakeNvml(H100_NVL[:1], "550.54.14", 12040))[0]
    nulled = {k for k, v in bad.items() if v is None} - {"mem_reserved"}  # v1 memory only: never known
    expected = {"name": {"name"}, "uuid": {"uuid"}, "util": {"util"},
                "memory": {"mem_used", "mem_total"}, "temp": {"temp"}, "power": {"power"},
                "limit": {"power_limit"}, "sm": {"sm_clock"}}[field]
    assert nulled - {"energy"} - set(NO_HEALTH) == expected  # not read in the recordings: None in both
    assert errors == []


def test_unexpected_failure_in_a_field_is_null_and_reported() -> None:
    broken = dict(H200, temp=RuntimeError("driver went away"))
    errors: list[str] = []
    [gpu] = read_nvml(FakeNvml([broken], "580.173.02", 13000), errors)
    assert gpu["temp"] is None and gpu["power"] == 85.12
    assert errors == ["nvml gpu0.temp: RuntimeError: driver went away"]


def test_process_without_nvml_name_or_memory_falls_back() -> None:
    """NVML may refuse the name (permissions) and report no memory (WDDM): /proc names it."""
    gpu = dict(H200, procs=[SimpleNamespace(pid=os.getpid(), usedGpuMemory=None)])
    [result] = read_nvml(FakeNvml([gpu], "580.173.02", 13000))
    own_name = Path("/proc/self/comm").read_text().strip()
    assert result["processes"] == [{"pid": os.getpid(), "name": own_name, "mem": None}]


def test_nvml_failing_device_count_gives_no_gpus() -> None:
    nvml = FakeNvml([H200], "580.173.02", 13000)
    nvml.nvmlDeviceGetCount = lambda: (_ for _ in ()).throw(FakeNVMLError("count"))
    assert read_nvml(nvml) == []


def test_auto_uses_nvml_when_it_initialises() -> None:
    reader, notes = open_reader("auto", FakeNvml(H100_NVL, "550.54.14", 12040), smi_path=None)
    assert isinstance(reader, NvmlReader) and notes == []
    gpus, driver, cuda = reader.read([])
    assert len(gpus) == 2 and (driver, cuda) == ("550.54.14", "12.4")


def test_nvml_init_failure_falls_back_to_nvidia_smi_then_none(tmp_path: Path) -> None:
    failing = FakeNvml([H200], "x", 0, init_error=FakeNVMLError("NVML Shared Library Not Found"))
    smi = write_replay_nvidia_smi(tmp_path, FIXTURES / "gpus_1x_h200_idle.csv", None)
    reader, notes = open_reader("auto", failing, smi_path=str(smi / "nvidia-smi"))
    assert isinstance(reader, SmiReader)
    assert notes == ["nvml: FakeNVMLError: NVML Shared Library Not Found"]

    reader, notes = open_reader("auto", failing, smi_path=None)
    assert isinstance(reader, NoGpuReader)
    assert notes == ["nvml: FakeNVMLError: NVML Shared Library Not Found",
                     "nvidia-smi: not found on PATH"]


def test_explicit_sources_do_not_fall_back_to_each_other(tmp_path: Path) -> None:
    smi = str(write_replay_nvidia_smi(tmp_path, FIXTURES / "gpus_1x_h200_idle.csv", None) / "nvidia-smi")
    failing = FakeNvml([], "x", 0, init_error=FakeNVMLError("no driver"))
    assert isinstance(open_reader("nvml", failing, smi)[0], NoGpuReader)
    assert isinstance(open_reader("nvidia-smi", None, smi)[0], SmiReader)
    assert open_reader("none", FakeNvml([H200], "d", 1), smi)[0].source == "none"


def test_an_unknown_nvml_reason_is_a_note_and_the_agent_goes_on(tmp_path: Path) -> None:
    smi = str(write_replay_nvidia_smi(tmp_path, FIXTURES / "gpus_1x_h200_idle.csv", None) / "nvidia-smi")
    reader, notes = open_reader("auto", "pynvml is not importable", smi)
    assert isinstance(reader, SmiReader) and notes == ["nvml: pynvml is not importable"]


def test_the_shipped_pynvml_compiles_into_a_module(monkeypatch) -> None:
    monkeypatch.delitem(sys.modules, "pynvml", raising=False)
    module = compile_pynvml(pynvml_source())
    assert callable(module.nvmlInit) and sys.modules["pynvml"] is module
    assert compile_pynvml(b"def broken(:\n") is None


def test_the_shipped_pynvml_is_compiled_only_where_the_nvml_library_loads(monkeypatch) -> None:
    """No GPU driver here: the library check answers first, as on any CPU-only node."""
    monkeypatch.delitem(sys.modules, "pynvml", raising=False)
    missing = nvml_library_error()
    loaded = load_pynvml(pynvml_source())
    if missing is None:  # a machine with the driver
        assert callable(loaded.nvmlInit)
    else:
        assert missing.startswith("NVMLError_LibraryNotFound: libnvidia-ml.so.1")
        assert loaded == missing and "pynvml" not in sys.modules


# --- the real agent against a replaying nvidia-smi -----------------------------------------------

def run_agent(tmp_path: Path, *args: str, path: str | None = None, flags: tuple[str, ...] = (),
              python: str = sys.executable) -> NodeStats:
    """Run the agent script once, as a node would, and parse its one line."""
    env = dict(os.environ, PATH=path if path is not None else os.environ.get("PATH", ""))
    result = subprocess.run(
        [python, *flags, str(AGENT), "--once", "--interval", "0.1", "--work-dir",
         str(tmp_path / "work"), *args],
        capture_output=True, text=True, timeout=60, env=env, stdin=subprocess.DEVNULL,
    )
    assert result.returncode == 0, result.stderr
    [line] = result.stdout.splitlines()
    return parse_agent_line(line)


def replay_path(tmp_path: Path, gpus: str, apps: str | None, version: str | None = None) -> str:
    bin_dir = write_replay_nvidia_smi(
        tmp_path / "bin", FIXTURES / gpus, FIXTURES / apps if apps else None,
        version_fixture=FIXTURES / version if version else None,
    )
    return f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"


def test_nvidia_smi_source_with_mig_gpu_and_processes(tmp_path: Path) -> None:
    path = replay_path(tmp_path, "gpus_1x_h100_mig_load.csv", "apps_1x_h100_mig_load.csv",
                       "version_h100_mig.txt")
    stats = run_agent(tmp_path, "--source", "nvidia-smi", path=path)
    assert (stats.source, stats.driver, stats.cuda, stats.errors) == (
        "nvidia-smi", "590.48.01", "13.1", ())
    [gpu] = stats.gpus
    assert (gpu.name, gpu.util, gpu.mem_used, gpu.power) == (
        "NVIDIA H100 80GB HBM3", NA, 11125, 433.78)
    assert recorded_fields(gpu.processes) == (
        GpuProcess(21180, "/root/tools/memhog", 2296),
        GpuProcess(21181, "/root/tools/memhog", 1272),
        GpuProcess(21198, "./gpu_burn", 7484),
    )


def test_nvidia_smi_source_with_eight_gpus(tmp_path: Path) -> None:
    stats = run_agent(tmp_path, "--source", "nvidia-smi",
                      path=replay_path(tmp_path, "gpus_8x_h100sxm_idle.csv", None))
    assert [g.index for g in stats.gpus] == list(range(8))
    assert len({g.uuid for g in stats.gpus}) == 8
    assert stats.gpus[7].power == 75.09 and stats.gpus[0].processes == ()
    assert stats.driver == "565.57.01" and stats.cuda is NA  # no --version recorded
    assert stats.errors == ()


def test_nvidia_smi_windows_processes_without_memory(tmp_path: Path) -> None:
    stats = run_agent(tmp_path, "--source", "nvidia-smi", path=replay_path(
        tmp_path, "gpus_1x_rtx2080super_windows_load.csv", "apps_1x_rtx2080super_windows_load.csv"))
    [gpu] = stats.gpus
    assert len(gpu.processes) == 12 and all(p.mem is NA for p in gpu.processes)


def test_nvidia_smi_failure_is_an_error_not_a_crash(tmp_path: Path) -> None:
    stats = run_agent(tmp_path, "--source", "nvidia-smi",
                      path=replay_path(tmp_path, "garbage_no_devices.txt", None))
    assert stats.source == "nvidia-smi" and stats.gpus == ()
    assert stats.errors == ("nvidia-smi query-gpu: exit 6: No devices were found",)
    assert stats.mem_total > 0  # the node's own numbers still come


def test_auto_without_pynvml_finds_nvidia_smi_on_path(tmp_path: Path) -> None:
    """``-S``: no site-packages, so no pynvml, as on a bare node."""
    stats = run_agent(tmp_path, path=replay_path(tmp_path, "gpus_2x_h100nvl_idle.csv", None),
                      flags=("-S",))
    assert stats.source == "nvidia-smi" and len(stats.gpus) == 2
    assert stats.errors == ("nvml: pynvml is not importable",)


# --- nvidia-smi loop mode: one long-lived child ---------------------------------------------------

def alive(pid: int) -> bool:
    """Whether ``pid`` runs; a zombie (killed, not yet reaped by whoever adopted it) does not."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


# Runs the agent script (argv[2]) as `python3 stats_agent.py` does, with gpu_smi.FIRST_LOOP_WAIT_S set
# to argv[1] first: the agent imports gpu_smi by its plain name, so it gets this module, already loaded.
FIRST_LOOP_WAIT_RUNNER = """\
import os, runpy, sys
sys.path.insert(0, os.path.dirname(sys.argv[2]))
import gpu_smi
gpu_smi.FIRST_LOOP_WAIT_S = float(sys.argv[1])
sys.argv = sys.argv[2:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


class SmiAgent:
    """A streaming agent (``--source nvidia-smi``) with a replaying nvidia-smi that logs each run.

    ``first_loop_wait`` replaces the agent's FIRST_LOOP_WAIT_S, for a test that must not depend on
    how fast this machine starts the loop child.
    """

    def __init__(self, tmp_path: Path, gpus: str, apps: str | None, *args: str,
                 python: str = sys.executable, first_loop_wait: float | None = None, **replay) -> None:
        self.log = tmp_path / "nvidia-smi-runs.log"
        self.bin = write_replay_nvidia_smi(tmp_path / "bin", FIXTURES / gpus,
                                           FIXTURES / apps if apps else None, log=self.log, **replay)
        env = dict(os.environ, PATH=f"{self.bin}{os.pathsep}{os.environ.get('PATH', '')}")
        runner = [] if first_loop_wait is None else ["-c", FIRST_LOOP_WAIT_RUNNER, f"{first_loop_wait:g}"]
        self.proc = subprocess.Popen(
            [python, *runner, str(AGENT), "--interval", "0.1", "--source", "nvidia-smi", "--work-dir",
             str(tmp_path), *args],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
        )

    def lines(self, count: int) -> list[NodeStats]:
        return read_lines(self.proc, count)

    def runs(self, args: tuple[str, ...] | None = None) -> list[int]:
        """Pids of the nvidia-smi runs so far: loop runs, or those with exactly ``args``."""
        return [pid for pid, run in replay_calls(self.log)
                if (is_loop(run) if args is None else run == args)]

    def lines_until(self, predicate, limit: int = 100) -> list[NodeStats]:
        """Read lines until ``predicate(lines so far)`` holds; fail after ``limit`` lines."""
        seen: list[NodeStats] = []
        while not predicate(seen):
            if len(seen) >= limit:
                pytest.fail(f"still waiting after {limit} lines; nvidia-smi runs: "
                            f"{replay_calls(self.log)}; last errors: {seen[-1].errors}")
            seen += self.lines(1)
        return seen

    def close(self) -> None:
        """Stop the agent, then kill any replay it left running (a failed test must not leak)."""
        stop(self.proc)
        for pid, _ in replay_calls(self.log):
            try:
                if str(self.bin) in Path(f"/proc/{pid}/cmdline").read_text():
                    os.kill(pid, signal.SIGKILL)
            except OSError:
                pass


@pytest.fixture
def smi_agents():
    """Start SmiAgents with ``smi_agents(tmp_path, ...)``; all of them are closed after the test."""
    started: list[SmiAgent] = []

    def start(*args, **kwargs) -> SmiAgent:
        started.append(SmiAgent(*args, **kwargs))
        return started[-1]

    yield start
    for agent in started:
        agent.close()


ONE_SHOT_GPUS = (GPU_QUERY, FORMAT)
MIG_PROCESSES = (
    GpuProcess(21180, "/root/tools/memhog", 2296),
    GpuProcess(21181, "/root/tools/memhog", 1272),
    GpuProcess(21198, "./gpu_burn", 7484),
)


def test_streaming_lines_come_from_one_loop_child(tmp_path: Path, smi_agents) -> None:
    agent = smi_agents(tmp_path, "gpus_1x_h100_mig_load.csv", "apps_1x_h100_mig_load.csv",
                       version_fixture=FIXTURES / "version_h100_mig.txt")
    lines = agent.lines(15)
    for stats in lines:
        [gpu] = stats.gpus
        assert (stats.source, stats.driver, stats.cuda) == ("nvidia-smi", "590.48.01", "13.1")
        assert (gpu.name, gpu.util, gpu.mem_used, gpu.power) == (
            "NVIDIA H100 80GB HBM3", NA, 11125, 433.78)
        assert recorded_fields(gpu.processes) == MIG_PROCESSES
    assert all(stats.errors == () for stats in lines), [s.errors for s in lines]
    [loop_pid] = agent.runs()
    assert alive(loop_pid)
    # The loop starts with the agent; a one-shot query stands in only for lines before its first
    # iteration is in (here lines come every 0.1 s). Without loop mode this would be one per line.
    assert len(agent.runs(ONE_SHOT_GPUS)) <= 2


def test_the_first_line_comes_from_the_loop_started_with_the_agent(tmp_path: Path, smi_agents) -> None:
    """At 1 s a line, the first line and the next come from the loop child started with the agent:
    no one-shot nvidia-smi is started at all (each start loads NVML: the costly part). The first
    line waits for the loop's first iteration as long as it takes here (see
    test_the_first_line_waits_for_the_nvidia_smi_loop_not_the_interval)."""
    agent = smi_agents(tmp_path, "gpus_2x_h100nvl_idle.csv", None, "--interval", "1",
                       first_loop_wait=LONG_INTERVAL)
    lines = [first_line_within(agent.proc, 60), *agent.lines(1)]
    assert all(len(stats.gpus) == 2 and stats.errors == () for stats in lines), lines
    assert len(agent.runs()) == 1 and agent.runs(ONE_SHOT_GPUS) == []


def test_a_node_with_no_devices_gets_no_loop(tmp_path: Path, smi_agents) -> None:
    """The loop started with the agent ends at once; the one-shot query says why, alone. The first
    line waits for that end, however long a loaded machine takes to start the loop child."""
    agent = smi_agents(tmp_path, "garbage_no_devices.txt", None, first_loop_wait=LONG_INTERVAL)
    lines = [first_line_within(agent.proc, 60), *agent.lines(4)]
    assert all(stats.gpus == () and stats.errors == ("nvidia-smi query-gpu: exit 6: No devices were found",)
               for stats in lines), [stats.errors for stats in lines]
    assert len(agent.runs()) == 1 and len(agent.runs(ONE_SHOT_GPUS)) >= 5


def test_compute_processes_are_queried_every_nth_interval(tmp_path: Path, smi_agents) -> None:
    agent = smi_agents(tmp_path, "gpus_1x_h100_mig_load.csv", "apps_1x_h100_mig_load.csv",
                       "--apps-interval", "0.5")  # every 5th line at --interval 0.1
    lines = agent.lines(12)
    agent.proc.stdin.close()
    assert agent.proc.wait(timeout=10) == 0
    lines += [parse_agent_line(line.decode()) for line in agent.proc.stdout]
    queries = len(agent.runs(("--query-compute-apps=gpu_uuid,pid,process_name,used_memory", FORMAT)))
    # Lines 1, 6, 11, ... query; the agent may have queried for a line it did not live to write.
    assert -(-len(lines) // 5) <= queries <= -(-len(lines) // 5) + 1, (len(lines), queries)
    assert all(recorded_fields(stats.gpus[0].processes) == MIG_PROCESSES for stats in lines)


def end_by_stdin_eof(proc: subprocess.Popen[bytes]) -> None:
    proc.stdin.close()


def end_by_sigterm(proc: subprocess.Popen[bytes]) -> None:
    proc.send_signal(signal.SIGTERM)


def end_by_closed_stdout(proc: subprocess.Popen[bytes]) -> None:
    proc.stdout.close()


@pytest.mark.parametrize("end", [end_by_stdin_eof, end_by_sigterm, end_by_closed_stdout])
def test_loop_child_ends_with_the_agent(tmp_path: Path, smi_agents, end) -> None:
    """The replay here survives its stdout closing, so only the agent's kill (or the kernel's
    parent-death signal) can end it."""
    agent = smi_agents(tmp_path, "gpus_2x_h100nvl_idle.csv", None, ignore_closed_stdout=True)
    agent.lines_until(lambda _: agent.runs())
    [loop_pid] = agent.runs()
    assert alive(loop_pid)
    end(agent.proc)
    assert agent.proc.wait(timeout=10) == 0
    wait_for(lambda: not alive(loop_pid), 10, "the nvidia-smi loop child to end with the agent")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux only")
def test_loop_child_dies_even_when_the_agent_is_killed(tmp_path: Path, smi_agents) -> None:
    """SIGKILL runs none of the agent's code; the kernel's parent-death signal ends the child.

    This replay keeps looping when its stdout is gone, so nothing else would end it.
    """
    agent = smi_agents(tmp_path, "gpus_2x_h100nvl_idle.csv", None, ignore_closed_stdout=True)
    agent.lines_until(lambda _: agent.runs())
    [loop_pid] = agent.runs()
    agent.proc.kill()
    agent.proc.wait(timeout=10)
    wait_for(lambda: not alive(loop_pid), 10, "the nvidia-smi loop child to end with the agent")


def test_loop_child_that_dies_is_restarted(tmp_path: Path, smi_agents) -> None:
    agent = smi_agents(tmp_path, "gpus_2x_h100nvl_idle.csv", None)
    lines = agent.lines_until(lambda _: agent.runs())
    [first] = agent.runs()
    os.kill(first, signal.SIGKILL)
    lines += agent.lines_until(lambda _: len(agent.runs()) == 2)
    lines += agent.lines(5)
    assert agent.runs()[0] == first and not alive(first) and alive(agent.runs()[1])
    assert len(agent.runs()) == 2
    errors = [e for stats in lines for e in stats.errors]
    assert errors and all(e.startswith("nvidia-smi loop: exit -9 after") for e in errors), errors
    assert all(len(stats.gpus) == 2 for stats in lines)  # one-shot queries filled the gap


def test_nvidia_smi_without_loop_mode_falls_back_to_one_shot(tmp_path: Path, smi_agents) -> None:
    agent = smi_agents(tmp_path, "gpus_2x_h100nvl_idle.csv", None, loop_mode=False)
    note = "nvidia-smi: --loop-ms does not work here; querying once per interval"
    lines = agent.lines_until(lambda seen: any(note in stats.errors for stats in seen))
    one_shots = len(agent.runs(ONE_SHOT_GPUS))
    lines += agent.lines(5)
    assert len(agent.runs()) == gpu_smi.LOOP_TRIES  # tried, refused, never again
    assert len(agent.runs(ONE_SHOT_GPUS)) >= one_shots + 5  # one query per line now
    assert all(len(stats.gpus) == 2 for stats in lines)
    assert lines[-1].errors == ()


# --- CPU-only nodes and the /proc readers ----------------------------------------------------------

def assert_node_numbers(stats: NodeStats) -> None:
    assert stats.source == "none" and stats.gpus == () and stats.driver is NA
    assert 0 <= stats.cpu <= 100
    assert 0 < stats.mem_used < stats.mem_total
    assert all(load >= 0 for load in stats.load)
    assert stats.disk_free > 0


def test_cpu_only_run_reports_cpu_memory_load_and_disk(tmp_path: Path) -> None:
    stats = run_agent(tmp_path, "--source", "none")
    assert_node_numbers(stats)
    assert stats.errors == ()


def test_cpu_only_auto_says_why_there_are_no_gpus(tmp_path: Path) -> None:
    empty = tmp_path / "empty-path"
    empty.mkdir()
    stats = run_agent(tmp_path, path=str(empty), flags=("-S",))
    assert_node_numbers(stats)
    assert stats.errors == ("nvml: pynvml is not importable", "nvidia-smi: not found on PATH")


def proc(name: str) -> str:
    return (FIXTURES / name).read_text()


def test_proc_parsers_on_recorded_files() -> None:
    before, after = parse_proc_stat(proc("proc_stat_a.txt")), parse_proc_stat(proc("proc_stat_b.txt"))
    assert before == (75301 + 386, 3864 + 1449 + 75301 + 386 + 37 + 7)
    assert cpu_percent(before, after) == 17.5  # 35 busy jiffies of 200
    assert cpu_percent(after, after) is None and cpu_percent(None, after) is None
    assert parse_meminfo(proc("proc_meminfo.txt")) == ((24683656 - 24296032) // 1024, 24683656 // 1024)
    assert parse_loadavg(proc("proc_loadavg.txt")) == [0.12, 0.10, 0.04]
    with pytest.raises(ValueError):
        parse_proc_stat("intr 1 2 3\n")


def test_proc_files_read_again_through_kept_descriptors_show_new_values() -> None:
    """/proc files stay open between samples and are read from offset 0: each read is fresh."""
    first = host_proc.read_cpu([])
    deadline = time.process_time() + 0.05
    while time.process_time() < deadline:  # 5 jiffies of this process's own CPU, at least
        pass
    second = host_proc.read_cpu([])
    assert second[1] > first[1] and host_proc._PROC_FDS.get("/proc/stat") is not None
    errors: list[str] = []
    used, total = host_proc._read_proc("/proc/meminfo", parse_meminfo, errors)
    assert 0 < used < total and errors == []


def test_disk_of_a_work_dir_not_created_yet_is_its_parents(tmp_path: Path) -> None:
    assert disk_free_mib(str(tmp_path / "not" / "yet")) == disk_free_mib(str(tmp_path))


# --- shipping: bootstrap and payload ---------------------------------------------------------------

def split_payload(payload: bytes) -> list[bytes]:
    parts = []
    while payload:
        size, _, payload = payload.partition(b"\n")
        parts.append(payload[: int(size)])
        payload = payload[int(size):]
    return parts


def test_payload_is_pynvml_then_the_module_names_then_each_module_then_the_agent_compressed() -> None:
    import pynvml

    [compressed] = split_payload(agent_payload())
    nvml, names, *modules, agent = split_payload(zlib.decompress(compressed))
    assert nvml == Path(pynvml.__file__).read_bytes()
    assert names.decode().split() == list(AGENT_MODULES)
    assert modules == [path.read_bytes() for path in MODULE_FILES]
    assert OWNERS.read_bytes() in modules
    assert agent == AGENT.read_bytes()
    assert len(agent_payload()) < len(b"".join([nvml, names, *modules, agent])) / 3  # what SSH carries to each node


def imported_modules(source: Path) -> set[str]:
    """The top-level names ``source`` imports (``from .x import y`` gives x, ``from . import x`` nothing)."""
    tree = ast.parse(source.read_text())
    modules = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import)
               for alias in node.names}
    modules |= {node.module.split(".")[0] for node in ast.walk(tree)
                if isinstance(node, ast.ImportFrom) and node.module}
    return modules


@pytest.mark.parametrize("source", [AGENT, *MODULE_FILES], ids=lambda path: path.name)
def test_agent_imports_only_the_standard_library(source: Path) -> None:
    """The agent and each module shipped with it: the standard library, pynvml and each other (by
    their plain names: stats_agent.py's docstring)."""
    modules = imported_modules(source)
    assert modules - {"pynvml"} - set(AGENT_MODULES) <= set(sys.stdlib_module_names), modules


def test_each_module_is_shipped_after_the_modules_it_imports() -> None:
    """The bootstrap runs the modules in AGENT_MODULES' order: one importing a sibling not run yet
    would fail on a node only (run from a checkout, the agent finds its siblings in its folder)."""
    siblings = {path.stem for path in AGENT.parent.glob("*.py")}
    for index, name in enumerate([*AGENT_MODULES, "stats_agent"]):
        imported = imported_modules(AGENT.with_name(f"{name}.py")) & siblings
        assert imported <= set(AGENT_MODULES[:index]), (name, imported)


def test_agent_command_survives_shlex_join() -> None:
    argv = agent_command(python="/usr/bin/python3", interval=0.5, work_dir="~/.homegpu", source="nvml")
    assert argv == ["/usr/bin/python3", "-c", BOOTSTRAP, "--interval", "0.5", "--work-dir",
                    "~/.homegpu", "--source", "nvml"]
    assert shlex.split(shlex.join(argv)) == argv


@pytest.mark.parametrize(("kwargs", "message"), [({"interval": 0}, "interval"),
                                                 ({"source": "rocm"}, "source")])
def test_agent_command_rejects_bad_arguments(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        agent_command(**kwargs)


def start_bundle(argv: list[str]) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    assert proc.stdin is not None
    proc.stdin.write(agent_payload())
    proc.stdin.flush()
    return proc


def read_lines(proc: subprocess.Popen[bytes], count: int) -> list[NodeStats]:
    assert proc.stdout is not None
    lines = [proc.stdout.readline() for _ in range(count)]
    if not all(lines):  # stdout closed: the agent is gone, its stderr says why
        proc.wait(timeout=10)
        pytest.fail(f"agent stopped early: {proc.stderr.read()!r}")
    return [parse_agent_line(line.decode()) for line in lines]


def stop(proc: subprocess.Popen[bytes]) -> None:
    """Make sure no agent outlives its test, whatever the test did to its pipes."""
    if proc.poll() is None:
        proc.kill()
    proc.wait()
    for stream in (proc.stdin, proc.stdout, proc.stderr):
        if stream:
            stream.close()


def test_bundle_streams_until_stdin_closes(tmp_path: Path) -> None:
    proc = start_bundle(agent_command(python=sys.executable, interval=0.2,
                                      work_dir=str(tmp_path), source="none"))
    try:
        first, second = read_lines(proc, 2)
        assert second.timestamp > first.timestamp
        assert_node_numbers(second)
        proc.stdin.close()
        assert proc.wait(timeout=2) == 0  # at once, not after a sample interval
    finally:
        stop(proc)


def test_bundle_brings_its_own_pynvml(tmp_path: Path) -> None:
    """With ``-I -S`` the node has no pynvml of its own; NVML is then reached through the payload
    (where the driver's library loads; here, with no GPU, the note says it does not)."""
    argv = agent_command(python=sys.executable, interval=0.1, work_dir=str(tmp_path), source="nvml")
    argv[1:1] = ["-I", "-S"]
    proc = start_bundle(argv)
    try:
        [stats] = read_lines(proc, 1)
        assert not any("not importable" in e for e in stats.errors), stats.errors
        # No GPU here: NVML itself says so, through the shipped module (a GPU node gets "nvml").
        assert stats.source == "nvml" or any(e.startswith("nvml: NVMLError") for e in stats.errors)
    finally:
        stop(proc)


# --- the first line ---------------------------------------------------------------------------------

LONG_INTERVAL = 600.0  # no line of the tests below may wait for it


def first_line_within(proc: subprocess.Popen[bytes], bound: float) -> NodeStats:
    """The agent's first line, failing if none comes in ``bound`` s (far below LONG_INTERVAL)."""
    assert proc.stdout is not None
    if not select.select([proc.stdout], [], [], bound)[0]:
        pytest.fail(f"no first line in {bound:g} s: it waits for the {LONG_INTERVAL:g} s interval")
    [stats] = read_lines(proc, 1)
    return stats


def lines_within(proc: subprocess.Popen[bytes], count: int, bound: float) -> list[dict]:
    """The agent's first ``count`` lines as JSON, failing if they take over ``bound`` s (far below LONG_INTERVAL).
    Read from the pipe itself: lines that come together would wait in a buffered reader, unseen by select."""
    assert proc.stdout is not None
    fd, data, deadline = proc.stdout.fileno(), b"", time.monotonic() + bound
    while (got := data.count(b"\n")) < count:
        if not select.select([fd], [], [], max(0.0, deadline - time.monotonic()))[0]:
            pytest.fail(f"{got} of {count} lines in {bound:g} s: one waits for the interval")
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            pytest.fail(f"agent stopped early: {proc.stderr.read()!r}")
        data += chunk
    return [json.loads(line) for line in data.decode().splitlines()[:count]]


def test_the_first_line_comes_after_a_short_cpu_window_not_an_interval(tmp_path: Path) -> None:
    """Through the bundle, as the controller starts it: the first line carries every node figure,
    CPU % included (measured over FIRST_WINDOW_S), without waiting for the interval."""
    proc = start_bundle(agent_command(python=sys.executable, interval=LONG_INTERVAL,
                                      work_dir=str(tmp_path), source="none"))
    try:
        stats = first_line_within(proc, 60)
        assert_node_numbers(stats)
        assert stats.errors == ()
        assert proc.poll() is None  # streaming on: the next line is an interval away
    finally:
        stop(proc)


def test_a_node_without_gpus_leaves_nothing_for_later(tmp_path: Path) -> None:
    """No GPU, no health to come: even a light first line does not say any is pending."""
    proc = start_bundle(agent_command(python=sys.executable, interval=0.1, work_dir=str(tmp_path), source="none",
                                      light_first=True))
    try:
        lines = lines_within(proc, 2, 60)
        assert all(line["gpus"] == [] and "health_pending" not in line for line in lines), lines
    finally:
        stop(proc)


def test_the_first_line_waits_for_the_nvidia_smi_loop_not_the_interval(tmp_path: Path, smi_agents) -> None:
    """GPU figures need no interval: the first line takes the loop child's first iteration as soon
    as it is in, with no one-shot nvidia-smi, long before the interval is due.

    The agent waits FIRST_LOOP_WAIT_S (0.35 s) for that iteration before a one-shot stands in; a
    loaded machine can take longer to start the loop child, so here the wait is the interval's
    length: a line within the bound then shows it came with the iteration, not at the wait's end.
    """
    agent = smi_agents(tmp_path, "gpus_2x_h100nvl_idle.csv", None, "--interval", f"{LONG_INTERVAL:g}",
                       first_loop_wait=LONG_INTERVAL)
    stats = first_line_within(agent.proc, 60)
    assert len(stats.gpus) == 2 and stats.errors == () and isinstance(stats.cpu, float), stats
    assert len(agent.runs()) == 1 and agent.runs(ONE_SHOT_GPUS) == []


# --- how the agent ends ----------------------------------------------------------------------------

def start_agent(tmp_path: Path, python: str = sys.executable) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [python, str(AGENT), "--interval", "0.1", "--source", "none", "--work-dir", str(tmp_path)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )


def test_script_exits_on_stdin_eof(tmp_path: Path) -> None:
    proc = start_agent(tmp_path)
    try:
        read_lines(proc, 1)
        proc.stdin.close()
        assert proc.wait(timeout=2) == 0
    finally:
        stop(proc)


def test_sigterm_exits_cleanly(tmp_path: Path) -> None:
    proc = start_agent(tmp_path)
    try:
        read_lines(proc, 1)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=2) == 0
        assert proc.stderr.read() == b""
    finally:
        stop(proc)


def test_closed_stdout_ends_the_agent(tmp_path: Path) -> None:
    """The reader went away but stdin is still open: the next write must end the process."""
    proc = start_agent(tmp_path)
    try:
        read_lines(proc, 1)
        proc.stdout.close()
        assert proc.wait(timeout=2) in (0, -signal.SIGPIPE)
    finally:
        stop(proc)

#!/usr/bin/env python3
"""homegpu stats agent: one JSON line per interval about this node's GPUs, CPU, memory and disk.

It runs on the node, not on the controller, so it is standard library only (Python 3.8+) and imports
nothing from homegpu: the controller ships its source over the SSH session (see
``stats_agent_bundle``), or it can be piped in as ``python3 -``. Every line is::

    {"v":1,"t":...,"source":"nvml"|"nvidia-smi"|"none","gpus":[...],"driver":..,"cuda":..,
     "cpu":..,"load":[1,5,15],"mem_used":..,"mem_total":..,"disk_free":..,"errors":[...]}

with memory in MiB, power in W, clocks in MHz, temperatures in C. A value the node cannot measure
is ``null``; nothing that goes wrong while measuring stops the stream, it lands in ``errors``.

The agent exits when its stdin reaches EOF (the SSH session closed), on SIGTERM/SIGHUP/SIGINT and
when stdout is gone (SIGPIPE), and takes any ``nvidia-smi`` child it is waiting on with it.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time

PROTOCOL_VERSION = 1
SOURCES = ("auto", "nvml", "nvidia-smi", "none")
MIB = 1024 * 1024
SMI_TIMEOUT_S = 10.0
SMI_FORMAT = "--format=csv,noheader,nounits"

# nvidia-smi field -> our key, in query order.
GPU_QUERY = (
    ("index", "index"),
    ("name", "name"),
    ("uuid", "uuid"),
    ("utilization.gpu", "util"),
    ("memory.used", "mem_used"),
    ("memory.total", "mem_total"),
    ("temperature.gpu", "temp"),
    ("power.draw", "power"),
    ("power.limit", "power_limit"),
    ("clocks.sm", "sm_clock"),
    ("driver_version", "driver"),
)
APP_QUERY = (("gpu_uuid", "uuid"), ("pid", "pid"), ("process_name", "name"), ("used_memory", "mem"))
TEXT_KEYS = ("name", "uuid", "driver")

_CHILDREN = set()  # nvidia-smi processes in flight, killed if the agent is told to exit


# --- cell values ---------------------------------------------------------------------------------

def clean(cell):
    """Return a stripped nvidia-smi cell, or None where it says the value is not available.

    nvidia-smi writes every "no value" as a bracketed message ("[N/A]", "[Not Supported]",
    "[Requested functionality has been deprecated]", ...) and, for a few fields, bare "N/A" or an
    empty cell; all of them mean the same thing to us.
    """
    text = cell.strip()
    if not text or text == "N/A" or (text.startswith("[") and text.endswith("]")):
        return None
    return text


def describe(exc):
    """``"NVMLError_NotSupported: Not Supported"``: how a failure reads in the ``errors`` list."""
    return f"{type(exc).__name__}: {exc}"


def number(cell):
    """Parse a cell as int or float; None when it is not available or not a finite number."""
    text = clean(cell) if isinstance(cell, str) else None
    if text is None:
        return None
    try:
        return int(text)
    except ValueError:
        pass
    try:
        value = float(text)
    except ValueError:
        return None
    return value if value == value and value not in (float("inf"), float("-inf")) else None


# --- nvidia-smi ----------------------------------------------------------------------------------

def _rows(csv_text, width, errors):
    """Yield the CSV rows that have ``width`` cells; report every other non-blank line."""
    for row in csv.reader(csv_text.splitlines()):
        if not row or not "".join(row).strip():
            continue
        if len(row) != width:
            if errors is not None:
                errors.append(f"nvidia-smi: unexpected line: {','.join(row)[:200]!r}")
            continue
        yield row


def _typed(row, query):
    return {
        key: (clean(cell) if key in TEXT_KEYS else number(cell))
        for (_, key), cell in zip(query, row)
    }


def parse_nvidia_smi_gpus(csv_text, errors=None):
    """Parse ``--query-gpu`` output (our GPU_QUERY order, csv,noheader,nounits) into GPU dicts.

    Each dict has the GPU keys of the JSON line plus ``driver`` (which the caller lifts to the
    node); lines of the wrong shape (e.g. "No devices were found") are skipped and, if ``errors``
    is a list, described there.
    """
    return [_typed(row, GPU_QUERY) for row in _rows(csv_text, len(GPU_QUERY), errors)]


def parse_nvidia_smi_apps(csv_text, errors=None):
    """Parse ``--query-compute-apps`` output (gpu_uuid,pid,process_name,used_memory) by GPU uuid."""
    apps = {}
    for row in _rows(csv_text, len(APP_QUERY), errors):
        app = _typed(row, APP_QUERY)
        apps.setdefault(app.pop("uuid"), []).append(app)
    return apps


def parse_nvidia_smi_version(text):
    """Return the CUDA version from ``nvidia-smi --version`` output, or None (older drivers)."""
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip().lower() == "cuda version":
            return clean(value)
    return None


def run_command(argv, timeout=SMI_TIMEOUT_S):
    """Run ``argv``; return (exit code, stdout, stderr). The child is tracked so an exit kills it."""
    proc = subprocess.Popen(
        argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    _CHILDREN.add(proc)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise
    finally:
        _CHILDREN.discard(proc)
    return proc.returncode, out.decode("utf-8", "replace"), err.decode("utf-8", "replace")


class SmiReader:
    """GPU stats from the ``nvidia-smi`` CLI, for nodes where NVML cannot be loaded from Python."""

    source = "nvidia-smi"

    def __init__(self, path):
        self.path = path
        code, out, _ = self._run("--version")
        self.cuda = parse_nvidia_smi_version(out) if code == 0 else None

    def _run(self, *args):
        try:
            return run_command([self.path] + list(args))
        except (OSError, subprocess.SubprocessError) as exc:
            return None, "", describe(exc)

    def _query(self, query, fields, errors):
        code, out, err = self._run(query + ",".join(field for field, _ in fields), SMI_FORMAT)
        if code != 0:
            said = (out.strip() or err.strip()).splitlines()[:1]
            errors.append(f"nvidia-smi {query.strip('-=')}: exit {code}: {''.join(said)}")
            return None
        return out

    def read(self, errors):
        """Return (gpus, driver, cuda) for one sample."""
        out = self._query("--query-gpu=", GPU_QUERY, errors)
        gpus = parse_nvidia_smi_gpus(out or "", errors)
        apps = parse_nvidia_smi_apps(
            self._query("--query-compute-apps=", APP_QUERY, errors) or "", errors
        ) if gpus else {}
        drivers = [gpu.pop("driver") for gpu in gpus]
        for gpu in gpus:
            gpu["processes"] = apps.get(gpu["uuid"], [])
        return gpus, next((d for d in drivers if d), None), self.cuda


# --- NVML ----------------------------------------------------------------------------------------

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


def _nvml_gpu(nvml, index, handle, errors):
    def call(label, thunk):
        return _nvml_call(nvml, errors, f"gpu{index}.{label}", thunk)

    util = call("util", lambda: nvml.nvmlDeviceGetUtilizationRates(handle))
    memory = call("memory", lambda: nvml.nvmlDeviceGetMemoryInfo(handle))
    return {
        "index": index,
        "name": _text(call("name", lambda: nvml.nvmlDeviceGetName(handle))),
        "uuid": _text(call("uuid", lambda: nvml.nvmlDeviceGetUUID(handle))),
        "util": getattr(util, "gpu", None),
        "mem_used": _scaled(getattr(memory, "used", None), MIB, floor=True),
        "mem_total": _scaled(getattr(memory, "total", None), MIB, floor=True),
        "temp": call(
            "temp", lambda: nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU)
        ),
        "power": _scaled(call("power", lambda: nvml.nvmlDeviceGetPowerUsage(handle)), 1000.0),
        "power_limit": _scaled(
            call("power_limit", lambda: nvml.nvmlDeviceGetPowerManagementLimit(handle)), 1000.0
        ),
        "sm_clock": call(
            "sm_clock", lambda: nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_SM)
        ),
        "processes": _nvml_processes(nvml, handle, call),
    }


def read_nvml(nvml, errors=None):
    """Read every GPU through an initialised ``pynvml``-like module ``nvml`` (injectable in tests)."""
    errors = [] if errors is None else errors
    count = _nvml_call(nvml, errors, "device_count", nvml.nvmlDeviceGetCount) or 0
    gpus = []
    for index in range(count):
        handle = _nvml_call(
            nvml, errors, f"gpu{index}.handle", lambda: nvml.nvmlDeviceGetHandleByIndex(index)
        )
        if handle is not None:
            gpus.append(_nvml_gpu(nvml, index, handle, errors))
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
    """GPU stats straight from the driver's NVML library through ``pynvml``."""

    source = "nvml"

    def __init__(self, nvml):
        nvml.nvmlInit()  # raises when there is no driver: the caller falls back
        self.nvml = nvml
        self.driver, self.cuda = read_nvml_versions(nvml)

    def read(self, errors):
        return read_nvml(self.nvml, errors), self.driver, self.cuda


class NoGpuReader:
    """A node without a usable GPU still reports CPU, memory and disk (and can still train)."""

    source = "none"

    def read(self, errors):
        return [], None, None


def import_pynvml():
    """Return the ``pynvml`` module, or None; the bundle may have put it in ``sys.modules``."""
    try:
        import pynvml
    except Exception:  # noqa: BLE001 - a broken install is the same as a missing one here
        return None
    return pynvml


def open_reader(source, nvml, smi_path):
    """Pick the GPU reader for ``source``, returning (reader, notes on sources that were skipped).

    ``auto`` tries NVML, then ``nvidia-smi``, then none; an explicit source that cannot work
    gives the "none" reader, so the node still streams its CPU and memory.
    """
    notes = []
    if source in ("auto", "nvml"):
        if nvml is None:
            notes.append("nvml: pynvml is not importable")
        else:
            try:
                return NvmlReader(nvml), notes
            except Exception as exc:  # noqa: BLE001 - NVMLError, OSError, ... all mean "no NVML"
                notes.append(f"nvml: {describe(exc)}")
    if source in ("auto", "nvidia-smi"):
        if smi_path:
            return SmiReader(smi_path), notes
        notes.append("nvidia-smi: not found on PATH")
    return NoGpuReader(), notes


# --- CPU, memory, disk ---------------------------------------------------------------------------

def parse_proc_stat(text):
    """Return (idle, total) jiffies from the aggregate "cpu" line of /proc/stat."""
    for line in text.splitlines():
        fields = line.split()
        if fields and fields[0] == "cpu":
            # user nice system idle iowait irq softirq steal; guest time is already in user/nice.
            values = [int(v) for v in fields[1:9]]
            return values[3] + values[4], sum(values)
    raise ValueError("no aggregate cpu line")


def cpu_percent(before, after):
    """Busy CPU % between two (idle, total) samples; None when no time passed."""
    if before is None or after is None:
        return None
    total = after[1] - before[1]
    if total <= 0:
        return None
    return round(100.0 * (total - (after[0] - before[0])) / total, 1)


def parse_meminfo(text):
    """Return (used, total) MiB from /proc/meminfo; used is what applications cannot reclaim."""
    values = {}
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        if rest.split():
            values[key] = int(rest.split()[0])  # kB
    total, available = values["MemTotal"], values["MemAvailable"]
    return (total - available) // 1024, total // 1024


def parse_loadavg(text):
    """Return the 1, 5 and 15 minute load averages from /proc/loadavg."""
    return [float(v) for v in text.split()[:3]]


def disk_free_mib(path):
    """Free MiB for unprivileged users on the filesystem of ``path``.

    The work directory may not exist yet on a fresh node, so the nearest existing parent stands
    in for it: it is the filesystem the directory will be created on.
    """
    path = os.path.abspath(os.path.expanduser(path))
    while not os.path.exists(path) and os.path.dirname(path) != path:
        path = os.path.dirname(path)
    stat = os.statvfs(path)
    return stat.f_bavail * stat.f_frsize // MIB


def _measure(label, errors, func, *args):
    try:
        return func(*args)
    except (OSError, ValueError, KeyError, IndexError) as exc:
        errors.append(f"{label}: {describe(exc)}")
        return None


def _read_proc(path, parse, errors):
    """Parse one /proc file; a missing or odd one (an old kernel, a sandbox) is an error line."""
    def read():
        with open(path) as handle:
            return parse(handle.read())

    return _measure(path, errors, read)


def read_cpu(errors):
    return _read_proc("/proc/stat", parse_proc_stat, errors)


# --- the stream ----------------------------------------------------------------------------------

def sample(reader, cpu_before, work_dir):
    """Measure once; return (the JSON-ready record, the CPU counters to diff against next time)."""
    errors = []
    gpus, driver, cuda = reader.read(errors)
    cpu_after = read_cpu(errors)
    memory = _read_proc("/proc/meminfo", parse_meminfo, errors)
    record = {
        "v": PROTOCOL_VERSION,
        "t": round(time.time(), 3),
        "source": reader.source,
        "gpus": gpus,
        "driver": driver,
        "cuda": cuda,
        "cpu": cpu_percent(cpu_before, cpu_after),
        "load": _read_proc("/proc/loadavg", parse_loadavg, errors),
        "mem_used": memory[0] if memory else None,
        "mem_total": memory[1] if memory else None,
        "disk_free": _measure("disk", errors, disk_free_mib, work_dir),
    }
    if errors:
        record["errors"] = errors
    return record, cpu_after


def emit(record):
    """Write one line and flush it now: the controller renders each line as it arrives."""
    try:
        sys.stdout.write(json.dumps(record, separators=(",", ":")) + "\n")
        sys.stdout.flush()
    except BrokenPipeError:
        exit_now()


def exit_now(*_):
    """Leave at once, taking any nvidia-smi child along, so nothing outlives the session."""
    for proc in list(_CHILDREN):
        with contextlib.suppress(OSError):
            proc.kill()
    os._exit(0)


def watch_stdin():
    """Exit when stdin reaches EOF: that is how the agent learns its SSH session is gone."""
    def drain():
        stream = sys.stdin.buffer if sys.stdin is not None else None
        try:
            while stream is not None and stream.read(4096):
                pass
        except (OSError, ValueError):
            pass
        exit_now()

    threading.Thread(target=drain, name="stdin-eof", daemon=True).start()


def install_exit_handlers():
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # stdout gone: die quietly on the next write
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(sig, exit_now)


def parse_args(argv):
    parser = argparse.ArgumentParser(description="Stream this node's GPU/CPU/memory stats as JSON.")
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between lines")
    parser.add_argument("--work-dir", default="~/.homegpu", help="directory whose disk is reported")
    parser.add_argument("--once", action="store_true", help="print one line and exit")
    parser.add_argument("--source", choices=SOURCES, default="auto", help="where GPU stats come from")
    args = parser.parse_args(argv)
    if not args.interval > 0:
        parser.error("--interval must be positive")
    return args


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    install_exit_handlers()
    # As ``python3 -`` the script itself was stdin, already at EOF: rely on SIGHUP/SIGPIPE there.
    if not args.once and sys.argv[0] != "-":
        watch_stdin()
    nvml = import_pynvml() if args.source in ("auto", "nvml") else None
    smi = shutil.which("nvidia-smi") if args.source in ("auto", "nvidia-smi") else None
    reader, notes = open_reader(args.source, nvml, smi)
    cpu_before = read_cpu([])
    due = time.monotonic() + args.interval
    while True:
        time.sleep(max(0.0, due - time.monotonic()))
        record, cpu_before = sample(reader, cpu_before, args.work_dir)
        if notes:  # why a GPU source was skipped, said once
            record["errors"] = notes + record.get("errors", [])
            notes = []
        emit(record)
        if args.once:
            return 0
        # Keep the beat; after a sample slower than the interval, do not try to catch up.
        due = max(due + args.interval, time.monotonic())


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""homegpu stats agent: one JSON line per interval about this node's GPUs, CPU, memory and disk.

It runs on the node, not on the controller, so it is standard library only (Python 3.8+) and imports
nothing from homegpu: the controller ships its source over the SSH session (see
``nodes/agent_bundle.py``), or it can be piped in as ``python3 -``. Every line is::

    {"v":1,"t":...,"source":"nvml"|"nvidia-smi"|"none","gpus":[...],"driver":..,"cuda":..,
     "cpu":..,"load":[1,5,15],"mem_used":..,"mem_total":..,"disk_free":..,"errors":[...]}

each GPU with its compute ``processes`` (pid, name, mem and, where ``process_owners.py`` could be
loaded, the ``owner`` it describes), with memory in MiB (``mem_used`` as nvidia-smi shows it:
without the driver's reservation, which the NVML source reports as ``mem_reserved``), power in W,
clocks in MHz, temperatures in C. A value the node cannot measure is ``null``; nothing that goes
wrong while measuring stops the stream, it lands in ``errors``.

The agent exits when its stdin reaches EOF (the SSH session closed), on SIGTERM/SIGHUP/SIGINT and
when stdout is gone (SIGPIPE), and kills its ``nvidia-smi`` children first; on Linux the kernel
also kills the long-lived one (see ``SmiLoop``) if the agent itself is killed.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import csv
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import threading
import time
import types

PROTOCOL_VERSION = 1
GPU_SOURCES = ("nvml", "nvidia-smi", "none")  # what a line's "source" says
SOURCES = ("auto", *GPU_SOURCES)  # what --source takes: "auto" tries them in order
# The controller's pynvml source, put here by the bundle's bootstrap (nodes/agent_bundle.py); else the node's own.
SHIPPED_PYNVML = globals().get("SHIPPED_PYNVML", b"")
# process_owners.py as a module, put in this module's globals by the bundle's bootstrap; run as a
# script or imported, the agent loads it from its own folder (see ``load_process_owners``).
SHIPPED_OWNERS = globals().get("PROCESS_OWNERS")
MIB = 1024 * 1024
SMI_TIMEOUT_S = 10.0
SMI_FORMAT = "--format=csv,noheader,nounits"
APPS_INTERVAL_S = 5.0  # how often compute processes are asked for (both GPU sources)
LOOP_TRIES = 2  # loop children that end without looping before the agent stays with one-shot
RESTART_MIN_S = 1.0  # pause before restarting an ended loop child, doubling up to the max
RESTART_MAX_S = 30.0
STALE_GRACE_S = 1.0  # a loop iteration older than 2 intervals + this is not used
SILENT_MIN_S = 30.0  # a loop child silent for max(this, 10 intervals) is killed and restarted
MAX_PENDING_ERRORS = 20  # loop errors kept for the next line; older ones are dropped
QUIET_MAX_S = 0.2  # silence that ends a loop child's first iteration (less for loops under 0.4 s)
STATIC_REFRESH_S = 60.0  # how long NVML names, UUIDs and power limits are kept before asking again
FIRST_WINDOW_S = 0.15  # the first line's CPU % window: the first screen must not wait an interval
FIRST_LOOP_WAIT_S = 0.35  # how long the first line waits for nvidia-smi's loop before a one-shot

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

_CHILDREN = set()  # nvidia-smi processes running now, killed when the agent exits
_SPAWN_LOCK = threading.Lock()  # makes "start a child and note it" one step for kill_children
_EXITING = threading.Event()  # set by kill_children: no child may start after it


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


# Cells that tell one GPU's row from another's: a row whose index and uuid already appeared in the
# iteration being read belongs to the next one.
_KEY_COLUMNS = tuple(i for i, (_, key) in enumerate(GPU_QUERY) if key in ("index", "uuid"))


def _gpu_key(row):
    return tuple(row[i].strip() for i in _KEY_COLUMNS)


class LoopIterations:
    """Cut the output of ``nvidia-smi --query-gpu ... --loop-ms=N`` into one GPU list per iteration.

    In loop mode nvidia-smi prints every GPU's row again each iteration with nothing in between, so
    where one iteration ends has to be inferred. Two rules do it: an iteration is complete as soon
    as it has as many rows as the previous complete one had (``expected``; no waiting for the next
    iteration in the steady state), and a row whose GPU (index, uuid) is already in the iteration
    starts the next one. The second rule copes with the GPU count changing: a GPU falling off the
    bus (fewer rows, the first GPU's row among them or not) or coming back (more rows) costs one
    iteration's delay, after which ``expected`` is the new count. Lines that are not GPU rows
    (warnings, "No devices were found") are reported and do not count. Before any count is known,
    the output going quiet after some rows ends the first iteration (``close``): nvidia-smi prints
    an iteration's rows together, iterations a loop period apart.
    """

    def __init__(self, expected=None):
        self.expected = expected
        self.rows = []
        self.published = 0  # how many of ``rows`` were already returned as a complete iteration

    def feed(self, line, errors):
        """Take one line; return the GPU dicts of the iteration it completes, else None."""
        complete = None
        for row in _rows(line, len(GPU_QUERY), errors):
            complete = self._add(row) or complete
        return [_typed(row, GPU_QUERY) for row in complete] if complete else None

    def counting(self):
        """Rows of the first iteration are in and how many make one is not known yet."""
        return self.expected is None and bool(self.rows)

    def close(self):
        """The output went quiet after the pending rows: return them as a complete iteration."""
        self.expected = self.published = len(self.rows)
        return [_typed(row, GPU_QUERY) for row in self.rows]

    def _add(self, row):
        complete = None
        if _gpu_key(row) in [_gpu_key(seen) for seen in self.rows]:
            if len(self.rows) != self.published:  # it did not reach ``expected``: it is done now
                complete = self.rows
            self.expected = len(self.rows)
            self.rows, self.published = [], 0
        self.rows.append(row)
        if len(self.rows) == self.expected:
            complete, self.published = list(self.rows), len(self.rows)
        return complete


# Run in front of the long-lived loop child (``python -c`` it, then it execs nvidia-smi in the same
# process): ask the kernel to SIGKILL the child when the agent dies, even by SIGKILL, which no
# handler of ours sees. A ``preexec_fn`` would do the same without the extra interpreter start,
# but it is not safe in a process with threads, and the agent has two.
_DEATH_SIGNAL_SHIM = """\
import os, signal, sys
try:
    import ctypes
    ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL), 0, 0, 0)  # PR_SET_PDEATHSIG
except Exception:
    pass  # no ctypes or no prctl: the agent's own exit handling still kills the child
if os.getppid() != int(sys.argv[1]):
    sys.exit(1)  # the agent died before prctl took effect
signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # Python ignores it, and exec would keep that
try:
    os.execv(sys.argv[2], sys.argv[2:])
except OSError as exc:
    sys.stdout.write("cannot run %s: %s\\n" % (sys.argv[2], exc))
    sys.exit(127)
"""


def with_death_signal(argv):
    """``argv`` wrapped so its process dies with the agent (Linux; elsewhere ``argv`` as it is)."""
    if not sys.platform.startswith("linux") or not sys.executable:
        return list(argv)
    return [sys.executable, "-I", "-S", "-c", _DEATH_SIGNAL_SHIM, str(os.getpid())] + list(argv)


class SmiLoop:
    """One long-lived ``nvidia-smi --loop-ms`` child, read line by line on a thread of its own.

    Starting nvidia-smi costs far more CPU than one of its queries (it loads and initialises NVML
    each time), so the agent keeps one running and takes the newest complete iteration from it at
    each interval. A child that ends (killed, the driver reloaded) is started again after a pause
    that doubles up to ``RESTART_MAX_S`` and goes back to ``RESTART_MIN_S`` once a child loops.
    The thread sets ``latest``, ``runs``, ``looped``, ``proc`` and ``last_output`` and appends to
    ``errors``; the agent's main thread only reads them (and drains ``errors``, a deque, which is
    safe across threads).
    """

    def __init__(self, path, loop_ms, expected=None):
        self.argv = [path, _query_arg("--query-gpu=", GPU_QUERY), SMI_FORMAT, f"--loop-ms={loop_ms}"]
        self.quiet = min(QUIET_MAX_S, loop_ms / 2000.0)
        self.iterations = LoopIterations(expected)
        self.latest = None  # (time.monotonic(), [gpu dicts]) of the newest complete iteration
        self.errors = collections.deque(maxlen=MAX_PENDING_ERRORS)
        self.runs = 0  # children that have ended
        self.looped = False  # some child printed two iterations or more: loop mode works here
        self.proc = None
        self.last_output = time.monotonic()
        self.settled = threading.Event()  # set at the first complete iteration or the first child's end
        self._stop = threading.Event()
        threading.Thread(target=self._run, name="nvidia-smi-loop", daemon=True).start()

    def fresh(self, max_age):
        """The newest complete iteration, if it is at most ``max_age`` seconds old; else None."""
        latest = self.latest
        if latest is None or time.monotonic() - latest[0] > max_age:
            return None
        return [dict(gpu) for gpu in latest[1]]

    def drain_errors(self):
        """What went wrong in the child since the last call, oldest first."""
        drained = []
        while self.errors:
            drained.append(self.errors.popleft())
        return drained

    def kill_if_silent(self, limit):
        """Kill a child that printed nothing for ``limit`` s (hung in the driver); it is restarted."""
        proc = self.proc
        if proc is not None and proc.returncode is None and time.monotonic() - self.last_output > limit:
            self.errors.append(f"nvidia-smi loop: silent for {limit:g} s, restarting it")
            self.last_output = time.monotonic()  # one kill per silence, not one per interval
            with contextlib.suppress(OSError):
                proc.kill()

    def stop(self):
        """End the thread and the child; either may be starting the child just now, so both look."""
        self._stop.set()
        proc = self.proc
        if proc is not None:
            with contextlib.suppress(OSError):
                proc.kill()

    def _run(self):
        pause = RESTART_MIN_S
        while not self._stop.is_set():
            code, completed = self._run_child()
            self.runs += 1
            self.settled.set()
            if completed >= 2:
                pause = RESTART_MIN_S
            if self._stop.is_set():
                break
            self.errors.append(
                f"nvidia-smi loop: exit {code} after {completed} samples, restarting in {pause:g} s"
            )
            if self._stop.wait(pause):
                break
            pause = min(2 * pause, RESTART_MAX_S)

    def _run_child(self):
        """Start one child and read it to its end; return (exit code, iterations it completed)."""
        try:
            proc = spawn(with_death_signal(self.argv), stdin=subprocess.DEVNULL,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        except (OSError, subprocess.SubprocessError) as exc:
            return describe(exc), 0
        self.proc, self.last_output = proc, time.monotonic()
        if self._stop.is_set():  # stop() ran while it was starting and could not see it
            proc.kill()
        completed = 0
        try:
            for line in self._lines(proc.stdout.fileno()):
                if line is None:
                    gpus = self.iterations.close()
                else:
                    self.last_output = time.monotonic()
                    gpus = self.iterations.feed(line, self.errors)
                if gpus is not None:
                    self.latest = (time.monotonic(), gpus)
                    self.settled.set()
                    completed += 1
                    self.looped = self.looped or completed >= 2
        finally:
            proc.stdout.close()
            code = proc.wait()
            forget(proc)
        return code, completed

    def _lines(self, fd):
        """The child's output lines, read straight from its pipe so that silence can be seen:
        None stands for ``quiet`` seconds without output while a first iteration is pending."""
        pending = b""
        while True:
            if self.iterations.counting() and not select.select([fd], [], [], self.quiet)[0]:
                yield None
                continue
            chunk = os.read(fd, 65536)
            if not chunk:
                if pending:
                    yield pending.decode("utf-8", "replace")
                return
            *lines, pending = (pending + chunk).split(b"\n")
            for line in lines:
                yield line.decode("utf-8", "replace") + "\n"


def spawn(argv, **popen_args):
    """Start a child that ``kill_children`` will find; refused once the agent is exiting."""
    with _SPAWN_LOCK:
        if _EXITING.is_set():
            raise OSError("the agent is exiting")
        proc = subprocess.Popen(argv, **popen_args)
        _CHILDREN.add(proc)
    return proc


def forget(proc):
    _CHILDREN.discard(proc)


def kill_children():
    """Kill and reap every child, and let no new one start: nothing may outlive the agent.

    Reaping matters on nodes whose init does not reap orphans (containers): a killed child we did
    not wait for would stay in the process table. The lock is only waited for briefly because this
    also runs from signal handlers, which may interrupt a thread that holds it.
    """
    locked = _SPAWN_LOCK.acquire(timeout=1.0)
    try:
        _EXITING.set()
        procs = list(_CHILDREN)
    finally:
        if locked:
            _SPAWN_LOCK.release()
    for proc in procs:
        with contextlib.suppress(OSError):
            proc.kill()
    for proc in procs:
        with contextlib.suppress(Exception):
            proc.wait(timeout=1.0)


def run_command(argv, timeout=SMI_TIMEOUT_S):
    """Run ``argv``; return (exit code, stdout, stderr). The child is tracked so an exit kills it."""
    proc = spawn(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise
    finally:
        forget(proc)
    return proc.returncode, out.decode("utf-8", "replace"), err.decode("utf-8", "replace")


def _query_arg(query, fields):
    return query + ",".join(field for field, _ in fields)


class SmiReader:
    """GPU stats from the ``nvidia-smi`` CLI, for nodes where NVML cannot be loaded from Python.

    With an ``interval`` (a streaming agent) GPU rows come from one ``SmiLoop`` child, started with
    the reader; the first read waits for its first iteration (or its end) up to ``FIRST_LOOP_WAIT_S``
    after the start, so the first line needs no one-shot query. Whenever the loop
    has no iteration younger than two intervals (starting up, restarting, hung) a one-shot query
    stands in, so a line never lacks GPUs that nvidia-smi can report; when that query finds no GPU
    before the loop ever had an iteration, the loop is dropped until one shows GPUs again. If the
    loop child keeps ending without ever looping (an nvidia-smi without ``--loop-ms``) the reader
    stays with one-shot queries. Without an ``interval`` (``--once``) every read is one-shot.
    Compute processes change slowly and cost a fork each, so they are asked for on every
    ``apps_every``-th read only.
    """

    source = "nvidia-smi"

    def __init__(self, path, interval=None, apps_every=1, owners=None):
        self.path = path
        self.owners = owners
        self.loop_ms = max(1, int(round(interval * 1000))) if interval else None
        self.max_age = 2 * interval + STALE_GRACE_S if interval else 0.0
        self.silent_limit = max(SILENT_MIN_S, 10 * interval) if interval else 0.0
        self.apps_every = max(1, apps_every)
        self.loop = None
        self.loop_failed = False
        self._apps = None
        self._reads_since_apps = 0
        code, out, _ = self._run("--version")
        self.cuda = parse_nvidia_smi_version(out) if code == 0 else None
        self.first_deadline = time.monotonic() + FIRST_LOOP_WAIT_S
        if self.loop_ms:  # started now, its first iteration is in by the first read: no one-shot then
            self.loop = SmiLoop(path, self.loop_ms)

    def _run(self, *args):
        try:
            return run_command([self.path] + list(args))
        except (OSError, subprocess.SubprocessError) as exc:
            return None, "", describe(exc)

    def _query(self, query, fields, errors):
        code, out, err = self._run(_query_arg(query, fields), SMI_FORMAT)
        if code != 0:
            said = (out.strip() or err.strip()).splitlines()[:1]
            errors.append(f"nvidia-smi {query.strip('-=')}: exit {code}: {''.join(said)}")
            return None
        return out

    def read(self, errors):
        """Return (gpus, driver, cuda) for one sample."""
        gpus = self._gpus(errors)
        apps = self._processes(errors) if gpus else {}
        drivers = [gpu.pop("driver") for gpu in gpus]
        for gpu in gpus:
            gpu["processes"] = apps.get(gpu["uuid"], [])
        return gpus, next((d for d in drivers if d), None), self.cuda

    def _gpus(self, errors):
        """The loop's newest iteration when it is fresh; otherwise a one-shot query, now."""
        if self.loop is not None and self.loop.latest is None:
            self.loop.settled.wait(max(0.0, self.first_deadline - time.monotonic()))
        gpus = self.loop.fresh(self.max_age) if self.loop is not None else None
        if gpus is None:
            gpus = parse_nvidia_smi_gpus(self._query("--query-gpu=", GPU_QUERY, errors) or "", errors)
            if not gpus and self.loop is not None and self.loop.latest is None:
                self.loop.stop()  # nothing to loop over (no devices, no driver): the one-shot said why
                self.loop = None
            elif gpus and self.loop_ms and self.loop is None and not self.loop_failed:
                self.loop = SmiLoop(self.path, self.loop_ms, expected=len(gpus))
        if self.loop is not None:
            self._tend_loop(errors)
        return gpus

    def _tend_loop(self, errors):
        """Pass on the loop's errors, unstick a silent child, give up on a loop that never looped."""
        errors.extend(self.loop.drain_errors())
        self.loop.kill_if_silent(self.silent_limit)
        if self.loop.runs >= LOOP_TRIES and not self.loop.looped:
            self.loop.stop()
            self.loop, self.loop_failed = None, True
            errors.append("nvidia-smi: --loop-ms does not work here; querying once per interval")

    def _processes(self, errors):
        """Compute processes by GPU uuid, queried on every ``apps_every``-th call, else the last."""
        if self._apps is None or self._reads_since_apps >= self.apps_every:
            out = self._query("--query-compute-apps=", APP_QUERY, errors)
            self._apps = parse_nvidia_smi_apps(out or "", errors)
            if self.owners is not None:  # once per new pid, on this slower cadence only
                self.owners.annotate(self._apps.values())
            self._reads_since_apps = 0
        self._reads_since_apps += 1
        return self._apps


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


def _nvml_gpu(nvml, index, handle, errors, device=None, apps=True):
    """One GPU's reading. ``device`` holds what does not change between samples (name, UUID, power
    limit, which memory call works) once it is known, and the last process list; a fresh dict asks
    for everything. ``apps`` False keeps that process list instead of asking again."""
    device = {} if device is None else device

    def call(label, thunk):
        return _nvml_call(nvml, errors, f"gpu{index}.{label}", thunk)

    util = call("util", lambda: nvml.nvmlDeviceGetUtilizationRates(handle))
    used, total, reserved = _nvml_memory(nvml, handle, call, device)
    return {
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
        "power_limit": _once(device, "power_limit", lambda: _scaled(
            call("power_limit", lambda: nvml.nvmlDeviceGetPowerManagementLimit(handle)), 1000.0)),
        "sm_clock": call(
            "sm_clock", lambda: nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_SM)
        ),
        "processes": list(_once(device, "processes", lambda: _nvml_processes(nvml, handle, call), apps)),
    }


def read_nvml(nvml, errors=None, cache=None, apps=True):
    """Read every GPU through an initialised ``pynvml``-like module ``nvml`` (injectable in tests).

    ``cache`` (a dict the caller keeps between samples, see ``NvmlReader``) holds each GPU's
    handle and unchanging readings, and its last process list, which is asked for again only
    when ``apps`` is true; it is emptied when the GPU count changes. Without it every reading is
    asked for.
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
            gpus.append(_nvml_gpu(nvml, index, handle, errors, device, apps))
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
    ``SmiReader`` they are asked for on every ``apps_every``-th read only.
    """

    source = "nvml"

    def __init__(self, nvml, clock=time.monotonic, apps_every=1, owners=None):
        nvml.nvmlInit()  # raises when there is no driver: the caller falls back
        self.nvml = nvml
        self.driver, self.cuda = read_nvml_versions(nvml)
        self.clock = clock
        self.cache = {}
        self.cached_at = clock()
        self.apps_every = max(1, apps_every)
        self._reads_since_apps = self.apps_every  # the first read asks
        self.owners = owners

    def read(self, errors):
        if self.clock() - self.cached_at > STATIC_REFRESH_S:
            self.cache.clear()
            self.cached_at = self.clock()
        apps = self._reads_since_apps >= self.apps_every
        self._reads_since_apps = 1 if apps else self._reads_since_apps + 1
        gpus = read_nvml(self.nvml, errors, self.cache, apps)
        if apps and self.owners is not None:  # the lists are kept between asks, owners with them
            self.owners.annotate(gpu["processes"] for gpu in gpus)
        return gpus, self.driver, self.cuda


class NoGpuReader:
    """A node without a usable GPU still reports CPU, memory and disk (and can still train)."""

    source = "none"

    def read(self, errors):
        return [], None, None


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


def open_reader(source, nvml, smi_path, interval=None, apps_every=1, owners=None):
    """Pick the GPU reader for ``source``, returning (reader, notes on sources that were skipped).

    ``auto`` tries NVML, then ``nvidia-smi``, then none; an explicit source that cannot work
    gives the "none" reader, so the node still streams its CPU and memory. ``interval`` (None for
    an agent that samples once) is passed on to ``SmiReader``, ``apps_every`` and ``owners`` (a
    ``process_owners.ProcessOwners``, or None to leave processes without owners) to both readers.
    ``nvml`` is a pynvml-like module or why there is none (see ``load_pynvml``).
    """
    notes = []
    if source in ("auto", "nvml"):
        if isinstance(nvml, str):
            notes.append(f"nvml: {nvml}")
        else:
            try:
                return NvmlReader(nvml, apps_every=apps_every, owners=owners), notes
            except Exception as exc:  # noqa: BLE001 - NVMLError, OSError, ... all mean "no NVML"
                notes.append(f"nvml: {describe(exc)}")
    if source in ("auto", "nvidia-smi"):
        if smi_path:
            return SmiReader(smi_path, interval, apps_every, owners), notes
        notes.append("nvidia-smi: not found on PATH")
    return NoGpuReader(), notes


def load_process_owners(shipped=SHIPPED_OWNERS):
    """The ``process_owners`` module (who owns each GPU process); None where it cannot be had.

    The bundle ships it; an agent run as a script or imported finds it next to its own file.
    """
    if shipped is not None:
        return shipped
    here = globals().get("__file__")
    if not here:
        return None
    import importlib.util

    path = os.path.join(os.path.dirname(os.path.abspath(here)), "process_owners.py")
    try:
        spec = importlib.util.spec_from_file_location("process_owners", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    except (OSError, ImportError, SyntaxError):
        return None
    return module


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
        if key in ("MemTotal", "MemAvailable"):
            values[key] = int(rest.split()[0])  # kB
            if len(values) == 2:
                break
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


# What is read of each /proc file: the leading lines hold every figure used (the aggregate "cpu"
# line; MemTotal and MemAvailable), and the rest of /proc/stat is a line per core and more.
PROC_READ_BYTES = {"/proc/stat": 1024, "/proc/meminfo": 1024, "/proc/loadavg": 256}
_PROC_FDS = {}  # path -> descriptor kept open between samples


def _proc_text(path):
    """The start of ``path``, read again from offset 0 through a descriptor kept open: a /proc file
    is regenerated at each read from its start, and opening, wrapping and closing it each sample
    cost more than the read (about 2.5x on /proc/meminfo)."""
    fd = _PROC_FDS.get(path)
    if fd is None:
        fd = _PROC_FDS[path] = os.open(path, os.O_RDONLY)
    try:
        return os.pread(fd, PROC_READ_BYTES[path], 0).decode("ascii", "replace")
    except OSError:
        del _PROC_FDS[path]
        os.close(fd)
        raise


def _read_proc(path, parse, errors):
    """Parse one /proc file; a missing or odd one (an old kernel, a sandbox) is an error line."""
    return _measure(path, errors, lambda: parse(_proc_text(path)))


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
    """Write one line and flush it now: the controller renders each line as it arrives.

    Once another thread has begun the exit, the line is dropped: it may hold "the agent is
    exiting" refusals of queries that are not errors of the node.
    """
    if _EXITING.is_set():
        return
    try:
        sys.stdout.write(json.dumps(record, separators=(",", ":")) + "\n")
        sys.stdout.flush()
    except BrokenPipeError:
        exit_now()


def exit_now(*_):
    """Leave at once, taking any nvidia-smi child along, so nothing outlives the session."""
    kill_children()
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
    """Exit through ``exit_now`` on every way the session can end, so children die with us.

    SIGPIPE (stdout gone) included: left at its default it would end the agent without running
    any of our code, and the loop child would live on until its next write.
    """
    for sig in (signal.SIGPIPE, signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(sig, exit_now)


def parse_args(argv):
    parser = argparse.ArgumentParser(description="Stream this node's GPU/CPU/memory stats as JSON.")
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between lines")
    parser.add_argument("--work-dir", default="~/.homegpu", help="directory whose disk is reported")
    parser.add_argument("--once", action="store_true", help="print one line and exit")
    parser.add_argument("--source", choices=SOURCES, default="auto", help="where GPU stats come from")
    parser.add_argument("--apps-interval", type=float, default=APPS_INTERVAL_S,
                        help="seconds between compute process queries (NVML or nvidia-smi)")
    args = parser.parse_args(argv)
    if not args.interval > 0:
        parser.error("--interval must be positive")
    if not args.apps_interval > 0:
        parser.error("--apps-interval must be positive")
    return args


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    install_exit_handlers()
    try:
        return stream(args)
    finally:
        kill_children()


def stream(args):
    """Print a line per interval (one line with ``--once``) until told to exit.

    The first line comes ``FIRST_WINDOW_S`` after the start, its CPU % measured over that short
    window, so a node's first screen waits neither a whole interval nor for a second sample.
    """
    # As ``python3 -`` the script itself was stdin, already at EOF: rely on SIGHUP/SIGPIPE there.
    if not args.once and sys.argv[0] != "-":
        watch_stdin()
    nvml = load_pynvml(SHIPPED_PYNVML) if args.source in ("auto", "nvml") else None
    smi = shutil.which("nvidia-smi") if args.source in ("auto", "nvidia-smi") else None
    apps_every = max(1, int(round(args.apps_interval / args.interval)))
    owners_module = load_process_owners()
    owners = owners_module.ProcessOwners() if owners_module is not None else None
    reader, notes = open_reader(args.source, nvml, smi, interval=None if args.once else args.interval,
                                apps_every=apps_every, owners=owners)
    cpu_before = read_cpu([])
    # The first line comes after a short CPU window, the next ones on the interval's beat from it.
    due = time.monotonic() + min(args.interval, FIRST_WINDOW_S)
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

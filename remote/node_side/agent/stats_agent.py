#!/usr/bin/env python3
"""homegpu stats agent: one JSON line per interval about this node's GPUs, CPU, memory and disk.

It runs on the node, not on the controller, so it is standard library only (Python 3.8+) and imports
nothing from homegpu: the controller ships its source and its modules' over the SSH session (see
``nodes/agent_bundle.py``), or it runs as a script from its folder. Every line is::

    {"v":1,"t":...,"source":"nvml"|"nvidia-smi"|"none","gpus":[...],"driver":..,"cuda":..,
     "cpu":..,"load":[1,5,15],"mem_used":..,"mem_total":..,"disk_free":..,"host_energy":..,"errors":[...]}

each GPU with its compute ``processes`` (pid, name, mem and, where ``process_owners.py`` could be
loaded, the ``owner`` it describes), with memory in MiB (``mem_used`` as nvidia-smi shows it:
without the driver's reservation, which the NVML source reports as ``mem_reserved``), power in W,
clocks in MHz, temperatures in C, ``host_energy`` the CPUs' and memory's joules by RAPL since the agent
began (``host_power.py``). A value the node cannot measure is ``null``; nothing that goes
wrong while measuring stops the stream, it lands in ``errors``.

Each GPU also carries its health, read every ``HEALTH_INTERVAL_S`` (some of its NVML calls are slow; with
``--light-first`` from the second line on: the first, which a node's first screen waits for, has them null and
says so, ``health_pending`` below) and repeated on the lines between: ``throttle`` (the active clock event reasons
by name, see ``gpu_health.THROTTLE_REASONS``), ``mem_clock``, ``sm_clock_max``, ``mem_clock_max``, ``pcie``
(``{"gen","width","max_gen","max_width","gpu_max_gen","gpu_max_width","tx_mbs","rx_mbs"}``) and
``bus_id``; ``gpu_health.py`` says what each means. At the same cadence ``gpu_xid.py`` reads the kernel
log for both sources and gives each GPU ``xid`` (``{"count","last","last_at"}``: the XIDs the driver
logged for it since boot). They are optional keys of protocol version 1: a
controller that predates them ignores them (``nodes/stats.py`` reads the keys it knows), and one that knows
them reads their absence from an older agent as "not available". So is ``"sleeping": true``, on a line written
at once when logind says the machine is about to sleep (``sleep_watch.py``), and on every line until it says it
woke; and ``"health_pending": true``, on the first line of an agent started with ``--light-first`` where it has
GPUs: their health and XIDs are left to the next line, an interval later. A screen that keeps updating (the TUI,
serve, ``status --watch``) asks for it; a one-shot reader (``homegpu status``) does not, and waits for no second
line.

The agent exits when its stdin reaches EOF (the SSH session closed), on SIGTERM/SIGHUP/SIGINT and
when stdout is gone (SIGPIPE), and kills its ``nvidia-smi`` children first; on Linux the kernel
also kills the long-lived one (see ``gpu_smi.SmiLoop``) if the agent itself is killed.

This file is the stream and its wiring; what it measures is in modules of their own (``MODULES``):
``gpu_nvml`` (NVML), ``smi_parse`` and ``gpu_smi`` (nvidia-smi), ``gpu_health`` (both sources'
health keys), ``gpu_xid`` (XIDs from the kernel log), ``host_proc`` (CPU, memory, load, disk),
``host_power`` (RAPL), ``sleep_watch`` (logind's word that the machine is about to sleep), ``agent_common``
(what they share), ``children`` (every child it starts, killed as it exits) and ``process_owners`` (who
owns a GPU process; without it processes have no ``owner``).
They import each other relatively on the controller and by plain name on a node::

    if __package__:  # imported as homegpu.remote.node_side.agent.X: the controller and the tests
        from . import gpu_smi
    else:  # a node: the bundle's bootstrap, or this file run as a script
        import gpu_smi

The bundle's bootstrap puts each module of ``MODULES`` in ``sys.modules`` under its plain name, in
that order (each after those it imports), then runs this file as ``__main__``; run as a script, the
plain names are found in the script's own folder.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
import threading
import time

if __package__:
    from . import children, gpu_nvml, gpu_smi, gpu_xid, host_power, host_proc, process_owners, sleep_watch
    from .agent_common import describe
else:
    import children
    import gpu_nvml
    import gpu_smi
    import gpu_xid
    import host_power
    import host_proc
    import sleep_watch
    from agent_common import describe

    try:
        import process_owners
    except ImportError:  # a copy of the agent without it: processes are left without owners
        process_owners = None

PROTOCOL_VERSION = 1
GPU_SOURCES = ("nvml", "nvidia-smi", "none")  # what a line's "source" says
SOURCES = ("auto", *GPU_SOURCES)  # what --source takes: "auto" tries them in order
# The modules of node_side/agent/ the agent runs with, each after those it imports (the bundle ships them so).
MODULES = ("agent_common", "children", "gpu_health", "smi_parse", "gpu_smi", "gpu_nvml", "gpu_xid", "host_proc",
           "host_power", "process_owners", "sleep_watch")
# The controller's pynvml source, put here by the bundle's bootstrap (nodes/agent_bundle.py); else the node's own.
SHIPPED_PYNVML = globals().get("SHIPPED_PYNVML", b"")
APPS_INTERVAL_S = 5.0  # how often compute processes are asked for (both GPU sources)
HEALTH_INTERVAL_S = 5.0  # how often GPU health is asked for: a PCIe reading took 27 ms on an H100
FIRST_WINDOW_S = 0.15  # the first line's CPU % window: the first screen must not wait an interval


# --- the GPU source ------------------------------------------------------------------------------

class NoGpuReader:
    """A node without a usable GPU still reports CPU, memory and disk (and can still train)."""

    source = "none"

    def read(self, errors):
        return [], None, None


def open_reader(source, nvml, smi_path, interval=None, apps_every=1, owners=None, health_every=1,
                light_first=False):
    """Pick the GPU reader for ``source``, returning (reader, notes on sources that were skipped).

    ``auto`` tries NVML, then ``nvidia-smi``, then none; an explicit source that cannot work
    gives the "none" reader, so the node still streams its CPU and memory. ``interval`` (None for
    an agent that samples once) is passed on to ``gpu_smi.SmiReader``, ``apps_every``, ``health_every``
    and ``owners`` (a ``process_owners.ProcessOwners``, or None to leave processes without owners) to
    both readers. With ``light_first`` the first read leaves health to the next (the first line waits for no
    health query).
    ``nvml`` is a pynvml-like module or why there is none (see ``gpu_nvml.load_pynvml``).
    """
    notes = []
    if source in ("auto", "nvml"):
        if isinstance(nvml, str):
            notes.append(f"nvml: {nvml}")
        else:
            try:
                return gpu_nvml.NvmlReader(nvml, apps_every=apps_every, owners=owners,
                                           health_every=health_every, light_first=light_first), notes
            except Exception as exc:  # noqa: BLE001 - NVMLError, OSError, ... all mean "no NVML"
                notes.append(f"nvml: {describe(exc)}")
    if source in ("auto", "nvidia-smi"):
        if smi_path:
            return gpu_smi.SmiReader(smi_path, interval, apps_every, owners, health_every, light_first), notes
        notes.append("nvidia-smi: not found on PATH")
    return NoGpuReader(), notes


# --- the stream ----------------------------------------------------------------------------------

def sample(reader, cpu_before, work_dir, rapl=None, xids=None):
    """Measure once; return (the JSON-ready record, the CPU counters to diff against next time). ``rapl``: a
    ``host_power.RaplCounter`` (None: no host energy); ``xids``: a ``gpu_xid.XidLog`` (None: no ``xid`` keys)."""
    errors = []
    gpus, driver, cuda = reader.read(errors)
    if xids is not None:
        xids.annotate(gpus, errors)
    cpu_after = host_proc.read_cpu(errors)
    memory = host_proc.read_memory(errors)
    record = {
        "v": PROTOCOL_VERSION,
        "t": round(time.time(), 3),
        "source": reader.source,
        "gpus": gpus,
        "driver": driver,
        "cuda": cuda,
        "cpu": host_proc.cpu_percent(cpu_before, cpu_after),
        "load": host_proc.read_load(errors),
        "mem_used": memory[0] if memory else None,
        "mem_total": memory[1] if memory else None,
        "disk_free": host_proc.read_disk_free(work_dir, errors),
        "host_energy": rapl.read(errors) if rapl is not None else None,
    }
    if errors:
        record["errors"] = errors
    return record, cpu_after


def emit(record):
    """Write one line and flush it now: the controller renders each line as it arrives.

    Once another thread has begun the exit, the line is dropped: it may hold "the agent is
    exiting" refusals of queries that are not errors of the node.
    """
    if children.exiting():
        return
    try:
        sys.stdout.write(json.dumps(record, separators=(",", ":")) + "\n")
        sys.stdout.flush()
    except BrokenPipeError:
        exit_now()


def exit_now(*_):
    """Leave at once, taking any nvidia-smi child along, so nothing outlives the session."""
    children.kill_children()
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
    parser.add_argument("--health-interval", type=float, default=HEALTH_INTERVAL_S,
                        help="seconds between GPU health queries (NVML or nvidia-smi)")
    parser.add_argument("--light-first", action="store_true",
                        help="streaming, leave GPU health and XIDs to the second line: a first screen that waits "
                             "for no slow probe")
    args = parser.parse_args(argv)
    if not args.interval > 0:
        parser.error("--interval must be positive")
    for name in ("apps_interval", "health_interval"):
        if not getattr(args, name) > 0:
            parser.error(f"--{name.replace('_', '-')} must be positive")
    return args


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    install_exit_handlers()
    try:
        return stream(args)
    finally:
        children.kill_children()


def stream(args):
    """Print a line per interval (one line with ``--once``) until told to exit.

    The first line comes ``FIRST_WINDOW_S`` after the start, its CPU % measured over that short
    window, so a node's first screen waits neither a whole interval nor for a second sample. With
    ``--light-first`` it leaves GPU health and XIDs to the next line (``health_pending``), an interval later.
    """
    # As ``python3 -`` the script itself was stdin, already at EOF: rely on SIGHUP/SIGPIPE there.
    if not args.once and sys.argv[0] != "-":
        watch_stdin()
    nvml = gpu_nvml.load_pynvml(SHIPPED_PYNVML) if args.source in ("auto", "nvml") else None
    smi = shutil.which("nvidia-smi") if args.source in ("auto", "nvidia-smi") else None
    apps_every = max(1, int(round(args.apps_interval / args.interval)))
    health_every = max(1, int(round(args.health_interval / args.interval)))
    owners = process_owners.ProcessOwners() if process_owners is not None else None
    light = args.light_first and not args.once  # the first line leaves GPU health and XIDs to the next
    reader, notes = open_reader(args.source, nvml, smi, interval=None if args.once else args.interval,
                                apps_every=apps_every, owners=owners, health_every=health_every, light_first=light)
    rapl = host_power.RaplCounter()
    if rapl.problem:
        notes.append(rapl.problem)
    xids = gpu_xid.XidLog(every=health_every, light_first=light)
    cpu_before = host_proc.read_cpu([])
    sleep = sleep_watch.SleepWatch()
    listening = False  # for logind's word: started once the first line is out
    # The first line comes after a short CPU window, the next ones on the interval's beat from it.
    due = time.monotonic() + min(args.interval, FIRST_WINDOW_S)
    while True:
        # logind's "about to sleep" is said at once: the machine may be gone before the next beat.
        if sleep.changed.wait(max(0.0, due - time.monotonic())):
            sleep.changed.clear()
        record, cpu_before = sample(reader, cpu_before, args.work_dir, rapl, xids)
        if light and record["gpus"]:  # without GPUs nothing was left for later
            record["health_pending"] = True
        light = False
        if sleep.going:
            record["sleeping"] = True
        if notes:  # why a GPU source was skipped, said once
            record["errors"] = notes + record.get("errors", [])
            notes = []
        emit(record)
        if args.once:
            return 0
        if not listening:  # after the first line, which a node's first screen waits for
            sleep.start()
            listening = True
        # Keep the beat; after a sample slower than the interval, do not try to catch up.
        due = max(due + args.interval, time.monotonic())


if __name__ == "__main__":
    sys.exit(main())

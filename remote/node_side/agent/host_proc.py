"""The node's own figures for the stats agent: CPU, memory and load from /proc, free disk space.

Standard library only, Python 3.8+: it runs on the nodes with the agent (see ``stats_agent.py``).
Each ``read_*`` puts what went wrong (an old kernel, a sandbox without /proc) in ``errors`` and
returns None, so a line always comes.
"""

from __future__ import annotations

import os

if __package__:  # how the node_side modules import each other: see stats_agent.py's docstring
    from .agent_common import MIB, describe
else:
    from agent_common import MIB, describe


# --- parsers -------------------------------------------------------------------------------------

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


# --- reading -------------------------------------------------------------------------------------

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


def _measure(label, errors, func, *args):
    """``func(*args)``; an OS or parse failure is an entry ``"LABEL: ..."`` of ``errors`` and None."""
    try:
        return func(*args)
    except (OSError, ValueError, KeyError, IndexError) as exc:
        errors.append(f"{label}: {describe(exc)}")
        return None


def _read_proc(path, parse, errors):
    """Parse one /proc file; a missing or odd one (an old kernel, a sandbox) is an error line."""
    return _measure(path, errors, lambda: parse(_proc_text(path)))


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


def read_cpu(errors):
    """(idle, total) jiffies so far, to diff with ``cpu_percent``."""
    return _read_proc("/proc/stat", parse_proc_stat, errors)


def read_memory(errors):
    """(used, total) MiB."""
    return _read_proc("/proc/meminfo", parse_meminfo, errors)


def read_load(errors):
    """The 1, 5 and 15 minute load averages."""
    return _read_proc("/proc/loadavg", parse_loadavg, errors)


def read_disk_free(path, errors):
    """Free MiB on the filesystem of ``path`` (see ``disk_free_mib``)."""
    return _measure("disk", errors, disk_free_mib, path)

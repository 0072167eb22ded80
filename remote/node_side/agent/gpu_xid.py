"""The XID errors the NVIDIA driver logged for each GPU, read from the kernel log (``/dev/kmsg``).

Standard library only, Python 3.8+: it runs on the nodes with the agent (see ``stats_agent.py``), for both
GPU sources. The driver logs an XID as a kernel message (NVIDIA's "Xid Errors" document; older drivers
leave out the ``PCI:``)::

    NVRM: Xid (PCI:0000:2d:00): 79, pid=..., name=..., GPU has fallen off the bus.
    NVRM: Xid (0000:03:00): 14, Channel 00000001

and ``/dev/kmsg`` gives each kernel record as ``pri,seq,usec,flags[,...];message``, one record per read(),
with continuation lines (`` KEY=value``) after it (Documentation/ABI/testing/dev-kmsg). Opened anew it
starts at the oldest record the kernel still holds, so the count is the XIDs since boot (as far back as the
kernel's log buffer reaches), the same figure after the agent restarts; records come in as the driver logs
them. Each GPU's dict gets::

    "xid": {"count": XIDs since boot, "last": the last one's code, "last_at": unix time} | null

``last`` and ``last_at`` null while there is none; the whole key null where the log is unreadable or the
GPU's bus id (its ``bus_id`` key, from NVML or nvidia-smi) is unknown. Where ``kernel.dmesg_restrict`` is 1
(Debian's and Ubuntu's default) reading the log needs CAP_SYSLOG, which an SSH user lacks: that is said
once in the line's errors, with the fix.
"""

from __future__ import annotations

import errno
import os
import re
import time

if __package__:  # how the node_side modules import each other: see stats_agent.py's docstring
    from .agent_common import describe
else:
    from agent_common import describe

KMSG = "/dev/kmsg"  # read when a log is opened, so the tests point it at a file
# A read of /dev/kmsg returns one whole record, or fails (EINVAL) if the buffer cannot hold it: the kernel
# caps a record's text at a few KiB at most, and 8 KiB leaves room for its continuation lines.
READ_SIZE = 8192
# A flood of kernel messages must not hold a sample up: read at most this many records at a time.
MAX_READS = 20000
_XID = re.compile(r"NVRM: Xid \((?:PCI:)?([0-9a-fA-F]+):([0-9a-fA-F]{2}):([0-9a-fA-F]{2})\): (\d+)")
_BUS_ID = re.compile(r"([0-9a-fA-F]+):([0-9a-fA-F]{2}):([0-9a-fA-F]{2})(?:\.[0-7])?")
UNREADABLE_FIX = ("XID counts are null; `sudo sysctl -w kernel.dmesg_restrict=0` (and the same line in "
                  "/etc/sysctl.d/ to keep it) lets every user read the kernel log")


def _bus_key(domain, bus, device):
    return f"{int(domain, 16):04x}:{bus.lower()}:{device.lower()}"


def kernel_bus_id(bus_id):
    """``00000000:2D:00.0`` (NVML, nvidia-smi) as the driver's kernel log names the GPU: ``0000:2d:00``;
    None where it is not a PCI bus id."""
    match = _BUS_ID.fullmatch(bus_id.strip()) if isinstance(bus_id, str) else None
    return _bus_key(*match.groups()) if match else None


def parse_record(record):
    """(kernel bus id, XID code, microseconds since boot) of one ``/dev/kmsg`` record, or None if it is no XID.

    Only the kernel's own records count (facility 0): a process writing to /dev/kmsg is given another.
    """
    head, semicolon, message = record.partition(";")
    fields = head.split(",")
    if not semicolon or len(fields) < 4:
        return None
    try:
        priority, usec = int(fields[0]), int(fields[2])
    except ValueError:
        return None
    match = _XID.search(message) if priority >> 3 == 0 else None
    if match is None:
        return None
    domain, bus, device, code = match.groups()
    return _bus_key(domain, bus, device), int(code), usec


class XidLog:
    """Each GPU's XIDs since boot, read from ``KMSG`` on every ``every``-th ``annotate`` (the health cadence)
    and kept between.

    ``boot_at`` is the unix time the kernel's log clock started: that clock, like CLOCK_MONOTONIC, stops
    while the machine sleeps, which /proc/uptime does not, so ``time() - monotonic()`` stays right after a
    suspend. With ``light_first`` (a streaming agent) the first call leaves the log unread (``xid`` null) and the
    second reads it: the first line waits for no read of the whole kernel log.
    """

    def __init__(self, every=1, boot_at=None, light_first=False):
        self.every = max(1, every)
        self._calls_since = self.every - 1 if light_first else self.every  # when due, the call reads
        self.boot_at = time.time() - time.monotonic() if boot_at is None else boot_at
        self._fd = None
        self._told = False  # the log's being unreadable is said once
        self._partial = b""  # a record cut by the read's end (a regular file gives many records a read)
        self._by_bus = {}  # kernel bus id -> [count, last code, last usec]
        self._buses = {}  # a GPU's bus id -> its kernel bus id
        self._shown = {}  # kernel bus id -> the figures given since the last read

    def annotate(self, gpus, errors):
        """Give each of ``gpus`` (the reader's dicts) its ``xid`` key; problems go to ``errors``, once."""
        due = self._calls_since >= self.every
        self._calls_since = 1 if due else self._calls_since + 1
        buses = [self._bus(gpu.get("bus_id")) for gpu in gpus]
        if due and any(buses):  # no bus id, nothing to match: the log is not opened
            self._read(errors)
            self._shown = {}
        for gpu, bus in zip(gpus, buses):
            if bus not in self._shown:  # the same figures until the next read: made once, not every line
                self._shown[bus] = self._figures(bus)
            gpu["xid"] = self._shown[bus]

    def _bus(self, bus_id):
        """kernel_bus_id, remembered: the agent asks for the same few on every line."""
        if bus_id not in self._buses:
            self._buses[bus_id] = kernel_bus_id(bus_id)
        return self._buses[bus_id]

    def close(self):
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def _figures(self, bus):
        if self._fd is None or bus is None:
            return None
        count, code, usec = self._by_bus.get(bus, (0, None, None))
        at = None if usec is None else round(self.boot_at + usec / 1e6, 3)
        return {"count": count, "last": code, "last_at": at}

    def _read(self, errors):
        """Take every record logged since the last read (all of them at the first)."""
        if self._fd is None and not self._open(errors):
            return
        for _ in range(MAX_READS):
            try:
                chunk = os.read(self._fd, READ_SIZE)
            except BlockingIOError:  # EAGAIN: nothing more for now
                return
            except BrokenPipeError:  # EPIPE: records were overwritten before we read them; go on from the oldest left
                continue
            except OSError as exc:
                errors.append(f"xid: {KMSG}: {describe(exc)}")
                self.close()
                return
            if not chunk:  # a regular file's end: records appended later are read next time
                return
            self._take(chunk)

    def _open(self, errors):
        try:
            self._fd = os.open(KMSG, os.O_RDONLY | os.O_NONBLOCK)
        except OSError as exc:
            # No /dev/kmsg (not Linux, a container without it): no XIDs to read, nothing to say.
            if exc.errno != errno.ENOENT and not self._told:
                why = (" (kernel.dmesg_restrict=1: reading the kernel log needs CAP_SYSLOG)"
                       if isinstance(exc, PermissionError) else "")
                errors.append(f"xid: {KMSG}: {describe(exc)}{why}; {UNREADABLE_FIX}")
                self._told = True
            return False
        self._partial, self._by_bus = b"", {}  # a fresh open starts again at the oldest record
        return True

    def _take(self, chunk):
        lines = (self._partial + chunk).split(b"\n")
        self._partial = lines.pop()
        for line in lines:
            if line.startswith(b" "):  # a continuation line (KEY=value) of the record before
                continue
            found = parse_record(line.decode("utf-8", "replace"))
            if found is not None:
                bus, code, usec = found
                count = self._by_bus.get(bus, (0,))[0]
                self._by_bus[bus] = (count + 1, code, usec)

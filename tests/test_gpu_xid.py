"""XID errors (issue 35): the stats agent reads the ones the NVIDIA driver logged from the kernel log
(remote/node_side/agent/gpu_xid.py), the controller parses them, judges a recent one in words, and `status`,
`status --json` show them.

These machines have no NVIDIA GPU, so no kernel here logs an XID: every record below is built from the
documented formats, the driver's message as NVIDIA's "Xid Errors" document gives it (with and without the
``PCI:`` newer drivers print, and the ``pid=..., name=...`` they add) inside a ``/dev/kmsg`` record as the
kernel's Documentation/ABI/testing/dev-kmsg describes it (``pri,seq,usec,flags;message``, continuation lines
indented). A regular file stands in for /dev/kmsg (``gpu_xid.KMSG``), and a scripted one for the device's
own answers (one record a read, EPIPE, EAGAIN).
"""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from dataclasses import replace
from pathlib import Path
import pytest

from homegpu.remote.events import NA, XidErrors
from homegpu.remote.node_side.agent import gpu_xid, host_proc, stats_agent
from homegpu.remote.nodes import GpuHealth, StatsParseError, held_back, parse_agent_line
from homegpu.tui.view.text import format_status, status_json
import test_gpu_health
from test_gpu_health import gpu, node_with

utc = test_gpu_health.utc  # the fixture that pins local time to UTC

NODE_SIDE = Path(gpu_xid.__file__).parent
BOOT_AT = 1_795_338_000.0  # 09:00:00 UTC: the unix time the kernel's log clock started
RISER, SECOND = "00000000:2D:00.0", "00000000:41:00.0"  # two GPUs' bus ids as NVML and nvidia-smi spell them


def record(seq: int, usec: int, message: str, pri: int = 3, *continuation: str) -> str:
    """One /dev/kmsg record: priority (facility 0, the kernel's, and the level), sequence number,
    microseconds since boot, flags, the message, then its continuation lines."""
    return f"{pri},{seq},{usec},-;{message}\n" + "".join(f" {line}\n" for line in continuation)


FALLEN = "NVRM: Xid (PCI:0000:2d:00): 79, pid=1234, name=python3, GPU has fallen off the bus."
WARP = ("NVRM: Xid (PCI:0000:2d:00): 13, pid='<unknown>', name=<unknown>, Graphics SM Warp Exception on "
        "(GPC 7, TPC 1, SM 0): Out Of Range Address")
KERNEL_LOG = "".join([
    record(1, 1_204_571, "Linux version 6.1.0-18-amd64", 5),
    record(2, 100_000_000, WARP, 4),
    record(3, 150_000_000, "NVRM: Xid (0000:81:00): 48, An uncorrectable double bit error", 3),  # not a GPU here
    record(4, 200_500_000, FALLEN, 3, "SUBSYSTEM=pci", "DEVICE=+pci:0000:2d:00.0"),
    # a process writing to /dev/kmsg gets the user facility (1 << 3): not the driver's word
    record(5, 210_000_000, "NVRM: Xid (PCI:0000:41:00): 79, GPU has fallen off the bus.", 12),
])


# --- the records ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("line, found", [
    (record(4, 200_500_000, FALLEN), ("0000:2d:00", 79, 200_500_000)),
    (record(2, 100_000_000, WARP), ("0000:2d:00", 13, 100_000_000)),
    (record(9, 7, "NVRM: Xid (0000:03:00): 14, Channel 00000001"), ("0000:03:00", 14, 7)),  # NVIDIA's example
    ("4,10,8123,-,caller=T42;NVRM: Xid (PCI:0000:CB:00): 31, pid=7, name=a.out, Ch 00000009\n",
     ("0000:cb:00", 31, 8123)),  # a kernel that adds the caller
    (record(5, 9, "NVRM: Xid (PCI:0000:41:00): 79, GPU has fallen off the bus.", 12), None),
    (record(1, 9, "hgv4236-4: left allmulticast mode", 6), None),
    (record(1, 9, "NVRM: GPU at PCI:0000:2d:00: GPU-806f8ea2-6428-1096-a076-bb687fb45fb0", 6), None),
    ("not a record\n", None), ("3,1,x,-;NVRM: Xid (PCI:0000:2d:00): 79, x\n", None),
])
def test_an_xid_record_gives_its_gpu_code_and_time_since_boot(line: str, found) -> None:
    assert gpu_xid.parse_record(line.rstrip("\n")) == found


@pytest.mark.parametrize("bus_id, kernel", [
    (RISER, "0000:2d:00"), ("0000:2d:00.0", "0000:2d:00"), ("00010000:01:00.0", "10000:01:00"),
    (None, None), ("", None), ("GPU-1", None),
])
def test_a_gpus_bus_id_as_the_kernel_log_names_it(bus_id, kernel) -> None:
    assert gpu_xid.kernel_bus_id(bus_id) == kernel


# --- the log, read -------------------------------------------------------------------------------------------

@pytest.fixture
def kmsg(tmp_path, monkeypatch) -> Path:
    """A kernel log of the test's own, holding KERNEL_LOG: what /dev/kmsg gives from boot on."""
    path = tmp_path / "kmsg"
    path.write_text(KERNEL_LOG)
    monkeypatch.setattr(gpu_xid, "KMSG", str(path))
    return path


def gpus(*bus_ids) -> list[dict]:
    return [{"index": index, "bus_id": bus_id} for index, bus_id in enumerate(bus_ids)]


def test_each_gpu_counts_its_own_xids_since_boot_with_the_last_ones_code_and_time(kmsg) -> None:
    log, found, errors = gpu_xid.XidLog(boot_at=BOOT_AT), gpus(RISER, SECOND, None), []
    log.annotate(found, errors)
    riser, second, unknown = found
    assert riser["xid"] == {"count": 2, "last": 79, "last_at": BOOT_AT + 200.5}
    assert second["xid"] == {"count": 0, "last": None, "last_at": None}  # the user's record is not the driver's
    assert unknown["xid"] is None and errors == []  # no bus id (nvidia-smi's health not in yet): not known


def test_a_streaming_agents_first_line_leaves_the_log_to_the_second(kmsg) -> None:
    """The whole kernel log is not read for the first line, which a node's first screen waits for."""
    log, opened = gpu_xid.XidLog(every=5, boot_at=BOOT_AT, light_first=True), []
    open_log = log._open
    log._open = lambda errors: opened.append(gpu_xid.KMSG) or open_log(errors)
    first = gpus(RISER)
    log.annotate(first, [])
    assert first[0]["xid"] is None and opened == []  # not known yet
    second = gpus(RISER)
    log.annotate(second, [])
    assert second[0]["xid"] == {"count": 2, "last": 79, "last_at": BOOT_AT + 200.5} and opened == [str(kmsg)]


def test_records_logged_later_are_read_at_the_next_health_reading(kmsg) -> None:
    log = gpu_xid.XidLog(every=2, boot_at=BOOT_AT)
    log.annotate(gpus(RISER, SECOND), [])
    with kmsg.open("a") as handle:  # the file's end was read; the driver logs on
        handle.write(record(6, 3_600_000_000, "NVRM: Xid (PCI:0000:41:00): 119, Timeout after 6s of waiting "
                                              "for RPC response from GPU1 GSP!"))
    between = gpus(RISER, SECOND)
    log.annotate(between, [])  # not a health reading: the figures are kept
    assert between[1]["xid"]["count"] == 0
    later = gpus(RISER, SECOND)
    log.annotate(later, [])
    assert later[1]["xid"] == {"count": 1, "last": 119, "last_at": BOOT_AT + 3600}
    assert later[0]["xid"]["count"] == 2


def test_a_record_cut_by_a_reads_end_is_read_whole(kmsg) -> None:
    """A regular file gives 8 KiB of records a read, the last one cut in two; /dev/kmsg never does."""
    filler = [record(10 + i, 300_000_000 + i, f"usb 1-{i}: new high-speed USB device", 6) for i in range(400)]
    before = max(n for n in range(len(filler)) if len("".join(filler[:n])) < 8192 - 40)
    head, xid = "".join(filler[:before]), record(9, 250_000_000, FALLEN)
    assert len(head) < 8192 < len(head + xid)  # the first read ends inside the XID's record
    kmsg.write_text(head + xid + "".join(filler[before:]))
    found = gpus(RISER)
    gpu_xid.XidLog(boot_at=BOOT_AT).annotate(found, [])
    assert found[0]["xid"] == {"count": 1, "last": 79, "last_at": BOOT_AT + 250}


class KmsgDevice:
    """/dev/kmsg as the kernel answers a non-blocking reader: one record a read, EPIPE where records were
    overwritten before they were read (the next read goes on), EAGAIN when there is nothing more."""

    O_RDONLY, O_NONBLOCK = os.O_RDONLY, os.O_NONBLOCK

    def __init__(self, *answers, open_error: OSError | None = None) -> None:
        self.answers, self.open_error, self.reads = list(answers), open_error, 0

    def open(self, path: str, flags: int) -> int:
        assert flags == os.O_RDONLY | os.O_NONBLOCK
        if self.open_error:
            raise self.open_error
        return 1000

    def read(self, fd: int, size: int) -> bytes:
        assert size == 8192
        self.reads += 1
        answer = self.answers.pop(0) if self.answers else BlockingIOError(errno.EAGAIN, "Resource unavailable")
        if isinstance(answer, OSError):
            raise answer
        return answer.encode()

    def close(self, fd: int) -> None:
        pass


def test_the_device_is_read_a_record_at_a_time_past_epipe_until_eagain(monkeypatch) -> None:
    device = KmsgDevice(record(2, 100_000_000, WARP), BrokenPipeError(errno.EPIPE, "Broken pipe"),
                        record(9, 200_500_000, FALLEN))
    monkeypatch.setattr(gpu_xid, "os", device)
    log, found = gpu_xid.XidLog(boot_at=BOOT_AT), gpus(RISER)
    log.annotate(found, [])
    [riser] = found
    assert riser["xid"] == {"count": 2, "last": 79, "last_at": BOOT_AT + 200.5}
    assert device.reads == 4  # the two records, the EPIPE, and the EAGAIN that ends it
    device.answers = [record(10, 201_000_000, WARP)]
    log.annotate(found, [])
    assert riser["xid"] == {"count": 3, "last": 13, "last_at": BOOT_AT + 201}


def test_an_unreadable_log_is_null_figures_and_one_line_with_the_fix(monkeypatch) -> None:
    """What Debian and Ubuntu do to an SSH user: kernel.dmesg_restrict=1 (open gives EPERM)."""
    monkeypatch.setattr(gpu_xid, "os", KmsgDevice(open_error=PermissionError(errno.EPERM, "Operation not permitted")))
    log, found, first, second = gpu_xid.XidLog(), gpus(RISER), [], []
    log.annotate(found, first)
    log.annotate(found, second)
    assert found[0]["xid"] is None and second == []  # said once
    [line] = first
    assert line.startswith("xid: /dev/kmsg: PermissionError: [Errno 1] Operation not permitted "
                           "(kernel.dmesg_restrict=1")
    assert "CAP_SYSLOG" in line and "sudo sysctl -w kernel.dmesg_restrict=0" in line


def test_no_kernel_log_at_all_is_null_figures_and_no_complaint(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(gpu_xid, "KMSG", str(tmp_path / "none"))  # not Linux, or a container without it
    found, errors = gpus(RISER), []
    gpu_xid.XidLog().annotate(found, errors)
    assert found[0]["xid"] is None and errors == []


def test_a_user_who_may_not_read_the_kernel_log_gets_one_line_saying_so(root) -> None:
    """The agent as an unprivileged user, `nobody`, on a log it may not open (a root-only file here)."""
    with tempfile.TemporaryDirectory() as folder:  # outside pytest's tmp_path, which only root may enter
        Path(folder).chmod(0o755)
        log, agent = Path(folder) / "kmsg", Path(folder) / "agent"
        log.write_text(KERNEL_LOG)
        log.chmod(0o400)
        agent.mkdir()
        for module in ("gpu_xid.py", "agent_common.py"):
            shutil.copy(NODE_SIDE / module, agent / module)
        code = (f"import json, sys; sys.path.insert(0, {str(agent)!r}); import gpu_xid; gpu_xid.KMSG = {str(log)!r}; "
                f"xids, gpus, errors = gpu_xid.XidLog(), [{{'bus_id': {RISER!r}}}], []; xids.annotate(gpus, errors); "
                "xids.annotate(gpus, errors); print(json.dumps([errors, gpus]))")
        done = subprocess.run(["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", "/usr/bin/python3",
                               "-I", "-S", "-c", code], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    [line], [riser] = json.loads(done.stdout)
    assert line.startswith(f"xid: {log}: PermissionError: ") and "sudo sysctl -w kernel.dmesg_restrict=0" in line
    assert riser["xid"] is None


def test_the_agents_line_carries_each_gpus_xids(kmsg, tmp_path) -> None:
    """stats_agent.sample gives the reader's GPUs their ``xid`` key, whichever source read them."""
    class Reader:
        source = "nvidia-smi"

        def read(self, errors):
            return gpus(RISER, SECOND), "590.48.01", "13.1"

    record_, _ = stats_agent.sample(Reader(), host_proc.read_cpu([]), str(tmp_path), None,
                                    gpu_xid.XidLog(boot_at=BOOT_AT))
    stats = parse_agent_line(json.dumps(record_))
    assert [gpu.xid for gpu in stats.gpus] == [XidErrors(2, 79, BOOT_AT + 200.5), XidErrors(0)]
    assert stats.gpus[0].bus_id == RISER and stats.errors == ()


# --- the controller ------------------------------------------------------------------------------------------

def line(**gpu_keys) -> str:
    gpu_ = {"index": 0, "name": "NVIDIA H100 NVL", "uuid": "GPU-1", "util": 97, **gpu_keys}
    return json.dumps({"v": stats_agent.PROTOCOL_VERSION, "t": 1.0, "source": "nvml", "gpus": [gpu_]})


def test_xids_parse_and_an_older_agents_line_has_none() -> None:
    [gpu_] = parse_agent_line(line(xid={"count": 2, "last": 79, "last_at": BOOT_AT}, bus_id=RISER)).gpus
    assert (gpu_.xid, gpu_.bus_id) == (XidErrors(2, 79, BOOT_AT), RISER)
    [none] = parse_agent_line(line(xid={"count": 0, "last": None, "last_at": None})).gpus
    assert none.xid == XidErrors(0, NA, NA)
    [old] = parse_agent_line(line()).gpus
    assert (old.xid, old.bus_id) == (None, NA)


@pytest.mark.parametrize("xid, field", [
    ("79", "gpus[0].xid"), ({"last": 79}, "gpus[0].xid.count"), ({"count": 1, "last": "79"}, "gpus[0].xid.last"),
])
def test_xids_of_the_wrong_type_are_refused_by_name(xid, field) -> None:
    with pytest.raises(StatsParseError, match=re.escape(f"stats line: {field}: expected")):
        parse_agent_line(line(xid=xid))


NOW = BOOT_AT + 3600.0  # 10:00 UTC: the line's time


def with_xid(last: int, ago: float, count: int = 1, util: float = 0):
    return replace(gpu(util=util), xid=XidErrors(count, last, NOW - ago))


def test_a_recent_xid_is_named_with_its_meaning_and_fix_even_on_an_idle_gpu(utc) -> None:
    assert held_back(with_xid(79, 60, count=2), at=NOW) == [
        "GPU 1 XID 79 (fallen off the bus) at 09:59, 2 since boot; reseat the card and its riser, and check its "
        "power cables"]
    assert held_back(with_xid(48, 600), at=NOW)[0].startswith(
        "GPU 1 XID 48 (double-bit ECC error) at 09:50, 1 since boot; reset the GPU (nvidia-smi -r) or reboot")
    assert "usually the program" in held_back(with_xid(13, 60), at=NOW)[0]
    assert held_back(with_xid(57, 60), at=NOW) == [
        "GPU 1 XID 57 at 09:59, 1 since boot; see NVIDIA's XID catalogue (docs.nvidia.com/deploy/xid-errors)"]


def test_an_xid_over_an_hour_old_stays_in_the_figures_only() -> None:
    assert held_back(with_xid(79, 3601), at=NOW) == []
    assert held_back(replace(gpu(), xid=XidErrors(0)), at=NOW) == []
    assert held_back(replace(gpu(), xid=None), at=NOW) == []


def test_an_xid_comes_before_what_holds_a_loaded_gpu_back(utc) -> None:
    riser = replace(with_xid(79, 60, util=97), pcie=replace(gpu().pcie, gen=3, width=1))
    assert [cause.split(",")[0].split(":")[0] for cause in held_back(riser, at=NOW)] == [
        "GPU 1 XID 79 (fallen off the bus) at 09", "GPU 1 runs PCIe 3.0 x1 of 4.0 x16"]


def test_a_nodes_health_judges_an_xid_by_its_lines_time(utc) -> None:
    health = GpuHealth()
    health.take(replace(parse_agent_line(line()), timestamp=NOW, gpus=(with_xid(95, 60),)))
    assert health.causes() == ["GPU 1 XID 95 (uncontained ECC error) at 09:59, 1 since boot; reset the GPU "
                               "(nvidia-smi -r) or reboot"]


def test_status_and_its_json_show_the_xids_and_pcie_traffic(utc) -> None:
    pcie = replace(gpu().pcie, tx_mbs=1250.0, rx_mbs=24.5)
    node = node_with((replace(with_xid(79, 60), pcie=pcie), replace(gpu(), index=2, xid=None)))
    node.latest = replace(node.latest, timestamp=NOW)
    first, second = json.loads(json.dumps(status_json("home", [node], NOW)))["nodes"][0]["stats"]["gpus"]
    assert first["xid"] == {"count": 1, "last": 79, "last_at": NOW - 60} and second["xid"] is None
    assert (first["pcie"]["tx_mbs"], first["pcie"]["rx_mbs"]) == (1250.0, 24.5)
    assert first["held_back"][0].startswith("GPU 1 XID 79 (fallen off the bus) at 09:59")
    text = format_status([node])
    assert "\n        held back: GPU 1 XID 79 (fallen off the bus) at 09:59, 1 since boot; reseat" in text


def test_the_status_help_names_the_new_keys() -> None:
    from homegpu.tui.cli.status import JSON_HELP
    assert '"xid": null | {"count", "last", "last_at"}' in JSON_HELP and '"tx_mbs", "rx_mbs"' in JSON_HELP


def test_a_snapshot_without_a_time_judges_against_now() -> None:
    assert held_back(replace(gpu(util=0), xid=XidErrors(1, 79, time.time() - 5)))[0].startswith("GPU 1 XID 79")

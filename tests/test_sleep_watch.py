"""A machine that sleeps by itself (issue 36): logind's PrepareForSleep, heard by the stats agent through a real
`gdbus monitor` on a real dbus-daemon (tests/simlogind.py owns logind's name and sends its signal), is passed on
at once in a line that says "sleeping"; the controller reads it and marks the node asleep, by itself, in the
file every homegpu process reads (nodes/asleep.py). On the LAN: tests/test_sleep_wake_lan.py."""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest

from homegpu.remote.config import parse_cluster
from homegpu.remote.node_side.agent import sleep_watch, stats_agent
from homegpu.remote.nodes import AsleepNodes
from homegpu.remote.nodes.stats import parse_agent_line
from simlogind import Logind

AGENT = Path(stats_agent.__file__)
# What gdbus 2.74 printed for logind's signal (Debian 12, a dbus-daemon with the name owned as logind owns it).
GOING = "/org/freedesktop/login1: org.freedesktop.login1.Manager.PrepareForSleep (true,)\n"
WOKE = "/org/freedesktop/login1: org.freedesktop.login1.Manager.PrepareForSleep (false,)\n"


def test_gdbus_lines_are_read_for_logind_s_word_only() -> None:
    assert sleep_watch.parse_monitor_line(GOING) is True
    assert sleep_watch.parse_monitor_line(WOKE) is False
    for other in ("The name org.freedesktop.login1 is owned by :1.1\n",
                  "/org/freedesktop/login1: org.freedesktop.login1.Manager.PrepareForShutdown (true,)\n",
                  "/org/freedesktop/login1: org.freedesktop.DBus.Properties.PropertiesChanged ('org.freedesktop."
                  "login1.Manager.PrepareForSleep (true,)', {}, @as [])\n"):
        assert sleep_watch.parse_monitor_line(other) is None, other


def readline_within(proc: subprocess.Popen, seconds: float) -> str | None:
    if not select.select([proc.stdout], [], [], seconds)[0]:
        return None
    line = proc.stdout.readline()
    if not line:
        proc.wait(timeout=10)
        pytest.fail(f"the agent stopped: {proc.stderr.read()!r}")
    return line


def next_line_on(logind: Logind, going: bool, agent: subprocess.Popen) -> dict:
    """Send PrepareForSleep(going) until the agent, whose beat is far off, writes a line (gdbus may still be
    subscribing when the first goes out)."""
    for _ in range(40):
        logind.prepare_for_sleep(going)
        if line := readline_within(agent, 0.5):
            return json.loads(line)
    pytest.fail(f"no line from the agent after PrepareForSleep({going})")


def test_the_agent_says_at_once_that_logind_puts_the_machine_to_sleep(tmp_path: Path) -> None:
    logind = Logind(tmp_path / "system_bus_socket")
    env = dict(os.environ, DBUS_SYSTEM_BUS_ADDRESS=logind.address)
    agent = subprocess.Popen([sys.executable, str(AGENT), "--interval", "600", "--source", "none", "--work-dir",
                              str(tmp_path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, env=env)
    try:
        first = json.loads(readline_within(agent, 30) or "{}")
        assert first and "sleeping" not in first
        going = next_line_on(logind, True, agent)  # long before the 600 s beat
        assert going["sleeping"] is True and parse_agent_line(json.dumps(going)).sleeping
        woke = next_line_on(logind, False, agent)
        assert "sleeping" not in woke and not parse_agent_line(json.dumps(woke)).sleeping
    finally:
        agent.kill()
        agent.wait(timeout=10)
        logind.close()


def test_without_gdbus_nothing_is_heard_and_the_stream_goes_on(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no gdbus here
    assert sleep_watch.SleepWatch().start() is False
    agent = subprocess.Popen([sys.executable, str(AGENT), "--interval", "0.1", "--source", "none", "--work-dir",
                              str(tmp_path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True)
    try:
        lines = [json.loads(readline_within(agent, 30) or "{}") for _ in range(3)]
        assert all(line and "sleeping" not in line for line in lines)
    finally:
        agent.stdin.close()  # the session's end
        assert agent.wait(timeout=30) == 0 and agent.stderr.read() == ""


def test_where_the_system_bus_is_not_there_gdbus_is_not_started(tmp_path: Path, monkeypatch) -> None:
    """A container's or WSL's missing bus is found by its socket, without gdbus's 45 ms of CPU to fail."""
    socket = tmp_path / "system_bus_socket"
    missing = {"DBUS_SYSTEM_BUS_ADDRESS": f"unix:path={socket}"}
    assert sleep_watch.system_bus_missing(missing)
    assert not sleep_watch.system_bus_missing({"DBUS_SYSTEM_BUS_ADDRESS": "unix:abstract=/tmp/dbus-x"})
    assert not sleep_watch.system_bus_missing({"DBUS_SYSTEM_BUS_ADDRESS": f"unix:path={socket};tcp:host=h,port=1"})
    monkeypatch.setattr(sleep_watch, "SYSTEM_BUS_SOCKET", str(socket))
    assert sleep_watch.system_bus_missing({})  # unset: the usual socket's path
    started = []
    monkeypatch.setattr(sleep_watch.children, "spawn", lambda *args, **kwargs: started.append(args))
    monkeypatch.setenv("DBUS_SYSTEM_BUS_ADDRESS", f"unix:path={socket}")
    assert sleep_watch.SleepWatch().start() is False and started == []
    socket.write_text("")  # the bus is there now (any file at the path)
    assert not sleep_watch.system_bus_missing(missing)


def test_a_node_that_went_by_itself_is_told_apart_from_one_homegpu_put_to_sleep(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path))
    spec = parse_cluster('[[nodes]]\nname = "desktop"\nhost = "d"\nmac = "aa:bb:cc:dd:ee:ff"\n',
                         file=str(tmp_path / "cluster.toml"))
    asleep = AsleepNodes(spec)
    at = time.mktime((2026, 11, 27, 1, 30, 0, 0, 0, -1))
    asleep.mark("desktop", at=at, by_itself=True)
    spell = AsleepNodes(spec).spell("desktop")
    assert spell.by_itself and spell.reason() == "went to sleep by itself at 01:30"
    asleep.path.write_text(json.dumps({"desktop": at}))  # what an older homegpu wrote
    assert AsleepNodes(spec).spell("desktop").reason() == "put to sleep by homegpu at 01:30"

"""The [alerts] command (remote/alerts/command.py) and the watcher that runs it (remote/alerts/watcher.py).

Real processes: the command is this interpreter running a small script that writes its arguments and
HOMEGPU_* environment to a file, as a user's notify-send or curl would receive them. GPU samples are
the stats agent's real lines recorded on an H100 (tests/fixtures/tui/), made hot by changing only the
temperature.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import sys
from pathlib import Path


from helpers import wait_until
from homegpu.remote.alerts.command import TITLES, alert_argv, alert_env, alert_values, fill, run_command
from homegpu.remote.alerts.watcher import AlertWatcher
from homegpu.remote.config.alert_rules import KINDS, PLACEHOLDERS, QUEUED_RUN_KINDS, AlertRules
from homegpu.remote.config.cluster_spec import parse_cluster
from homegpu.remote.events import (
    RUN_ALERTS, Alert, AlertCommandFailed, AlertState, EventHub, NodeState, NodeStateChanged, NodeStatsUpdated,
    QueueRunChanged,
)
from timeline_events import recorded_stats

T0 = 1_795_316_000.0
H100 = recorded_stats("h100_mig_load")

RECORDER = """\
import json, os, sys
with open(sys.argv[1], "a") as out:
    out.write(json.dumps({"argv": sys.argv[2:],
                          "env": {k: v for k, v in os.environ.items() if k.startswith("HOMEGPU_")}}) + "\\n")
"""


def at(temp: float, second: float = 0, node: str = "desk") -> NodeStatsUpdated:
    gpu = dataclasses.replace(H100.gpus[0], temp=temp)
    return NodeStatsUpdated(node, dataclasses.replace(H100, gpus=(gpu,)), at=T0 + second)


def recorder(tmp_path: Path) -> tuple[list[str], Path]:
    script, out = tmp_path / "record.py", tmp_path / "alerts.jsonl"
    script.write_text(RECORDER)
    return [sys.executable, str(script), str(out)], out


def recorded(out: Path) -> list[dict]:
    return [json.loads(line) for line in out.read_text().splitlines()] if out.exists() else []


FIRED = Alert("gpu_temperature", AlertState.FIRING, "desk GPU 0 is at 91 °C (alert at 85 °C)", node="desk", gpu=0,
              job="train", run_id="train-1", value=91.0, threshold=85.0, at=T0)


def test_placeholders_are_filled_per_argument_and_braces_can_be_literal():
    values = alert_values(FIRED, "lab")
    assert fill("{title}", values) == "homegpu lab: GPU too hot"
    assert fill("{node}/{gpu} {value}>{threshold} {{raw}} {state}", values) == "desk/0 91>85 {raw} firing"
    cleared = dataclasses.replace(FIRED, state=AlertState.CLEARED, message="cooled")
    assert fill("{title}: {message}", alert_values(cleared, "lab")) == "homegpu lab: GPU too hot (cleared): cooled"
    # a value is never read as a template or split: it stays one argument, whatever it holds
    odd = dataclasses.replace(FIRED, message="{node} $(reboot) ; rm -rf ~")
    assert alert_argv(("notify-send", "{message}"), alert_values(odd, "lab")) == [
        "notify-send", "{node} $(reboot) ; rm -rf ~"]


def test_the_environment_carries_the_alert_and_keeps_the_controllers_own():
    env = alert_env(alert_values(FIRED, "lab"), base={"PATH": "/bin", "DISPLAY": ":0"})
    assert env["PATH"] == "/bin" and env["DISPLAY"] == ":0"
    assert {key: env[key] for key in ("HOMEGPU_ALERT", "HOMEGPU_ALERT_STATE", "HOMEGPU_ALERT_NODE",
                                      "HOMEGPU_ALERT_GPU", "HOMEGPU_ALERT_VALUE", "HOMEGPU_ALERT_THRESHOLD",
                                      "HOMEGPU_RUN_ID", "HOMEGPU_JOB", "HOMEGPU_CLUSTER")} == {
        "HOMEGPU_ALERT": "gpu_temperature", "HOMEGPU_ALERT_STATE": "firing", "HOMEGPU_ALERT_NODE": "desk",
        "HOMEGPU_ALERT_GPU": "0", "HOMEGPU_ALERT_VALUE": "91", "HOMEGPU_ALERT_THRESHOLD": "85",
        "HOMEGPU_RUN_ID": "train-1", "HOMEGPU_JOB": "train", "HOMEGPU_CLUSTER": "lab"}
    assert env["HOMEGPU_ALERT_MESSAGE"] == FIRED.message
    assert env["HOMEGPU_ALERT_TIME"].startswith("2026-11-22T")
    assert env["HOMEGPU_QUEUE_ID"] == ""  # not about a queue entry


QUEUED = Alert("queued_run_failed", AlertState.FIRING, "q-12 (train) failed: w1: exit 1", job="train",
               run_id="train-1", queue_id="q-12", at=T0)


def test_a_queued_runs_alert_carries_its_queue_entry():
    values = alert_values(QUEUED, "lab")
    assert fill("{queue_id} {alert} {run_id}: {title}", values) == \
        "q-12 queued_run_failed train-1: homegpu lab: queued run failed"
    env = alert_env(values, base={})
    assert (env["HOMEGPU_QUEUE_ID"], env["HOMEGPU_ALERT"], env["HOMEGPU_RUN_ID"], env["HOMEGPU_JOB"]) == (
        "q-12", "queued_run_failed", "train-1", "train")
    assert set(values) == set(PLACEHOLDERS)  # every placeholder the config lets through has a value
    assert "queued_run_cancelled" in PLACEHOLDERS["alert"] and "q-12" in PLACEHOLDERS["queue_id"]


def test_every_kind_has_a_title_and_a_queued_run_is_about_a_run():
    assert set(TITLES) == set(KINDS)
    assert [TITLES[kind] for kind in QUEUED_RUN_KINDS] == [
        "queued run started", "queued run succeeded", "queued run failed", "queued run cancelled"]
    assert set(QUEUED_RUN_KINDS) <= set(RUN_ALERTS)


async def test_run_command_says_why_it_failed(tmp_path):
    argv, out = recorder(tmp_path)
    assert await run_command([*argv, "hello"], {"HOMEGPU_ALERT": "x"}, 30) is None
    assert recorded(out) == [{"argv": ["hello"], "env": {"HOMEGPU_ALERT": "x"}}]
    failing = [sys.executable, "-c", "import sys; print('x' * 100000, file=sys.stderr); "
                                     "print('bad token', file=sys.stderr); sys.exit(3)"]
    assert await run_command(failing, {}, 30) == f"{sys.executable} exited with status 3: bad token"
    missing = await run_command([str(tmp_path / "no-such-program")], {}, 30)
    assert missing.startswith(f"cannot run {tmp_path / 'no-such-program'}: ") and "No such file" in missing


async def test_a_command_past_its_timeout_is_killed_with_what_it_started(tmp_path):
    pid_file = tmp_path / "child.pid"
    hang = [sys.executable, "-c",
            "import subprocess, sys, time; child = subprocess.Popen(['sleep', '600']); "
            f"open({str(pid_file)!r}, 'w').write(str(child.pid)); time.sleep(600)"]
    problem = await run_command(hang, dict(os.environ), 1.0)
    assert problem == f"{sys.executable} did not finish within 1 s and was killed"
    child = int(pid_file.read_text())
    # the kill is sent; the kernel reaps the orphan through init
    await wait_until(lambda: gone(child), 60, f"the command's own child {child} to end after the timeout")


def gone(pid: int) -> bool:
    """The process has ended (a zombie counts: it runs nothing)."""
    try:
        return "Z" in Path(f"/proc/{pid}/stat").read_text().split()[2]
    except FileNotFoundError:
        return True


def spec_with(rules: AlertRules):
    return dataclasses.replace(parse_cluster('[cluster]\nname = "lab"\n[[nodes]]\nname = "desk"\nhost = "h"\n'),
                               alerts=rules)


async def settle(watcher: AlertWatcher) -> None:
    await asyncio.wait_for(watcher._queue.join(), 30)


async def test_watcher_publishes_each_alert_right_after_its_cause_and_runs_the_command_once(tmp_path):
    argv, out = recorder(tmp_path)
    hub = EventHub()
    events = hub.subscribe()
    watcher = AlertWatcher(spec_with(AlertRules(gpu_temperature=85, command=(*argv, "{state}", "{message}"))),
                           hub).start()
    try:
        for second, temp in enumerate([60, 90, 92, 95, 84, 83, 70, 60]):
            hub.publish(at(temp, second))
        await settle(watcher)
        seen = events.drain(100)
        kinds = [type(event).__name__ + (f":{event.state.value}" if isinstance(event, Alert) else "")
                 for event in seen]
        assert kinds == ["NodeStatsUpdated"] * 2 + ["Alert:firing"] + ["NodeStatsUpdated"] * 5 + \
            ["Alert:cleared"] + ["NodeStatsUpdated"]
        calls = recorded(out)
        assert [call["argv"] for call in calls] == [
            ["firing", "desk GPU 0 is at 90 °C (alert at 85 °C)"],
            ["cleared", "desk GPU 0 cooled to 70 °C (at or below 80 °C)"]]
        assert calls[0]["env"]["HOMEGPU_ALERT"] == "gpu_temperature"
        assert calls[1]["env"]["HOMEGPU_ALERT_STATE"] == "cleared"
    finally:
        await watcher.close()


async def test_a_failing_command_is_said_once_until_it_works_again(tmp_path):
    flag = tmp_path / "works"
    command = (sys.executable, "-c", f"import os, sys; sys.exit(0 if os.path.exists({str(flag)!r}) else 7)")
    hub = EventHub()
    events = hub.subscribe()
    watcher = AlertWatcher(spec_with(AlertRules(gpu_temperature=85, command=command)), hub).start()
    try:
        for second, temp in enumerate([90, 60, 90, 60]):  # four alerts, four failures
            hub.publish(at(temp, second))
        await settle(watcher)
        failures = [e for e in events.drain(100) if isinstance(e, AlertCommandFailed)]
        assert [f.reason for f in failures] == [f"{sys.executable} exited with status 7"]
        flag.touch()
        hub.publish(at(90, 10))  # works: the next failure is news again
        await settle(watcher)
        flag.unlink()
        hub.publish(at(60, 11))
        await settle(watcher)
        assert len([e for e in events.drain(100) if isinstance(e, AlertCommandFailed)]) == 1
    finally:
        await watcher.close()


async def test_close_lets_the_last_alerts_command_finish(tmp_path):
    argv, out = recorder(tmp_path)
    hub = EventHub()
    watcher = AlertWatcher(spec_with(AlertRules(gpu_temperature=85, command=(*argv, "{alert}"))), hub).start()
    hub.publish(at(99))
    await watcher.close()
    assert [call["argv"] for call in recorded(out)] == [["gpu_temperature"]]
    hub.publish(at(40, 5))  # closed: nothing more is derived
    await watcher.close()  # and closing again does nothing
    assert len(recorded(out)) == 1


async def test_node_offline_fires_from_the_clock_when_no_event_comes():
    hub = EventHub()
    events = hub.subscribe()
    now = [T0]
    watcher = AlertWatcher(spec_with(AlertRules(node_offline_seconds=2)), hub, clock=lambda: now[0]).start()
    try:
        hub.publish(NodeStateChanged("desk", NodeState.ONLINE, at=T0))
        hub.publish(NodeStateChanged("desk", NodeState.OFFLINE, "connection lost", at=T0))
        now[0] = T0 + 5
        alerts = await wait_until(lambda: [e for e in events.drain(100) if isinstance(e, Alert)], 60, "the alert")
        assert [(a.kind, a.node, a.value) for a in alerts] == [("node_offline", "desk", 5.0)]
    finally:
        await watcher.close()


async def test_a_queued_run_reaches_the_command_once_per_entry_and_state(tmp_path):
    argv, out = recorder(tmp_path)
    hub = EventHub()
    rules = AlertRules(queued_runs=True, command=(*argv, "{alert}", "{queue_id}", "{message}"))
    watcher = AlertWatcher(spec_with(rules), hub).start()
    try:
        hub.publish(QueueRunChanged("q-12", "train", "train-1", "started", at=T0))
        hub.publish(QueueRunChanged("q-12", "train", "train-1", "started", at=T0 + 1))  # said again: sent once
        hub.publish(QueueRunChanged("q-12", "train", "train-1", "failed", "w1: exit 1", at=T0 + 9))
        hub.publish(QueueRunChanged("q-13", "train", "", "cancelled", "after q-12, which failed", at=T0 + 9))
        await settle(watcher)
        calls = recorded(out)
        assert [call["argv"] for call in calls] == [
            ["queued_run_started", "q-12", "q-12 (train) started as run train-1"],
            ["queued_run_failed", "q-12", "q-12 (train) failed: w1: exit 1"],
            ["queued_run_cancelled", "q-13", "q-13 (train) cancelled: after q-12, which failed"]]
        assert [call["env"]["HOMEGPU_QUEUE_ID"] for call in calls] == ["q-12", "q-12", "q-13"]
        assert calls[2]["env"]["HOMEGPU_RUN_ID"] == ""
    finally:
        await watcher.close()

"""Snapshots of the main screen (with serve's queue too), the launch dialog and the help screen
(pytest-textual-snapshot).

The screens are rendered from recordings, with no cluster: stats lines the real agent printed from
recorded real-GPU nvidia-smi output, the metrics and logs of a real two-worker demo run, and a real
iperf3 result (tests/fixtures/tui/, tests/fixtures/iperf3/). The clock and the theme are pinned, so
the pictures change only when the code does. After a deliberate change of the screen, look at the
new pictures and accept them with `pytest tests/test_tui_snapshots.py --snapshot-update`.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from homegpu.remote.config.cluster_spec import parse_cluster
from homegpu.remote.events import (
    BandwidthMatrix, BandwidthMeasured, JobState, JobStateChanged, LinkResult, LogLine, NodeState, NodeStateChanged,
    NodeStatsUpdated, WorkerMetric,
)
from homegpu.remote.logs.classify import classify
from homegpu.remote.net.bandwidth import parse_iperf3_json
from homegpu.remote.nodes.stats import parse_agent_line
from homegpu.remote.plan.layout import JobLayout
from homegpu.remote.plan.tfconfig import worker_slots
from homegpu.tui.app.main import HomegpuApp
from homegpu.tui.app.screens import LaunchScreen

FIXTURES = Path(__file__).parent / "fixtures"
NOW = 1795316700.0  # 2026-11-22, a little after the recorded run
RUN_ID = "demo-20261122-030416-1749"
# The recorded run's two workers, renamed to this cluster's nodes.
WORKERS = {"local": "desktop", "local#1": "closet"}

CLUSTER = """
[cluster]
name = "home"

[[nodes]]
name = "desktop"
host = "192.168.1.20"

[[nodes]]
name = "closet"
host = "closet"
port = 2222

[[nodes]]
name = "laptop"
host = "laptop.local"

[[nodes]]
name = "attic"
host = "192.168.1.40"

[jobs.demo]
nodes = ["desktop", "closet"]
epochs = 2

[jobs.resnet]
model = "resnet"
epochs = 20
"""


def stats(name: str):
    return parse_agent_line((FIXTURES / "tui" / f"{name}.json").read_text())


def recorded_events() -> list[object]:
    events: list[object] = []
    for node, recording in (("desktop", "h100_mig_load"), ("closet", "h100nvl_idle"), ("laptop", "cpu_only")):
        events.append(NodeStateChanged(node, NodeState.ONLINE))
        line = stats(recording)  # five minutes of it, a second apart: the node detail's first window
        events += [NodeStatsUpdated(node, replace(line, timestamp=line.timestamp - 299 + s)) for s in range(300)]
    events.append(NodeStateChanged("attic", NodeState.HOST_KEY_UNKNOWN, reason="host key not in known_hosts",
                                   fingerprint="SHA256:Jv3rk0Xc4ZT2yq4tU0k5i1T7pZ6Q6oAq9yJ1wz0Xb2c"))
    events.append(JobStateChanged("demo", RUN_ID, JobState.RUNNING, 1, 0))
    for index, worker in enumerate(WORKERS.values()):  # what the run publishes, in each log's order:
        log = (FIXTURES / "tui" / f"demo_worker{index}.log").read_text().splitlines()  # a metric line as its metric
        events += [LogLine(worker, "log", seq, text, worker=worker) if (metric := classify(text)) is None
                   else WorkerMetric("demo", RUN_ID, worker, index, metric) for seq, text in enumerate(log, 1)]
    gbits = parse_iperf3_json((FIXTURES / "iperf3" / "client_loopback_1s.json").read_text()) / 1e9
    links = [LinkResult(src, dst, gbits, at=NOW - 180) for src in ("desktop", "closet")
             for dst in ("desktop", "closet") if src != dst]
    links.append(LinkResult("laptop", "desktop", None, "iperf3 is not installed on laptop", at=NOW - 180))
    events.append(BandwidthMeasured(BandwidthMatrix(tuple(links), at=NOW - 180)))
    return events


def recorded_app() -> HomegpuApp:
    app = HomegpuApp(parse_cluster(CLUSTER, "cluster.toml"), clock=lambda: NOW)
    app.theme = "textual-dark"
    return app


async def show_recording(pilot) -> None:
    pilot.app.take(recorded_events())
    pilot.app.redraw()
    await pilot.pause()


def test_main_screen(snap_compare) -> None:
    assert snap_compare(recorded_app(), terminal_size=(160, 48), run_before=show_recording)


def test_main_screen_at_80_by_24(snap_compare) -> None:
    assert snap_compare(recorded_app(), terminal_size=(80, 24), run_before=show_recording)


def test_launch_dialog(snap_compare) -> None:
    async def open_launch(pilot) -> None:
        await show_recording(pilot)
        spec = pilot.app.spec
        pilot.app.push_screen(LaunchScreen(list(spec.jobs.values()), lambda job: JobLayout(worker_slots(spec, job))))
        await pilot.pause()

    assert snap_compare(recorded_app(), terminal_size=(160, 48), run_before=open_launch)


def queue_entries(spec) -> list:
    """serve's queue over the recorded run: one finished, one cancelled, demo's run, three waiting with the
    reasons serve's scheduler gives for the recorded nodes (attic's host key is unknown: it is offline to it)."""
    from homegpu.remote.queue import EntryState, NodeView, QueueEntry, decide, entry_nodes

    def entry(number, job, state, submitted, **fields):
        return QueueEntry(f"q-{number}", job, fields.pop("overrides", ()), fields.pop("after", ()),
                          fields.pop("priority", 0), NOW - submitted, "alice", state, **fields)

    entries = [
        entry(1, "demo", EntryState.SUCCEEDED, 2000, run_id="demo-20261122-023300-0c1d", started=NOW - 1500,
              ended=NOW - 1300),
        entry(2, "resnet", EntryState.CANCELLED, 1000, reason="cancelled by alice", ended=NOW - 900),
        entry(3, "demo", EntryState.RUNNING, 400, run_id=RUN_ID, started=NOW - 125),
        entry(4, "resnet", EntryState.WAITING, 300, overrides=("epochs=5",)),
        entry(5, "demo", EntryState.WAITING, 200, after=("q-4",)),
        entry(6, "demo", EntryState.WAITING, 100, priority=2),
    ]
    nodes = {name: NodeView(NodeState.ONLINE, stats(recording))
             for name, recording in (("desktop", "h100_mig_load"), ("closet", "h100nvl_idle"), ("laptop", "cpu_only"))}
    nodes["attic"] = NodeView(NodeState.HOST_KEY_UNKNOWN)
    waits = decide(entries, nodes, {e.id: entry_nodes(spec, spec.jobs[e.job]) for e in entries}).waits
    return [replace(e, reason=waits.get(e.id, e.reason)) for e in entries]


async def show_queue(pilot) -> None:
    from homegpu.tui.app.queue_panel import QueuePanel

    await show_recording(pilot)
    pilot.app.query_one(QueuePanel).show(queue_entries(pilot.app.spec), NOW)
    pilot.app.action_queue()
    await pilot.pause()


def test_main_screen_with_the_queue(snap_compare) -> None:
    assert snap_compare(recorded_app(), terminal_size=(160, 48), run_before=show_queue)


def test_main_screen_with_the_queue_at_80_by_24(snap_compare) -> None:
    assert snap_compare(recorded_app(), terminal_size=(80, 24), run_before=show_queue)


def test_help_screen(snap_compare) -> None:
    assert snap_compare(recorded_app(), terminal_size=(160, 48), press=["question_mark"], run_before=show_recording)


async def test_the_log_filter_and_wrap_apply_to_every_tab_of_the_recorded_run() -> None:
    """Not a picture: the log keys on the same recording, asserting what each tab then holds."""
    app = recorded_app()
    async with app.run_test(size=(160, 48)) as pilot:
        await show_recording(pilot)
        await pilot.press("slash", *"epoch 2/2", "enter")
        await pilot.pause()
        merged = app._active_log()
        assert merged.lines == [line for line in merged.lines if "epoch 2/2" in line]
        assert len(merged.lines) == 2  # one line per worker
        app.query_one("#log-tabs").active = "log-tab-2"  # closet's own tab
        await pilot.pause()
        closet = app._active_log()
        assert closet.node_tab == "closet" and len(closet.lines) == 1
        await pilot.press("w")
        await pilot.pause()
        assert closet.wrap and merged.wrap
        assert "wrap on" in app.query_one("#logs").border_title and "epoch 2/2" in app.query_one("#logs").border_title


def alert_events() -> list[object]:
    """Two alerts firing over the recorded run: the H100 made hot (its real sample says 53 °C) and a straggler."""
    from homegpu.remote.events import Alert, AlertState

    return [Alert("gpu_temperature", AlertState.FIRING, "desktop GPU 0 is at 91 °C (alert at 85 °C)", node="desktop",
                  gpu=0, job="demo", run_id=RUN_ID, value=91.0, threshold=85.0, at=NOW - 30),
            Alert("straggler", AlertState.FIRING, "closet is a straggler in demo (run demo-20261122-030416-1749): "
                  "410 examples/s against 1221 for the others", worker="closet", job="demo", run_id=RUN_ID,
                  at=NOW - 10)]


def test_main_screen_with_alerts(snap_compare) -> None:
    async def show_alerts(pilot) -> None:
        pilot.app.take(recorded_events() + alert_events())
        pilot.app.redraw()
        await pilot.pause()

    assert snap_compare(recorded_app(), terminal_size=(160, 48), run_before=show_alerts)


async def test_the_alert_banner_shows_while_alerts_fire_and_a_clear_is_a_toast() -> None:
    """Not a picture: the banner appears with the first alert, and goes when the last one clears."""
    import dataclasses

    from homegpu.remote.events import AlertState

    app = recorded_app()
    hot, slow = alert_events()
    async with app.run_test(size=(160, 48)) as pilot:
        await show_recording(pilot)
        banner = app.query_one("#alerts")
        assert not banner.display
        app.take([hot, slow])
        app.redraw()
        await pilot.pause()
        assert banner.display and "desktop GPU 0 is at 91 °C" in str(banner.render())
        app.take([dataclasses.replace(hot, state=AlertState.CLEARED, message="desktop GPU 0 cooled to 70 °C"),
                  dataclasses.replace(slow, state=AlertState.CLEARED, message="closet keeps pace again")])
        app.redraw()
        await pilot.pause()
        assert not banner.display
        assert [n.message for n in app._notifications] == ["cleared: desktop GPU 0 cooled to 70 °C",
                                                            "cleared: closet keeps pace again"]

"""The TUI and serve's queue: the queue panel (u), cancel (c) and the launch dialog's Queue (u), driven with
Textual's Pilot against a real serve side in the test's own event loop: QueueServer, QueueDesk and QueueStore
listening at socket_path(spec) for a cluster file in tmp_path, whose one node is this machine (no LAN).

What a user sees is read from the widgets and toasts; what serve keeps, from its store. The reasons entries
wait are the ones serve's scheduler (`decide`) gives for this machine's recorded stats.
"""

from __future__ import annotations

import os
import pwd
import shutil
import time
from pathlib import Path

import pytest
from textual.widgets import DataTable

from helpers import wait_until
from homegpu.remote.config import load_cluster
from homegpu.remote.events import NodeState
from homegpu.remote.nodes.stats import parse_agent_line
from homegpu.remote.queue import (
    EntryState, NodeView, QueueClient, QueueDesk, QueueServer, QueueStore, decide, entry_nodes, socket_path,
)
from homegpu.tui.app.controller import Controller
from homegpu.tui.app.main import HomegpuApp
from homegpu.tui.app.queue_panel import QueuePanel, no_serve_line
from homegpu.tui.app.screens import ConfirmScreen, LaunchScreen
from homegpu.tui.view.text import serve_command

SIZE = (160, 48)
STATS = Path(__file__).parent / "fixtures" / "tui" / "cpu_only.json"
RUN_ID = "demo-20261124-120000-a1b2"
CLUSTER = """
[cluster]
name = "qtest"
work_dir = "{work}"

[[nodes]]
name = "here"
host = "local"
runtime = "process"

[jobs.demo]
epochs = 1

[jobs.other]
epochs = 3
"""


@pytest.fixture
def spec(tmp_path: Path):
    path = tmp_path / "cluster.toml"
    path.write_text(CLUSTER.format(work=tmp_path / "work"))
    spec = load_cluster(path)
    yield spec
    shutil.rmtree(socket_path(spec).parent, ignore_errors=True)  # the folder a serve leaves in /tmp


@pytest.fixture
async def store(spec, tmp_path: Path):
    """serve's side of the queue: the store, and the desk answering on the cluster file's socket."""
    store = QueueStore(tmp_path / "data" / "queue.sqlite")
    server = await QueueServer(socket_path(spec), QueueDesk(spec, store)).start()
    yield store
    await server.close()
    store.close()


def make_app(spec, tmp_path: Path) -> HomegpuApp:
    return HomegpuApp(spec, Controller(spec, tmp_path / "experiments"))


def rows(app: HomegpuApp) -> list[list[str]]:
    table = app.query_one("#queue-table", DataTable)
    return [[str(cell) for cell in table.get_row_at(row)] for row in range(table.row_count)]


def toasts(app: HomegpuApp) -> list[str]:
    return [notification.message for notification in app._notifications]


async def test_the_queue_panel_shows_serves_entries_in_start_order_with_why_each_waits(spec, store, tmp_path):
    client = QueueClient(socket_path(spec))  # as `homegpu submit` would
    running = await client.submit("demo")
    later = await client.submit("other", overrides=["epochs=5"])
    after = await client.submit("demo", after=[later.id])
    first = await client.submit("other", priority=5)
    gone = await client.submit("demo")
    store.mark_starting(running.id, RUN_ID, time.time())  # what serve's runner does when it starts one
    store.mark_running(running.id)
    await client.cancel(gone.id)
    here = NodeView(NodeState.ONLINE, parse_agent_line(STATS.read_text()))
    decision = decide(store.entries(), {"here": here},
                      {entry.id: entry_nodes(spec, spec.jobs[entry.job]) for entry in store.entries()})
    store.note_reasons(decision.waits)
    assert set(decision.waits) == {later.id, after.id, first.id} and all(decision.waits.values())

    app = make_app(spec, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        panel = app.query_one(QueuePanel)
        assert not panel.display and app.query_one("#logs").display
        await pilot.press("u")
        assert await wait_until(lambda: len(panel.entries) == 5, 10), panel.note
        assert not app.query_one("#logs").display
        shown = rows(app)
        # running first, then waiting in start order (priority 5 first), then the finished one
        assert [row[0] for row in shown] == [running.id, first.id, later.id, after.id, gone.id]
        assert shown[0][1:3] == ["demo", "running"] and shown[0][4] == RUN_ID
        assert shown[1][1:3] == ["other", "waiting (priority 5)"]
        assert shown[2][1] == "other epochs=5"
        for row in shown[1:4]:
            assert row[5] == decision.waits[row[0]]
        assert shown[3][5] == f"after {later.id}"
        assert shown[4][2] == "cancelled" and shown[4][5].startswith("cancelled by ")
        assert panel.border_title == "queue · 1 running · 3 waiting · 1 finished"
        assert "c cancel" in panel.border_subtitle

        await pilot.resize_terminal(80, 24)  # narrow: the run id gives way, WHY stays in view
        await pilot.pause()
        assert [str(column.label) for column in app.query_one("#queue-table", DataTable).columns.values()] == \
            ["ID", "JOB", "STATE", "FOR", "WHY"]
        assert rows(app)[3][4] == f"after {later.id}"
        await pilot.resize_terminal(*SIZE)

        store.finish(running.id, EntryState.SUCCEEDED, "", time.time())  # serve moves on: the panel follows
        assert await wait_until(lambda: rows(app)[0][0] == first.id, 10)
        assert rows(app)[-2][:3] == [running.id, "demo", "succeeded"]
        await pilot.press("u")
        assert not panel.display and app.query_one("#logs").display
        assert toasts(app) == []
        await pilot.press("q")


async def test_queue_in_the_launch_dialog_submits_the_job_and_says_its_id(spec, store, tmp_path):
    app = make_app(spec, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("l")
        assert await wait_until(lambda: isinstance(app.screen, LaunchScreen), 10)
        await pilot.press("down", "u")  # the second job, queued
        assert await wait_until(lambda: store.entries(), 10)
        [entry] = store.entries()
        assert (entry.id, entry.job, entry.state, entry.overrides) == ("q-1", "other", EntryState.WAITING, ())
        assert entry.user == pwd.getpwuid(os.getuid()).pw_name
        assert await wait_until(lambda: "other queued as q-1 (u shows the queue)" in toasts(app), 5), toasts(app)

        await pilot.press("l")  # the Queue button does the same
        assert await wait_until(lambda: isinstance(app.screen, LaunchScreen), 10)
        await pilot.click("#queue-job")
        assert await wait_until(lambda: len(store.entries()) == 2, 10)
        assert [(e.id, e.job) for e in store.entries()] == [("q-1", "other"), ("q-2", "demo")]
        assert app.controller.run is None  # queued, not launched
        await pilot.press("q")


async def test_while_a_job_runs_the_launch_dialog_can_only_queue(spec, store, tmp_path):
    """The app runs one job; the dialog (what `l` opens then) queues another for serve: Enter queues too."""
    app = make_app(spec, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        app.push_screen(LaunchScreen(list(spec.jobs.values()), app.controller.layout, running="demo"),
                        app._launch_chosen)
        assert await wait_until(lambda: isinstance(app.screen, LaunchScreen) and app.screen.query("#launch"), 10)
        assert app.screen.query_one("#launch").disabled
        assert "demo runs here: queue a job for serve" in str(app.screen.query_one(".title").render())
        await pilot.press("down", "enter")
        assert await wait_until(lambda: store.entries(), 10)
        assert [(e.id, e.job) for e in store.entries()] == [("q-1", "other")]
        assert app.controller.run is None
        await pilot.press("q")


async def test_c_cancels_the_selected_waiting_entry_after_a_confirmation(spec, store, tmp_path):
    client = QueueClient(socket_path(spec))
    keep = await client.submit("demo")
    cancel = await client.submit("other")
    app = make_app(spec, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        panel = app.query_one(QueuePanel)
        await pilot.press("u")
        assert await wait_until(lambda: len(panel.entries) == 2, 10)
        await pilot.press("down", "c")
        assert await wait_until(lambda: isinstance(app.screen, ConfirmScreen), 5)
        assert f"Cancel {cancel.id} (other, waiting)?" in str(app.screen.query_one("#question").render())
        await pilot.press("y")
        assert await wait_until(lambda: store.get(cancel.id).state is EntryState.CANCELLED, 10)
        assert store.get(keep.id).state is EntryState.WAITING
        assert await wait_until(lambda: f"cancelled {cancel.id} (other)" in toasts(app), 5), toasts(app)
        assert await wait_until(lambda: [row[:3] for row in rows(app)] == [[keep.id, "demo", "waiting"],
                                                                           [cancel.id, "other", "cancelled"]], 10)
        await pilot.press("down", "c")  # a finished entry: nothing to ask
        await pilot.pause()
        assert not isinstance(app.screen, ConfirmScreen)
        assert f"{cancel.id} already ended (cancelled): there is nothing to cancel" in toasts(app)
        await pilot.press("q")


async def test_without_a_serve_the_panel_says_how_to_start_one_and_nothing_else(spec, tmp_path):
    app = make_app(spec, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        panel = app.query_one(QueuePanel)
        await pilot.press("u")
        assert await wait_until(lambda: panel.answers >= 1, 10)
        for _ in range(2):  # asked again and again: still the one line, and no toast
            answers = panel.answers
            app._queue_wake.set()
            assert await wait_until(lambda: panel.answers > answers, 10)
        assert panel.note == no_serve_line(serve_command(spec)) == \
            f"no serve runs this cluster's queue: start one with `homegpu --config {spec.source} serve`"
        assert toasts(app) == []

        await pilot.press("l")  # queueing says the same, once
        assert await wait_until(lambda: isinstance(app.screen, LaunchScreen), 10)
        await pilot.press("u")
        assert await wait_until(lambda: toasts(app), 5)
        [toast] = toasts(app)
        assert toast.startswith("demo not queued: no homegpu serve runs this cluster's queue") and \
            f"start one with `homegpu --config {spec.source} serve`" in toast
        await pilot.press("q")

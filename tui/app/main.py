"""`homegpu` with no subcommand: the whole cluster live, and jobs launched and stopped from the keyboard.

The app only draws and asks. Events from the cluster's hub go into a ClusterView (tui/view/state.py) in
batches; a timer redraws the parts that changed, at most REFRESH_SECONDS apart, so a flood of log
lines or a slow node never blocks a keypress. Every action calls the Controller (tui/app/controller.py),
which calls remote/ — the same code the headless runner uses. serve's queue is asked over its socket
every QUEUE_SECONDS while its panel is on screen, by a worker of its own.
"""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path
from typing import Callable, Iterable

from rich.text import Text
from textual import work
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.widget import Widget
from textual.widgets import DataTable, Header, Input, Static, TabbedContent, TabPane

from homegpu.remote.config import ClusterSpec
from homegpu.remote.events import NodeState, Subscription
from homegpu.remote.jobs import LaunchError
from homegpu.remote.net import BandwidthError
from homegpu.remote.nodes import NODE_GONE, visible, wait_set
from homegpu.remote.plan import job_node_specs
from homegpu.remote.queue import EntryState, QueueError
from homegpu.tui.app.controller import Busy, Controller
from homegpu.tui.app.log_pane import LogPane
from homegpu.tui.app.panel import Panel
from homegpu.tui.app.queue_panel import QueuePanel
from homegpu.tui.app.screens import ConfirmScreen, LaunchChoice, LaunchScreen, QuitScreen, TextScreen
from homegpu.tui.view.gpu_trail import TRAIL_WINDOWS
from homegpu.tui.view.lookback import LOOKBACK_WINDOWS, Lookback
from homegpu.tui.view.queue_text import job_words
from homegpu.tui.view.render import (
    NODE_COLUMNS, alert_banner, bandwidth_summary, drawn_alike, job_summary, key_bar, node_cells, node_detail,
)
from homegpu.tui.view.state import ALERTS, BANDWIDTH, JOB, LOGS, NODES, ClusterView, LogBuffers
from homegpu.tui.view.text import format_report, serve_command

REFRESH_SECONDS = 0.25
TALL = 36  # terminal rows from which the loss plot gets four rows instead of one
EVENT_BATCH = 5_000
QUEUE_SECONDS = 2.0  # how often serve's queue is asked while its panel is on screen


class HomegpuApp(App[int]):
    """The TUI. Give it a Controller to drive a cluster; without one it only shows what it is fed
    through `view` (snapshot tests render recorded events that way)."""

    CSS_PATH = Path(__file__).with_name("app.tcss")  # absolute: subclasses elsewhere find it too
    TITLE = "homegpu"
    HORIZONTAL_BREAKPOINTS = [(0, "-narrow"), (110, "-wide")]
    VERTICAL_BREAKPOINTS = [(0, "-short"), (TALL, "-tall")]
    BINDINGS = [
        # In footer order: what an 80-column footer cuts off is still on the help screen.
        Binding("l", "launch", "Launch"),
        Binding("s", "stop", "Stop"),
        Binding("question_mark", "help", "Help", key_display="?"),
        Binding("q", "quit", "Quit"),
        Binding("b", "bandwidth", "Bandwidth"),
        Binding("r", "reconnect", "Reconnect"),
        Binding("d", "doctor", "Doctor"),
        Binding("t", "trust", "Trust key"),
        Binding("f", "follow", "Follow"),
        Binding("slash", "filter", "Filter", key_display="/"),
        Binding("w", "wrap", "Wrap"),
        Binding("e", "save_log", "Save log"),
        Binding("h", "history", "History"),
        Binding("u", "queue", "Queue"),
        Binding("c", "cancel_entry", "Cancel entry", show=False),  # the queue panel's border names it
    ]

    def __init__(self, spec: ClusterSpec, controller: Controller | None = None, *, launch: str | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        super().__init__()
        self.spec, self.controller, self.launch_job, self.clock = spec, controller, launch, clock
        self.view = ClusterView(spec) if controller is None else ClusterView(spec, controller.experiments)
        self.sub_title = f"cluster {spec.name} · {len(spec.nodes)} node{'s' if len(spec.nodes) != 1 else ''}"
        self._dirty = {NODES, JOB, LOGS, BANDWIDTH, ALERTS}
        self._row_heights: dict[str, int] = {}
        self._cells: dict[str, list[Text]] = {}
        self._log_views: dict[str, LogPane] = {}  # by the id of the tab that holds it
        self._quitting = False
        self.detail_window = 0  # which of TRAIL_WINDOWS, then LOOKBACK_WINDOWS, the node detail shows (h cycles)
        self.lookback = Lookback(spec)  # serve's history of this cluster, for the longer windows
        self.farewell = ""  # printed after the app closes: how to come back to a job left running
        self.queue_shown = False  # u: serve's queue in the logs' place
        self._queue_wake = asyncio.Event()  # ask serve now rather than at the next tick
        self._focus_before_queue: Widget | None = None

    # -- layout ------------------------------------------------------------------------------------

    def compose(self) -> ComposeResult:
        yield Header()
        yield Static(id="alerts")
        with Horizontal(id="top"):
            yield DataTable(id="nodes", cursor_type="row", zebra_stripes=True)
            yield Panel(id="detail", classes="panel")
        with Horizontal(id="middle"):
            yield Panel(id="job", classes="panel")
            yield Static(id="bandwidth", classes="panel")
        with Vertical(id="logs"):
            with TabbedContent(id="log-tabs"):
                for index, name in enumerate([LogBuffers.MERGED, *self.view.nodes]):
                    with TabPane(name or "all", id=f"log-tab-{index}") as tab:
                        view = LogPane(self.view.logs.buffers[name], node_tab=name, id=f"log-{index}")
                        self._log_views[tab.id] = view
                        yield view
            yield Input(placeholder="filter the logs (Enter keeps it, Escape clears it)", id="filter")
        yield QueuePanel(serve_command(self.spec), id="queue", classes="panel")
        yield Panel(id="keys")

    async def on_mount(self) -> None:
        table = self.query_one("#nodes", DataTable)
        for column in NODE_COLUMNS:
            table.add_column(column, key=column)
        for panel, title in (("#detail", "node"), ("#job", "job"), ("#bandwidth", "bandwidth"),
                             ("#logs", "logs · follow on")):
            self.query_one(panel).border_title = title
        self.query_one("#filter", Input).display = False
        self.query_one("#alerts").display = False
        self.query_one("#queue").display = False
        keys = [(binding.key_display or binding.key, binding.description) for binding in self.BINDINGS if binding.show]
        self.query_one("#keys", Panel).show(lambda width: key_bar(keys, width))
        self.redraw()
        self.set_interval(REFRESH_SECONDS, self._while_running(self._redraw_panels))
        # Stats arrive once per interval per node: redrawing the table more often would draw the same.
        self.set_interval(max(REFRESH_SECONDS, self.spec.stats_interval), self._while_running(self._redraw_nodes))
        self.set_interval(1.0, self._age_matrix)
        if self.controller is not None:
            self._pump_events(self.controller.subscribe())  # before connecting: no event is missed
            self._poll_queue()
            self.view.bandwidth.finish(*self.controller.saved_bandwidth())  # the last test's, if any; or why not
            await self.controller.__aenter__()
            if self.launch_job:
                self._launch(self.launch_job)
            else:
                self._attach_running()

    def notify(self, message: str, **kwargs) -> None:
        """A toast, as plain text unless a caller asks for markup: messages quote the nodes (errors,
        names), whose markup and control characters must show as they are (remote/nodes/visible.py)."""
        super().notify(visible(message, multiline=True), **{"markup": False, **kwargs})

    def action_help_quit(self) -> None:
        """Ctrl+C: Textual's hint that q quits, which it writes in markup."""
        self.notify("Press q to quit", title="Do you want to quit?")

    # -- events → view → screen --------------------------------------------------------------------

    @work(group="events")
    async def _pump_events(self, events: Subscription) -> None:
        with events:
            while True:
                self.take([await events.get(), *events.drain(EVENT_BATCH)])
                await asyncio.sleep(0)  # let keys and timers in between two batches

    def take(self, events: Iterable[object]) -> None:
        """Apply events to the view; what they changed is redrawn at the next refresh."""
        for event in events:
            self._dirty |= self.view.apply(event)

    def redraw(self) -> None:
        """Draw every part that changed since it was last drawn."""
        self._redraw_nodes()
        self._redraw_panels()

    def _redraw_panels(self) -> None:
        """The job, bandwidth and log panels (the nodes table has its own, slower beat)."""
        dirty, self._dirty = self._dirty - {NODES}, self._dirty & {NODES}
        if JOB in dirty:
            plot = 4 if self.size.height >= TALL else 1
            self.query_one("#job", Panel).show(lambda width: job_summary(self.view.job, width, plot))
        if BANDWIDTH in dirty or JOB in dirty:
            self.query_one("#bandwidth", Static).update(bandwidth_summary(
                self.view.bandwidth, list(self.view.nodes), self.view.job and self.view.job.params, self.clock(),
                self._job_node_names()))
        if LOGS in dirty:
            self._active_log().sync(self.view.logs.version)
        if ALERTS in dirty:
            self._draw_alerts()

    def _draw_alerts(self) -> None:
        """The banner of what fires (hidden when nothing does), and a toast for each notice."""
        banner = self.query_one("#alerts", Static)
        banner.display = bool(self.view.alerts)
        banner.update(alert_banner(list(self.view.alerts.values()), self.size.width - 2))
        while self.view.notices:
            text, severity = self.view.notices.popleft()
            self.notify(text, severity=severity, timeout=10)

    def _while_running(self, draw: Callable[[], None]) -> Callable[[], None]:
        """`draw` for a timer, skipped once the app shuts down: Textual removes the screens' widgets before it stops
        the app's timers, and a draw in between does not find its panel (NoMatches, seen in the suite)."""
        def tick() -> None:
            if self.is_running:
                draw()
        return tick

    def _age_matrix(self) -> None:
        if self.view.bandwidth.matrix is not None:  # its "measured N s ago" moves on
            self._dirty.add(BANDWIDTH)

    def _job_node_names(self) -> list[str]:
        job = self.view.job and self.spec.jobs.get(self.view.job.job)
        return [node.name for node in job_node_specs(self.spec, job)] if job else []

    def _redraw_nodes(self) -> None:
        if NODES in self._dirty:
            self._dirty.discard(NODES)
            self._draw_nodes()
            self._draw_detail()

    def on_resize(self) -> None:
        self._dirty |= {NODES, JOB, BANDWIDTH}

    def _draw_nodes(self) -> None:
        """Update the cells that changed; rebuild the rows only when a node's GPU count did."""
        table = self.query_one("#nodes", DataTable)
        rows = {name: node_cells(node) for name, node in self.view.nodes.items()}
        if any(self._row_heights.get(name) != height for name, (_, height) in rows.items()):
            cursor = table.cursor_row
            table.clear()
            for name, (cells, height) in rows.items():
                table.add_row(*cells, height=height, key=name)
            self._row_heights = {name: height for name, (_, height) in rows.items()}
            self._cells = {name: cells for name, (cells, _) in rows.items()}
            table.move_cursor(row=min(cursor, len(rows) - 1))
            return
        for name, (cells, _) in rows.items():
            for column, cell, shown in zip(NODE_COLUMNS, cells, self._cells[name]):
                if not drawn_alike(cell, shown):
                    table.update_cell(name, column, cell, update_width=True)
            self._cells[name] = cells

    def _draw_detail(self) -> None:
        node = self.selected_node()
        run_id, window = self.view.job.run_id if self.view.job else "", self.detail_window
        self.query_one("#detail", Panel).show(lambda width: node_detail(node, width, run_id, window, self.lookback))
        self._read_lookback()

    def on_data_table_row_highlighted(self) -> None:
        self._draw_detail()

    def on_tabbed_content_tab_activated(self) -> None:
        self._active_log().sync(self.view.logs.version)

    def selected_node(self):
        table = self.query_one("#nodes", DataTable)
        if not table.row_count:
            return None
        key = table.coordinate_to_cell_key((table.cursor_row, 0)).row_key.value
        return self.view.nodes.get(key)

    def _active_log(self) -> LogPane:
        active = self.query_one("#log-tabs", TabbedContent).active
        return self._log_views.get(active) or next(iter(self._log_views.values()))

    # -- jobs --------------------------------------------------------------------------------------

    def action_launch(self) -> None:
        if not self._has_controller():
            return
        if not self.spec.jobs:
            self.notify(f"{self.spec.source} declares no [jobs.NAME]", severity="warning")
            return
        running = self.controller.run.job.name if self.controller.job_running else ""  # then it can only queue
        self.push_screen(LaunchScreen(list(self.spec.jobs.values()), self.controller.layout, running),
                         self._launch_chosen)

    def _launch_chosen(self, choice: LaunchChoice | None) -> None:
        if choice is not None:
            (self._submit if choice.queue else self._launch)(choice.job)

    @work(group="job")
    async def _launch(self, name: str) -> None:
        job = self.spec.jobs.get(name)
        if job is None:
            self.notify(f"no job named {name!r} in {self.spec.source}", severity="error")
            return
        self.notify(f"launching {name}: preflight on every node …")
        try:
            attached = await self.controller.launch(job)
        except (Busy, LaunchError) as exc:
            self.notify(f"{name} not started: {exc}", severity="error", timeout=15)
            return
        self.notify(f"{name} was already running: attached" if attached else f"{name} started")

    @work(group="job")
    async def _attach_running(self) -> None:
        run = await self.controller.attach_running()
        if run is not None:
            self.notify(f"{run.job.name} was already running (run {run.run_id}): attached")

    def action_stop(self) -> None:
        if not self._has_controller():
            return
        if not self.controller.job_running:
            self.notify("no job is running", severity="warning")
            return
        run = self.controller.run
        question = f"Stop {run.job.name} (run {run.run_id})? Every worker gets TERM, then KILL."
        self.push_screen(ConfirmScreen(question, yes="Stop job", no="Keep running"), self._stop_confirmed)

    def _stop_confirmed(self, yes: bool | None) -> None:
        if yes:
            self.controller.stop_job()
            self.notify("stopping every worker …")

    # -- serve's queue -----------------------------------------------------------------------------

    def action_queue(self) -> None:
        """u: serve's queue in the logs' place, or the logs back."""
        self.queue_shown = not self.queue_shown
        panel = self.query_one(QueuePanel)
        if self.queue_shown:
            self._focus_before_queue = self.focused
        panel.display = self.queue_shown
        self.query_one("#logs").display = not self.queue_shown
        if self.queue_shown:
            self._queue_wake.set()
            self.query_one("#queue-table", DataTable).focus()
            return
        before = self._focus_before_queue
        (before if before is not None and before.is_attached else self.query_one("#nodes", DataTable)).focus()

    @work(group="queue-poll", exclusive=True)
    async def _poll_queue(self) -> None:
        """Ask serve for its queue every QUEUE_SECONDS while the panel shows (at once when woken). A failure
        is the panel's line until serve answers again: never a toast, however often it is asked."""
        panel = self.query_one(QueuePanel)
        while True:
            self._queue_wake.clear()
            if self.queue_shown:
                try:
                    answer = await self.controller.queue.entries()
                except QueueError as exc:
                    answer = exc
                panel.show(answer, self.clock())
            await wait_set(self._queue_wake, QUEUE_SECONDS)

    @work(group="queue")
    async def _submit(self, name: str) -> None:
        """The launch dialog's Queue: the job goes to serve's queue, which starts it when its nodes are free."""
        try:
            entry = await self.controller.queue.submit(name)
        except QueueError as exc:
            self.notify(f"{name} not queued: {exc}", severity="error", timeout=15)
            return
        self.notify(f"{name} queued as {entry.id}" + ("" if self.queue_shown else " (u shows the queue)"))
        self._queue_wake.set()

    def action_cancel_entry(self) -> None:
        """c: cancel the queue entry selected in the queue panel, after a confirmation."""
        if not self._has_controller():
            return
        entry = self.query_one(QueuePanel).selected() if self.queue_shown else None
        if entry is None:
            self.notify("no queue entry selected: u shows serve's queue, ↑/↓ selects one", severity="warning")
            return
        if entry.state.finished:
            self.notify(f"{entry.id} already ended ({entry.state.value}): there is nothing to cancel",
                        severity="warning")
            return
        question = f"Cancel {entry.id} ({job_words(entry)}, {entry.state.value})?"
        if entry.state.active:
            question += f" serve stops its run {entry.run_id}: every worker gets TERM, then KILL."
        self.push_screen(ConfirmScreen(question, yes="Cancel entry", no="Keep it"),
                         lambda yes: yes and self._cancel(entry.id))

    @work(group="queue")
    async def _cancel(self, id_: str) -> None:
        try:
            entry = await self.controller.queue.cancel(id_)
        except QueueError as exc:
            self.notify(f"{id_} not cancelled: {exc}", severity="error", timeout=15)
            return
        if entry.state is EntryState.CANCELLED:
            self.notify(f"cancelled {entry.id} ({entry.job})")
        else:
            self.notify(f"cancelling {entry.id} ({entry.job}): serve is stopping its run {entry.run_id}")
        self._queue_wake.set()

    # -- nodes -------------------------------------------------------------------------------------

    def action_reconnect(self) -> None:
        node = self.selected_node()
        if node is not None and self._has_controller():
            self.controller.reconnect(node.name)
            self.notify(f"reconnecting {node.name} …")

    @work(group="bandwidth", exclusive=True)
    async def action_bandwidth(self) -> None:
        if not self._has_controller() or self.view.bandwidth.running:
            return
        if len(self.spec.nodes) < 2:
            self.notify("one node: there is no link to measure", severity="warning")
            return
        self.view.bandwidth.begin(self.controller.link_count())
        self._dirty.add(BANDWIDTH)

        def progress(src: str, dst: str, result) -> None:
            self.view.bandwidth.link(src, dst, result)
            self._dirty.add(BANDWIDTH)

        try:
            self.view.bandwidth.finish(await self.controller.measure_bandwidth(progress))
        except (BandwidthError, ValueError, *NODE_GONE) as exc:
            self.view.bandwidth.finish(None, f"bandwidth test failed: {exc}")
        self._dirty.add(BANDWIDTH)

    @work(group="doctor", exclusive=True)
    async def action_doctor(self) -> None:
        if not self._has_controller():
            return
        self.notify("doctor: checking every node …")
        checks = await self.controller.doctor()
        await self.push_screen(TextScreen("doctor", format_report(self.spec, checks)))

    @work(group="trust", exclusive=True)
    async def action_trust(self) -> None:
        node = self.selected_node()
        if node is None or not self._has_controller():
            return
        if node.state is NodeState.HOST_KEY_CHANGED:
            self.notify(f"{node.name}'s host key CHANGED: homegpu never replaces a key; check why, then edit "
                        f"{self.spec.ssh.known_hosts} yourself", severity="error", timeout=15)
            return
        if node.state is not NodeState.HOST_KEY_UNKNOWN:
            self.notify(f"{node.name}'s host key is not unknown ({node.state.value}): nothing to trust")
            return
        try:
            offered = await self.controller.offered_key(node.name)
        except NODE_GONE as exc:
            self.notify(f"{node.name}: {exc}", severity="error")
            return
        question = Text.assemble(f"{node.name} offers a {offered.key.get_algorithm()} host key:\n\n",
                                 (offered.fingerprint, "bold"),
                                 f"\n\nTrust it and add it to {self.spec.ssh.known_hosts}?")
        if await self.push_screen_wait(ConfirmScreen(question, yes="Trust", no="Cancel")):
            self.controller.trust(node.name, offered)
            self.notify(f"trusted {node.name}'s key; reconnecting …")

    # -- logs --------------------------------------------------------------------------------------

    def action_follow(self) -> None:
        self._set_log_option("follow", not self._active_log().follow)

    def action_wrap(self) -> None:
        self._set_log_option("wrap", not self._active_log().wrap)

    def _set_log_option(self, name: str, value: object) -> None:
        """Set follow, wrap or pattern on every log tab; only the one on screen rebuilds now."""
        for view in self._log_views.values():
            setattr(view, name, value)
        self._active_log().sync()
        self._log_title()

    def action_filter(self) -> None:
        box = self.query_one("#filter", Input)
        box.display = True
        box.focus()

    def on_input_changed(self, event: Input.Changed) -> None:
        self._set_log_option("pattern", event.value)

    def on_input_submitted(self) -> None:
        self._active_log().focus()

    def on_key(self, event) -> None:
        box = self.query_one("#filter", Input)
        if event.key == "escape" and box.has_focus:
            box.value = ""
            box.display = False
            self._active_log().focus()
            event.stop()

    def _log_title(self) -> None:
        first = self._active_log()
        parts = [f"follow {'on' if first.follow else 'off'}", f"wrap {'on' if first.wrap else 'off'}"]
        if first.pattern:
            parts.append(f"filter “{first.pattern}”")
        self.query_one("#logs").border_title = "logs · " + " · ".join(parts)

    def action_save_log(self) -> None:
        view = self._active_log()
        folder = self.controller.run.experiment.folder.path if self._has_run_dir() else Path.cwd()
        tab = view.node_tab or "all"
        path = Path(folder) / f"{tab}-{time.strftime('%Y%m%d-%H%M%S', time.localtime(self.clock()))}.log"
        try:
            path.write_text("".join(line + "\n" for line in view.lines))
        except OSError as exc:
            self.notify(f"could not save the log: {exc}", severity="error")
            return
        self.notify(f"saved {len(view.lines)} lines to {path}")

    def _has_run_dir(self) -> bool:
        return bool(self.controller and self.controller.run and self.controller.run.experiment)

    # -- help and quit -----------------------------------------------------------------------------

    def action_history(self) -> None:
        """The node detail's sparklines span the next window: 5 min, 1 h, all since the TUI opened, then a
        day and a week from serve's history where it records this cluster."""
        windows = len(TRAIL_WINDOWS) + (len(LOOKBACK_WINDOWS) if self.lookback.available else 0)
        self.detail_window = (self.detail_window + 1) % windows
        self._draw_detail()

    def _read_lookback(self) -> None:
        """A stored window on screen: read it from the store (in a thread) unless read lately, then redraw;
        today's energy too, whatever the window."""
        if self.lookback.today_due():
            self.run_worker(self._reread_today(), group="lookback-today")
        lookback_window = self.detail_window - len(TRAIL_WINDOWS)
        if lookback_window < 0 or not self.lookback.available:
            return
        seconds = LOOKBACK_WINDOWS[lookback_window][1]
        if self.lookback.due(seconds):
            self.run_worker(self._reread(seconds), group="lookback")

    async def _reread(self, seconds: float) -> None:
        await self.lookback.read(seconds)
        self._draw_detail()

    async def _reread_today(self) -> None:
        await self.lookback.read_today()
        self._draw_detail()

    def action_help(self) -> None:
        self.push_screen(TextScreen("keys", HELP))

    async def action_quit(self) -> None:
        if self._quitting:
            return
        if self.controller is not None and self.controller.job_running:
            self.push_screen(QuitScreen(self.controller.run.job.name),
                             lambda choice: choice and self._quit(stop_job=choice == "stop"))
            return
        self._quit(stop_job=False)

    @work(group="quit", exclusive=True)
    async def _quit(self, stop_job: bool) -> None:
        self._quitting = True
        if self.controller is not None:
            if stop_job:
                self.notify("stopping every worker, then quitting …")
            elif self.controller.job_running:
                self.farewell = left_running_note(self.controller.run.job.name, self.controller.run.run_id)
            await self.controller.close(stop_job=stop_job)
        self.exit(0)

    def _has_controller(self) -> bool:
        if self.controller is None:
            self.notify("not connected to a cluster", severity="warning")
        return self.controller is not None


HELP = """\
Nodes
  ↑/↓      select a node (its GPUs' history and processes show on the right)
  h        the history's window: 5 min, 1 h, or all since the TUI opened (up to 24 h)
  r        reconnect the selected node now
  t        trust the selected node's unknown host key, after showing its fingerprint
  d        run doctor on every node
  b        measure the bandwidth between the nodes with iperf3

Jobs
  l        launch a job: choose it, see its workers and TF_CONFIG, confirm
  s        stop the running job (after a confirmation)

Queue (homegpu serve's)
  u        the queue in the logs' place, and back: running, waiting in start order, finished, and why
  ↑/↓ c    select an entry; cancel it (after a confirmation)
  l, u     queue a job for serve to start when its nodes are free, instead of launching it now

Logs
  tab      move between the panels; ←/→ on the tabs picks a node's log or "all"
  f        follow on/off       /  filter (Enter keeps it, Escape clears it)
  w        wrap on/off         e  save the shown lines to a file

  ?        this help           q  quit (asks whether to leave a running job running)"""


def run_app(spec: ClusterSpec, experiments: Path, launch: str | None = None) -> int:
    """Open the TUI on `spec` until the user quits; `launch` names a job to launch (or attach to) first."""
    app = HomegpuApp(spec, Controller(spec, experiments), launch=launch)
    status = app.run() or 0
    if app.return_code:  # it crashed: Textual printed the traceback and gives no status of its own
        print("homegpu: the terminal UI ended with the error above; `homegpu run JOB --no-tui` and `homegpu status` "
              "work without it", file=sys.stderr)
        return app.return_code
    if app.farewell:
        print(app.farewell)
    return status


def left_running_note(job: str, run_id: str) -> str:
    """What to type to come back to a job left running, or to stop it."""
    return (f"{job} is still running on its nodes (run {run_id}).\n"
            f"  follow it again:  homegpu run {job}   (or just: homegpu)\n"
            f"  its logs:         homegpu logs {job} -f\n"
            f"  stop it:          homegpu stop {job}")

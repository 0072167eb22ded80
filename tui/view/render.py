"""Rich text for each panel, from the plain data in tui/view/state.py (pure: no widgets, no I/O).

Thresholds colour what needs a glance: green is fine, yellow is busy or warm, red is full or hot.
A node that is not online is drawn dim, with its last known figures, so it greys out in place. A node
with a GPU held back (a clock event reason, a slow link: remote/nodes/health.py) has HELD_MARK by its
name, and its detail says what and the fix under that GPU.
"""

from __future__ import annotations

from typing import Sequence

from rich.text import Text

from homegpu.remote.events import NA, Alert, BandwidthMatrix, GpuStats, JobState, NodeState
from homegpu.remote.net import RESNET50_PARAMS, advice
from homegpu.remote.nodes import budget_text, card_budgets, gib, is_run_worker, owner_text
from homegpu.remote.plan import short_gpu_name
from homegpu.tui.view.gpu_trail import TRAIL_WINDOWS, GpuTrail
from homegpu.tui.view.lookback import LOOKBACK_WINDOWS, Lookback
from homegpu.tui.view.plot import braille_plot, progress_bar, sparkline, squeeze
from homegpu.tui.view.state import BandwidthView, JobView, NodeView, trail_key
from homegpu.tui.view.text import STATE_MARKS, balance_text, format_matrix

# (warn, bad) thresholds: at or above warn is yellow, at or above bad is red.
UTIL_LEVELS = (50.0, 90.0)
MEM_LEVELS = (75.0, 90.0)
TEMP_LEVELS = (75.0, 85.0)
POWER_LEVELS = (80.0, 95.0)

STATE_STYLES = {
    NodeState.ONLINE: "green", NodeState.CONNECTING: "yellow", NodeState.OFFLINE: "red",
    NodeState.AUTH_FAILED: "bold red", NodeState.HOST_KEY_UNKNOWN: "bold yellow",
    NodeState.HOST_KEY_CHANGED: "bold red", NodeState.ASLEEP: "blue",
}
JOB_STYLES = {
    JobState.RUNNING: "green", JobState.SUCCEEDED: "bold green", JobState.FAILED: "bold red",
    JobState.RESTARTING: "yellow", JobState.STOPPED: "yellow",
}
# Alerts that are news rather than trouble: (mark, the line's style, the message's own); any other is a red "⚠".
ALERT_TONES = {
    "job_succeeded": ("✓ ", "bold green", ""), "queued_run_succeeded": ("✓ ", "bold green", ""),
    "queued_run_started": ("▸ ", "bold", ""),
}
REASON_WIDTH = 24
HELD_MARK = " ▼"  # by a node's name: a GPU of it is held back (its detail says why)
NODE_COLUMNS = ("NODE", "GPU", "UTIL", "MEM", "TEMP", "POWER", "CPU", "RAM")


def level_style(value: object, levels: tuple[float, float]) -> str:
    """"green", "yellow" or "red" for a number against (warn, bad); "dim" when not available."""
    if not isinstance(value, (int, float)):
        return "dim"
    warn, bad = levels
    return "red" if value >= bad else "yellow" if value >= warn else "green"


def pct(value: object) -> str:
    """"42%", or "n/a" where the node cannot measure it (MIG hides utilisation, for one)."""
    return f"{value:3.0f}%" if isinstance(value, (int, float)) else f"{value:>4}"


def age(seconds: float) -> str:
    """"just now", "42 s ago", "3 min ago", "2 h ago"."""
    if seconds < 2:
        return "just now"
    if seconds < 90:
        return f"{seconds:.0f} s ago"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min ago"
    return f"{seconds / 3600:.0f} h ago"


def drawn_alike(cell: Text | str, shown: Text | str) -> bool:
    """Whether a table cell would draw as the one shown: rich's Text compares text and spans only, so a cell
    greyed out (its base style "dim") would otherwise equal its last coloured self and never be redrawn."""
    return cell == shown and getattr(cell, "style", None) == getattr(shown, "style", None)


# -- nodes table ---------------------------------------------------------------------------------


def node_cells(node: NodeView) -> tuple[list[Text], int]:
    """The nodes table's cells for one node (one line per GPU) and the row's height."""
    grey = not node.online
    mark = Text(f"{STATE_MARKS.get(node.state.value, '?')} ", style=STATE_STYLES.get(node.state, ""))
    name = mark + Text(node.name, style="dim" if grey else "bold")
    if node.health.causes():
        name.append(HELD_MARK, style="bold yellow")
    stats = node.stats
    if stats is None:
        why = node.stats_problem or node.reason or ("waiting for stats" if node.online else node.state.value)
        why = why if len(why) <= REASON_WIDTH else why[:REASON_WIDTH - 1] + "…"  # all of it: node detail
        return [name, Text(why, style="dim" if grey else "italic"), *_blank(4), *_host_cells(node)], 1
    if not stats.gpus:
        gpu_cells = [Text("CPU only", style="dim italic"), *_blank(4)]
    else:
        gpu_cells = [_lines(stats.gpus, column) for column in _GPU_COLUMNS]
    cells = [name, *gpu_cells, *_host_cells(node)]
    if grey:
        cells = [name, *(Text(cell.plain, style="dim") for cell in cells[1:])]
    return cells, max(1, len(stats.gpus))


def _blank(count: int) -> list[Text]:
    return [Text("") for _ in range(count)]


def _host_cells(node: NodeView) -> list[Text]:
    stats = node.stats
    if stats is None:
        return _blank(2)
    cpu = Text(pct(stats.cpu), style=level_style(stats.cpu, UTIL_LEVELS))
    ram = Text(f"{gib(stats.mem_used)}/{gib(stats.mem_total)}G", style=level_style(stats.mem_percent, MEM_LEVELS))
    return [cpu, ram]


def _gpu_name(gpu: GpuStats) -> Text:
    return Text(f"{gpu.index} {short_gpu_name(gpu.name)[:14]}")


def _gpu_util(gpu: GpuStats) -> Text:
    return Text(pct(gpu.util), style=level_style(gpu.util, UTIL_LEVELS))


def _gpu_mem(gpu: GpuStats) -> Text:
    return Text(f"{gib(gpu.mem_used)}/{gib(gpu.mem_total)}G", style=level_style(gpu.mem_percent, MEM_LEVELS))


def _gpu_temp(gpu: GpuStats) -> Text:
    return Text(f"{gpu.temp:3.0f}°C", style=level_style(gpu.temp, TEMP_LEVELS))


def _gpu_power(gpu: GpuStats) -> Text:
    return Text(f"{gpu.power:3.0f}/{gpu.power_limit:3.0f}W", style=level_style(gpu.power_percent, POWER_LEVELS))


_GPU_COLUMNS = (_gpu_name, _gpu_util, _gpu_mem, _gpu_temp, _gpu_power)


def _lines(gpus: Sequence[GpuStats], column) -> Text:
    return Text("\n").join(column(gpu) for gpu in gpus)


# -- node detail ---------------------------------------------------------------------------------


def _gpu_cells(node: NodeView, gpu, seconds: float | None, width: int,
               lookback: Lookback | None) -> tuple[list, list]:
    """A GPU's utilisation and memory cells over the last `seconds` (None: all there is): from the TUI's own
    trail, or from `lookback` where given (serve's, read by the app for that window)."""
    if lookback is not None:
        series = lookback.series.get((node.name, gpu.index))
        return (squeeze(series.util, width), squeeze(series.mem, width)) if series else ([], [])
    trail = node.trail.get(trail_key(gpu)) or GpuTrail()
    return trail.util.window(seconds, width), trail.mem.window(seconds, width)


def _power_line(node: str, stats, lookback: Lookback | None) -> str:
    """`power 702 W now · today 3.41 kWh`: the GPUs' draw (and the rest of the machine's where idle_watts estimates
    it), and the node's energy since midnight where serve records it; "" when neither is known."""
    today = (f"today {lookback.today[node]:.2f} kWh (homegpu serve's history)"
             if lookback is not None and node in lookback.today else "")
    parts = [part for part in (_power_now(stats), today) if part]
    return "\npower " + " · ".join(parts) if parts else ""


def _power_now(stats) -> str:
    host = "" if stats.host_power is NA else f"{stats.host_power:.0f} W"
    if not stats.gpus:
        return f"{host} now (the machine, estimated)" if host else ""
    watts = [gpu.power for gpu in stats.gpus if gpu.power is not NA]
    gpus = f"{sum(watts):.0f} W now" if watts else "n/a (the GPUs do not report it)"
    return gpus + (f" + {host} rest of the machine (estimated)" if host else "")


def node_detail(node: NodeView | None, width: int = 40, run_id: str = "", window: int = 0,
                lookback: Lookback | None = None) -> Text:
    """The selected node: versions and stats source, per-GPU history sparklines, GPU processes and
    who owns each.

    Args:
        run_id: the run on screen, if any: its workers read as "this job's".
        window: which of TRAIL_WINDOWS, then LOOKBACK_WINDOWS, the sparklines span (the h key cycles them).
        lookback: serve's history of this cluster, whose windows follow the trail's where serve records one.
    """
    if node is None:
        return Text("no node selected", style="dim")
    out = Text.assemble((node.name, "bold"), f"  {node.host}  ",
                        (node.state.value, STATE_STYLES.get(node.state, "")))
    if node.reason:
        out.append(f"\n{node.reason}", style="dim" if node.online else "red")
    if node.state is NodeState.HOST_KEY_UNKNOWN:
        out.append("\npress t to see its fingerprint and trust it", style="bold")
    stats = node.stats
    if stats is None:
        out.append("\n" + (node.stats_problem or "no stats yet"), style="dim")
        return out
    out.append(f"\nCPU {stats.cpu:.0f}%  load {stats.load[0]:.2f}  RAM {gib(stats.mem_used)}/"
               f"{gib(stats.mem_total)} GiB  disk free {gib(stats.disk_free)} GiB")
    if not stats.gpus:
        out.append("\nCPU only: no GPU found (it can still train on its CPU)", style="dim")
        out.append(_power_line(node.name, stats, lookback))
        return out
    out.append(f"\nGPUs via {stats.source} · driver {stats.driver} · CUDA {stats.cuda}")
    out.append(_power_line(node.name, stats, lookback))
    windows = TRAIL_WINDOWS + (LOOKBACK_WINDOWS if lookback is not None and lookback.available else ())
    window %= len(windows)
    label = windows[window][0] + (" (homegpu serve's history)" if window >= len(TRAIL_WINDOWS) else "")
    out.append(f"\nhistory: {label} (h: {' · '.join(name for name, _ in windows)})", style="dim")
    if window >= len(TRAIL_WINDOWS) and lookback.problem:
        out.append(f"\n{lookback.problem}", style="red")
    spark = max(8, width - 16)
    for gpu in stats.gpus:
        util, mem = _gpu_cells(node, gpu, windows[window][1], spark, lookback if window >= len(TRAIL_WINDOWS) else None)
        out.append(f"\n[{gpu.index}] {gpu.name}", style="bold")
        if budgets := card_budgets(gpu):
            out.append(f" · {budgets}")
        for cause in node.health.causes([gpu.index]):  # its stats were made visible on the way in
            out.append(f"\n held back: {cause}", style="yellow")
        out.append(f"\n util {sparkline(util, spark)} ")
        out.append(pct(gpu.util), style=level_style(gpu.util, UTIL_LEVELS))
        out.append(f"\n mem  {sparkline(mem, spark)} ")
        out.append(pct(gpu.mem_percent), style=level_style(gpu.mem_percent, MEM_LEVELS))
        for proc in gpu.processes:
            memory = f"{gib(proc.mem)} GiB" if proc.mem is not NA else "memory n/a"
            out.append(f"\n  pid {proc.pid} {proc.name} ({memory})", style="cyan")
            if proc.owner is not None:
                ours = is_run_worker(proc, run_id)
                out.append(f" {owner_text(proc.owner, run_id)}", style="bold green" if ours else "yellow")
                if budget := budget_text(proc.owner):
                    out.append(f", {budget}")
        if not gpu.processes:
            out.append("\n  no processes", style="dim")
    return out


# -- job -----------------------------------------------------------------------------------------


def job_summary(job: JobView | None, width: int = 60, plot_height: int = 4) -> Text:
    """Name, run, state, generation; the epoch bar; the loss curve; examples/s per worker."""
    if job is None:
        return Text("no job yet: press l to launch one", style="dim")
    out = Text.assemble((job.job, "bold"), f"  run {job.run_id}  ",
                        (job.state.value, JOB_STYLES.get(job.state, "yellow")),
                        f"  generation {job.generation} · restarts {job.restarts}")
    if job.detail:
        out.append(f"\n{job.detail}", style="red" if job.state is JobState.FAILED else "dim")
    for result in job.preflight.values():
        if result.problems:
            out.append("\n✗ " + "; ".join(result.problems), style="red")
        for warning in result.warnings:
            out.append("\n⚠ " + warning, style="yellow")
    if job.epochs is None and not job.loss:
        if job.active:
            out.append("\nwaiting for the first metrics …", style="dim")
        return out
    out.append("\n")
    out.append_text(_epoch_line(job, width))
    out.append_text(_loss_plot(job, width, plot_height))
    out.append_text(_rates(job))
    return out


def _epoch_line(job: JobView, width: int) -> Text:
    done = job.loss[-1][0] if job.loss else float(job.epoch)
    done = max(done, float(job.epoch))
    total = job.epochs or 0
    label = f" epoch {job.epoch}/{total or '?'}"
    accuracy = f"  accuracy {job.accuracy:.4f}" if job.accuracy is not None else ""
    bar = progress_bar(done, total, max(10, width - len(label) - len(accuracy) - 1))
    return Text.assemble((bar, "green"), label, accuracy)


def _loss_plot(job: JobView, width: int, height: int) -> Text:
    if not job.loss:
        return Text("\nloss: waiting for the first step", style="dim")
    losses = [loss for _, loss in job.loss]
    head = Text(f"\nloss {losses[-1]:.4f}  (min {min(losses):.4f}, max {max(losses):.4f})")
    rows = braille_plot(list(job.loss), max(10, width - 1), height)
    return head + Text("\n" + "\n".join(rows), style="cyan")


def _rates(job: JobView) -> Text:
    if not job.rates:
        return Text("")
    out = Text("\nexamples/s:")
    by_step = bool(job.steps)  # a balanced run that tells each worker's step in parts: a worker a line
    for worker, rate in sorted(job.rates.items()):
        share = job.share_text(worker)
        # slowest in a balanced run: its share follows its speed and nobody waits for it, which is no fault
        slow = worker in job.stragglers and not share
        told = balance_text(share, job.step_text(worker))
        shown = f"{worker} {rate:.0f}" + (f" ({told})" if told else "") + (" (straggler)" if slow else "")
        out.append(f"\n  {shown}" if by_step else f"  {shown}", style="bold red" if slow else "")
    return out


# -- bandwidth -----------------------------------------------------------------------------------


def bandwidth_summary(view: BandwidthView, names: Sequence[str], params: int | None, now: float,
                      job_node_names: Sequence[str] = ()) -> Text:
    """The latest matrix with its age and the test in progress, if one runs; the advice is for the
    links between `job_node_names` (the job on screen), else between all nodes."""
    out = Text()
    if view.running:
        bar = progress_bar(view.done, view.total, 12)
        out.append(f"testing {view.current or '…'}  {bar} {view.done}/{view.total}\n", style="yellow")
    if view.error:
        out.append(f"{view.error}\n", style="red")
    if view.matrix is None:
        hint = "one node: no link to measure" if len(names) < 2 else "not measured yet: press b"
        return out + Text(hint, style="dim")
    out.append(f"measured {age(now - view.matrix.at)}\n", style="dim")
    out.append(format_matrix(view.matrix, names, not_measured="not measured in this test") + "\n")
    matrix = view.matrix
    if job_node_names:
        shown = set(job_node_names)
        matrix = BandwidthMatrix(tuple(r for r in matrix.results if r.src in shown and r.dst in shown))
    if params:
        out.append(advice(params, matrix))
    else:
        out.append(advice(RESNET50_PARAMS, matrix) + " (ResNet-50's size; the job's own count shows "
                   "once it starts)", style="dim")
    return out


def alert_banner(alerts: Sequence[Alert], width: int, shown: int = 3) -> Text:
    """One line per alert firing, the latest first, up to `shown`, then how many more."""
    out = Text()
    latest = list(reversed(alerts))
    for alert in latest[:shown]:
        mark, mark_style, style = ALERT_TONES.get(alert.kind, ("⚠ ", "bold red", "bold"))
        line = Text(mark, style=mark_style)
        line.append(alert.message, style=style)
        line.truncate(max(width, 10), overflow="ellipsis")
        out.append_text(line)
        out.append("\n")
    if len(latest) > shown:
        out.append(f"  and {len(latest) - shown} more", style="dim")
    out.rstrip()
    return out


def key_bar(keys: Sequence[tuple[str, str]], width: int) -> Text:
    """The bottom line of keys: as many `key action` pairs as fit in `width`, in order.

    When some do not fit, the line ends with `? more` (the help screen lists every key), so a
    narrow terminal never shows a key cut mid-word.
    """
    def entry(key: str, action: str) -> Text:
        return Text.assemble((f" {key} ", "bold reverse"), f" {action} ")

    entries = [entry(key, action) for key, action in keys]
    if sum(e.cell_len for e in entries) <= width:
        return Text.assemble(*entries)
    more = entry("?", "more")
    out, used = Text(), more.cell_len
    for (key, _), item in zip(keys, entries):
        if key == "?":
            continue  # `? more` stands for it
        if used + item.cell_len > width:
            break
        out.append_text(item)
        used += item.cell_len
    out.append_text(more)
    return out

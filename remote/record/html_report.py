"""The run report: experiments/RUN-ID/report.html, one self-contained page (inline SVG and CSS, no script,
no network) that shows what the GPUs, the network and the workers did, and why the run was slow. It reads
the run's folder (run_folder.py): the timeline, metrics.jsonl, logs/ and run.json (settings, TF_CONFIGs).
"""

from __future__ import annotations

import dataclasses
import json
from datetime import datetime
from html import escape
from pathlib import Path

from homegpu.remote.config import Tariff
from homegpu.remote.energy import Energy
from homegpu.remote.events import BandwidthMatrix, LinkResult
from homegpu.remote.net import advice, format_gbits
from homegpu.remote.nodes import MIB_PER_GIB
from homegpu.remote.record.energy import RunEnergy, run_energy
from homegpu.remote.record.html_report_analysis import RunFigures, human_duration, run_figures, summary_text, what_limited
from homegpu.remote.record.html_report_inputs import (
    ReportError, log_tails, read_manifest, workers_from_metrics,
)
from homegpu.remote.record.html_report_page import card, figure, page, table
from homegpu.remote.record.html_report_svg import (
    EVENT_COLOURS, SERIES_COLOURS, Line, Marker, format_clock, legend, line_chart,
)
from homegpu.remote.record.run_folder import RunFolder
from homegpu.remote.record.timeline_schema import Series, Timeline, TimelineDamaged, WorkerTimeline, read_timeline

MAX_EVENT_ROWS = 300
_WIDE, _HALF, _QUARTER = 1120, 548, 268


# -- sections -------------------------------------------------------------------------------------

def _header(job: str, run_id: str, figures: RunFigures, start: float | None) -> str:
    when = datetime.fromtimestamp(start).astimezone().strftime("%Y-%m-%d %H:%M %Z") if start else ""
    return (f'<header><h1>{escape(job)}</h1><span class="run">{escape(run_id)}</span>'
            f'<span class="badge {escape(figures.outcome)}">{escape(figures.outcome)}</span>'
            f'<span class="when">started {escape(when)} · {escape(human_duration(figures.duration))}</span></header>')


def _cards(figures: RunFigures, workers: int, nodes: int) -> str:
    def fmt(key: str) -> str:
        value = figures.final.get(key)
        return "–" if value is None else f"{value:.3g}"
    total = sum(figures.rates.values())
    util = "–" if figures.gpu_util is None else f"{figures.gpu_util:.0f} %"
    return '<div class="cards">' + "".join([
        card(human_duration(figures.duration), "duration"), card(str(figures.restarts), "restarts"),
        card(f"{workers} on {nodes}", "workers on nodes"),
        card(f"{total:,.0f}" if total else "–", "examples/s, all workers"),
        card(f"{fmt('loss')} / {fmt('val_loss')}", "final loss / val_loss"), card(util, "mean GPU util while running"),
    ]) + "</div>"


def _energy(energy: RunEnergy | None) -> str:
    """Each node's energy, its GPUs' and the rest of the machine's, its cost, and how they were obtained (nothing
    when no GPU reported its power and no machine its own)."""
    if energy is None:
        return ""
    priced, currency = energy.tariff.priced, energy.tariff.currency

    def row(name: str, gpus: Energy | None, host: Energy | None) -> list[str]:
        both = (gpus or Energy()) + (host or Energy())
        how = "; ".join(f"{part} {found.method}" for part, found in (("GPUs", gpus), ("rest", host)) if found)
        return [escape(name), f"{gpus.kwh:.4g}" if gpus else "–", f"{host.kwh:.4g}" if host else "GPU only",
                f"{both.kwh:.4g}", f"{both.cost:.4g} {escape(currency)}" if priced else "–",
                escape(how) + (f", {both.gap_seconds:.0f} s without samples" if both.gap_seconds else "")]
    names = list(dict.fromkeys([*energy.nodes, *energy.hosts]))
    rows = [row(name, energy.nodes.get(name), energy.hosts.get(name)) for name in names]
    rows.append(row("all nodes", energy.gpus if energy.nodes else None,
                    sum(energy.hosts.values(), Energy()) if energy.hosts else None))
    note = "" if priced else '<p class="empty">Set price_per_kwh in [cluster] of cluster.toml to see the cost.</p>'
    return "<h2>Energy</h2>" + table(["node", "GPU kWh", "rest of the machine kWh", "kWh", "cost", "how"], rows,
                                     ["", "num", "num", "num", "num", ""]) + note


def _limits(sentences: list[str], title: str = "What limited the run") -> str:
    if not sentences:
        return ""
    items = "".join(f"<li>{escape(s)}</li>" for s in sentences)
    return f'<section class="limits"><h2>{escape(title)}</h2><ul>{items}</ul></section>'


def _event_legend(markers: list[Marker]) -> str:
    kinds = list(dict.fromkeys(marker.kind for marker in markers))
    return '<div class="legend">Events on the time axis: ' + "".join(
        f'<span><i class="dash" style="border-color:{EVENT_COLOURS[k]}"></i>{escape(k.replace("_", " "))}</span>'
        for k in kinds) + "</div>" if kinds else ""


def _training(workers: tuple[WorkerTimeline, ...], start: float, end: float, markers: list[Marker]) -> str:
    if not workers:
        return '<h2>Training</h2><p class="empty">No metric lines: the script printed no HOMEGPU_METRIC lines.</p>'
    chief = workers[0]

    def curve(name: str) -> list[Line]:
        running, epochs = getattr(chief, name), getattr(chief, "epoch_" + name)
        lines = [Line(name, SERIES_COLOURS[0], running if running.values else epochs)]
        val = getattr(chief, "val_" + name)
        if val.measured:
            lines.append(Line("val_" + name, SERIES_COLOURS[2], val))
        return lines

    loss, accuracy = curve("loss"), curve("accuracy")
    rates = [Line(w.name, SERIES_COLOURS[i % len(SERIES_COLOURS)], w.examples_per_sec) for i, w in enumerate(workers)]
    return ("<h2>Training</h2>" + _event_legend(markers) + '<div class="grid2">'
            + figure("Loss", f"({chief.name}; val_ per epoch)", legend(loss),
                     line_chart(loss, start, end, markers, _HALF))
            + figure("Accuracy", "", legend(accuracy), line_chart(accuracy, start, end, markers, _HALF))
            + "</div>" + figure("Throughput per worker", "examples/s", legend(rates),
                                line_chart(rates, start, end, markers, _WIDE, 220, y_min=0))
            + _shares_chart(workers, start, end, markers) + _worker_table(workers))


def _shares_chart(workers: tuple[WorkerTimeline, ...], start: float, end: float, markers: list[Marker]) -> str:
    """A balanced run's shares of each step over the run (trainer/shares.py); nothing for a run without."""
    lines = [Line(w.name, SERIES_COLOURS[i % len(SERIES_COLOURS)], w.share) for i, w in enumerate(workers)]
    if not any(line.series.measured for line in lines):
        return ""
    return figure("Share of each step per worker", "examples, balanced by measured speed", legend(lines),
                  line_chart(lines, start, end, markers, _WIDE, 160, y_min=0))


def _median(series: Series) -> str:
    values = sorted(series.measured)
    return f"{values[len(values) // 2]:,.1f}" if values else "–"


def _worker_table(workers: tuple[WorkerTimeline, ...]) -> str:
    rows = [[escape(w.name), _median(w.examples_per_sec), _median(w.steps_per_sec)] for w in workers]
    return table(["worker", "median examples/s", "median steps/s"], rows, ["", "num", "num"])


def _scaled(series: Series, factor: float) -> Series:
    return Series(series.times, tuple(v * factor if v is not None else None for v in series.values))


def _nodes(timeline: Timeline, start: float, end: float, markers: list[Marker]) -> str:
    if not timeline.nodes:
        return ""
    parts = ["<h2>Nodes</h2>"]
    for node in timeline.nodes:
        gpus = node.gpus
        colour = [SERIES_COLOURS[i % len(SERIES_COLOURS)] for i in range(len(gpus))]
        names = [f"GPU {g.index}" for g in gpus]
        total = max((g.mem_total or 0 for g in gpus), default=0) / MIB_PER_GIB
        charts = []
        if gpus:
            for caption, unit, field, factor, bounds in (
                    ("GPU util", "%", "util", 1, (0, 100)),
                    ("GPU memory", "GiB", "mem_used", 1 / MIB_PER_GIB, (0, total or None)),
                    ("GPU power", "W", "power", 1, (0, None))):
                lines = [Line(n, c, _scaled(getattr(g, field), factor)) for n, c, g in zip(names, colour, gpus)]
                charts.append(figure(caption, unit, legend(lines),
                                     line_chart(lines, start, end, markers, _QUARTER, 150, *bounds)))
        cpu = [Line("CPU", SERIES_COLOURS[5], node.cpu)]
        charts.append(figure("CPU", "%", legend(cpu), line_chart(cpu, start, end, markers, _QUARTER, 150, 0, 100)))
        about = f"{len(gpus)} GPU{'s' * (len(gpus) != 1)}" if gpus else "no GPU"
        parts.append(f'<h3>{escape(node.name)}<small>{about}</small></h3><div class="grid4">{"".join(charts)}</div>')
    return "".join(parts)


def _events(timeline: Timeline, start: float) -> str:
    rows = [[format_clock(e.at - start), escape(e.kind.replace("_", " ")), escape(e.node or e.worker),
             escape(e.summary)] for e in timeline.events[:MAX_EVENT_ROWS]]
    body = table(["time", "event", "node / worker", "details"], rows, ["t", "kind", "", ""]) if rows else \
        '<p class="empty">No events recorded.</p>'
    return "<h2>Events</h2>" + body


def _settings(manifest: dict) -> str:
    settings = manifest.get("job") if isinstance(manifest.get("job"), dict) else {}
    rows = [[escape(str(k)), escape(json.dumps(v) if not isinstance(v, str) else v)] for k, v in settings.items()]
    html = "<h2>Job settings</h2>" + (table(["setting", "value"], rows) if rows else
                                      '<p class="empty">No run.json: the settings were not recorded.</p>')
    configs = manifest.get("tf_configs") if isinstance(manifest.get("tf_configs"), dict) else {}
    if configs:
        html += '<h3>TF_CONFIG per worker</h3><div class="grid2">' + "".join(
            f"<div><b>{escape(worker)}</b><pre>{escape(_pretty(config))}</pre></div>"
            for worker, config in configs.items()
        ) + "</div>"
    for key, title in (("torchrun", "torchrun per node"), ("jax", "jax.distributed per process")):
        lines = manifest.get(key) if isinstance(manifest.get(key), dict) else {}
        if lines:
            html += f"<h3>{title}</h3>" + "".join(
                f"<div><b>{escape(str(who))}</b><pre>{escape(str(line))}</pre></div>" for who, line in lines.items())
    return html


def _pretty(config: object) -> str:
    try:
        return json.dumps(json.loads(config) if isinstance(config, str) else config, separators=(", ", ": "))
    except ValueError:
        return str(config)


def _bandwidth(matrix: BandwidthMatrix | None, figures: RunFigures) -> str:
    if matrix is None:
        return '<h2>Network</h2><p class="empty">No bandwidth matrix was measured for this run.</p>'
    nodes = list(matrix.nodes)
    slowest = matrix.slowest()
    rows = []
    for src in nodes:
        cells = [f"<b>{escape(src)}</b>"]
        for dst in nodes:
            link = matrix.get(src, dst)
            if src == dst or link is None:
                cells.append("·")
            else:
                cells.append(_link_cell(link, slowest))
        rows.append(cells)
    words = advice(figures.params, matrix, figures.step_seconds) if figures.params else \
        "No parameter count in the metric lines, so no estimate of the all-reduce time."
    when = datetime.fromtimestamp(matrix.at).strftime("%Y-%m-%d %H:%M") if matrix.at else "unknown"
    return (f'<h2>Network<small class="muted">measured {escape(when)}, Gbit/s from row to column</small></h2>'
            + table(["from \\ to", *nodes], rows, ["", *["num"] * len(nodes)])
            + "".join(f"<p>{escape(line)}</p>" for line in words.splitlines()))


def _link_cell(link: LinkResult, slowest: LinkResult | None) -> str:
    """A link's Gbit/s, marked when it is as slow as the slowest (within 25 %), or its error."""
    if not link.ok:
        return f'<span class="muted">{escape(link.error)}</span>'
    slow = slowest is not None and link.gbits <= 1.25 * slowest.gbits
    return f'<span class="slow">{escape(format_gbits(link.gbits))}</span>' if slow else escape(format_gbits(link.gbits))


def _logs(tails: dict[str, list[str]]) -> str:
    if not tails:
        return ""
    return "<h2>Logs</h2>" + "".join(
        f"<details><summary>{escape(worker)} (last {len(lines)} lines, each traceback once)</summary>"
        f"<pre>{escape(chr(10).join(lines))}</pre></details>" for worker, lines in tails.items())


# -- the report -----------------------------------------------------------------------------------

def _empty_timeline() -> Timeline:
    return Timeline({}, None, None, (), (), ())


def _read_timeline(folder: RunFolder) -> tuple[Timeline, str]:
    """The run's timeline, and "" or the one line that says it is damaged and what the report does
    without it.

    Raises:
        ReportError: it is damaged and there is no metrics.jsonl to make a report from instead.
    """
    if not folder.timeline.is_file():
        return _empty_timeline(), ""
    try:
        return read_timeline(folder.timeline), ""
    except TimelineDamaged as exc:
        if not folder.metrics.is_file():
            raise ReportError(f"{exc}, and there is no metrics.jsonl to make a report from instead; "
                              f"what the workers printed is in {folder.logs}/") from None
        return _empty_timeline(), (f"{exc}: this report is made from metrics.jsonl, logs/ and run.json without "
                                   f"it (no node samples, no events); rename it (e.g. to {folder.timeline.name}"
                                   ".damaged) to keep it and stop this warning")


def write_report(run_dir: Path, bandwidth: BandwidthMatrix | None = None) -> tuple[Path, str]:
    """Write run_dir/report.html; return its path and a plain-text summary (whose first line is a
    warning when timeline.sqlite is damaged: the report is then made without it).

    Args:
        run_dir: experiments/RUN-ID.
        bandwidth: a matrix to show instead of the one in run.json (the latest measured, say).

    Raises:
        ReportError: the folder has neither timeline.sqlite nor metrics.jsonl, the timeline is damaged
            and there is no metrics.jsonl, or run.json is damaged.
    """
    folder = RunFolder(Path(run_dir))
    run_dir, timeline_path, metrics_path = folder.path, folder.timeline, folder.metrics
    if not timeline_path.is_file() and not metrics_path.is_file():
        raise ReportError(
            f"{run_dir}: no timeline.sqlite or metrics.jsonl; is this a run's folder (experiments/RUN-ID)?")
    manifest = read_manifest(run_dir)
    timeline, damage = _read_timeline(folder)
    workers = workers_from_metrics(metrics_path) if metrics_path.is_file() else ()
    workers = workers or timeline.workers
    times = [t for w in workers for t in w.examples_per_sec.times + w.epoch_loss.times]
    times += [t for t in (timeline.start, timeline.end) if t is not None]
    start, end = (min(times), max(times)) if times else (0.0, 1.0)
    timeline = Timeline(timeline.meta, start, end, timeline.nodes, timeline.workers, timeline.events)
    matrix = bandwidth or manifest.get("bandwidth")
    figures = run_figures(timeline, workers)
    energy = run_energy(timeline, Tariff.from_dict(manifest.get("tariff")))
    if damage:  # the outcome is one of the events it held
        figures = dataclasses.replace(figures, outcome="unknown", outcome_detail="its timeline is damaged")
    limits = what_limited(timeline, figures, matrix)
    job = str((manifest.get("job") or {}).get("name") or timeline.meta.get("job") or "run")
    run_id = manifest.get("run_id") or run_dir.name
    markers = [Marker(e.at, e.kind, f"{format_clock(e.at - start)} {e.kind}: {e.summary}")
               for e in timeline.events if e.kind in EVENT_COLOURS]
    nodes = len(timeline.nodes) or len({w.name for w in workers})
    body = "".join([
        _header(job, run_id, figures, start if times else None), _limits([damage] if damage else [], "Damaged file"),
        _limits([figures.outcome_detail] if figures.outcome == "failed" and figures.outcome_detail else [],
                "Why it failed"),
        _cards(figures, len(workers), nodes), _energy(energy), _limits(limits),
        _training(workers, start, end, markers), _nodes(timeline, start, end, markers), _events(timeline, start),
        _settings(manifest), _bandwidth(matrix, figures), _logs(log_tails(run_dir)),
        f"<footer>Written by homegpu from {escape(run_dir.name)}/timeline.sqlite, metrics.jsonl, run.json and logs/. "
        "Times on the axes are since the run's start.</footer>",
    ])
    folder.report.write_text(page(f"{job} {run_id}: homegpu report", body), encoding="utf-8")
    summary = summary_text(job, run_id, figures, limits)
    if energy is not None:
        summary += "\n" + energy.line()
    return folder.report, f"warning: {damage}\n{summary}" if damage else summary

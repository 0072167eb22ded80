"""Inline SVG line charts for the run report: no library, no script, no network.

A chart is a plot area of a fixed colour (PLOT_BG, which the browser test looks for), nice ticks on
both axes, one path per series (broken where values are missing or samples stop for a while), and
the run's events as dashed vertical lines. Long series are averaged per pixel column first, so a
chart stays small whatever the run's length.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from html import escape

from homegpu.remote.record.timeline_schema import Series

PLOT_BG = "#f6f7f9"
GRID = "#e2e5ea"
AXIS_TEXT = "#5f6673"
SERIES_COLOURS = ("#2f6bd8", "#14a38b", "#8a55c7", "#d49a0e", "#d2447c", "#55728c", "#5b9e2f", "#9c6644")
EVENT_COLOURS = {
    "restart": "#d62f2f", "stall": "#b3261e", "worker_error": "#d62f2f", "straggler": "#f07c00",
    "node_offline": "#7d838c", "node_online": "#7d838c", "launch": "#3b3f46", "end": "#1d9a50",
    "stop": "#3b3f46", "alert": "#e8590c",
}
_MARGIN_LEFT, _MARGIN_RIGHT, _MARGIN_TOP, _MARGIN_BOTTOM = 40, 22, 8, 24
_MIN_TICK_PIXELS = 56
_HEADROOM = 5  # pixels between the top tick and the frame, so a line at the maximum stays visible
_DOTS_UP_TO = 40
_TIME_STEPS = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400)


@dataclass(frozen=True)
class Line:
    label: str
    colour: str
    series: Series


@dataclass(frozen=True)
class Marker:
    at: float
    kind: str
    label: str


def nice_step(span: float, ticks: int = 4) -> float:
    """A 1/2/2.5/5 × 10^k step giving about `ticks` intervals over `span`."""
    if span <= 0:
        return 1.0
    raw = span / ticks
    power = 10 ** math.floor(math.log10(raw))
    return next(m * power for m in (1, 2, 2.5, 5, 10) if m * power >= raw)


def format_number(value: float) -> str:
    if value == 0:
        return "0"
    if abs(value) >= 10_000:
        return f"{value / 1000:.0f}k"
    if abs(value) >= 1000:
        return f"{value / 1000:.1f}k".replace(".0k", "k")
    return f"{value:.3g}"


def format_clock(seconds: float) -> str:
    """Time since the run's start: `0:45`, `12:30`, `1:05:00`."""
    seconds = int(round(seconds))
    hours, rest = divmod(seconds, 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d}" if hours else f"{rest // 60}:{rest % 60:02d}"


def _thin(series: Series, start: float, end: float, columns: int) -> list[tuple[float, float | None]]:
    """Average points falling in the same pixel column; a column with no value keeps a gap."""
    points = list(zip(series.times, series.values))
    if len(points) <= columns * 2:
        return points
    width = (end - start) / columns or 1.0
    buckets: dict[int, list] = {}
    for t, v in points:
        buckets.setdefault(int((t - start) / width), []).append((t, v))
    thinned = []
    for _, members in sorted(buckets.items()):
        values = [v for _, v in members if v is not None]
        t = sum(t for t, _ in members) / len(members)
        thinned.append((t, sum(values) / len(values) if values else None))
    return thinned


def _path(points: list[tuple[float, float | None]], x, y, max_gap: float) -> str:
    """SVG path data, lifting the pen at missing values and at gaps longer than `max_gap` seconds."""
    parts, pen_down, last_t = [], False, None
    for t, v in points:
        if v is None:
            pen_down = False
            continue
        if last_t is not None and t - last_t > max_gap:
            pen_down = False
        parts.append(f"{'L' if pen_down else 'M'}{x(t):.1f},{y(v):.1f}")
        pen_down, last_t = True, t
    return "".join(parts)


def _gap(series: Series) -> float:
    gaps = sorted(b - a for a, b in zip(series.times, series.times[1:]) if b > a)
    return max(3 * gaps[len(gaps) // 2], 1.5) if gaps else math.inf


def _y_range(lines: list[Line], y_min: float | None, y_max: float | None) -> tuple[float, float]:
    values = [v for line in lines for v in line.series.values if v is not None]
    low = y_min if y_min is not None else (min(values) if values else 0.0)
    high = y_max if y_max is not None else (max(values) if values else 1.0)
    if y_min is None and low > 0 and low < 0.4 * high:
        low = 0.0  # start at zero unless the values sit far from it
    if high <= low:
        high = low + (abs(low) or 1.0)
    step = nice_step(high - low)
    return math.floor(low / step) * step, math.ceil(high / step) * step


def line_chart(lines: list[Line], start: float, end: float, markers: list[Marker], width: int = 560,
               height: int = 200, y_min: float | None = None, y_max: float | None = None) -> str:
    """One chart as an inline <svg>; x is seconds since `start`. Series of few points get a dot per point."""
    left, right = _MARGIN_LEFT, width - _MARGIN_RIGHT
    top, bottom = _MARGIN_TOP, height - _MARGIN_BOTTOM
    span = max(end - start, 1e-9)
    low, high = _y_range(lines, y_min, y_max)

    def x(t: float) -> float:
        return left + (t - start) / span * (right - left)

    def y(v: float) -> float:
        return bottom - (v - low) / (high - low) * (bottom - top - _HEADROOM)

    out = [f'<svg class="chart" viewBox="0 0 {width} {height}" width="{width}" height="{height}" role="img">',
           f'<rect x="{left}" y="{top}" width="{right - left}" height="{bottom - top}" fill="{PLOT_BG}"/>']
    step = nice_step(high - low)
    tick = low
    while tick <= high + step / 1000:
        ty = y(tick)
        out.append(f'<line x1="{left}" x2="{right}" y1="{ty:.1f}" y2="{ty:.1f}" stroke="{GRID}" stroke-width="1"/>'
                   f'<text x="{left - 6}" y="{ty + 3.5:.1f}" text-anchor="end">{format_number(tick)}</text>')
        tick += step
    most = max(2, min(6, int((right - left) // _MIN_TICK_PIXELS)))
    time_step = next((s for s in _TIME_STEPS if span / s <= most), _TIME_STEPS[-1])
    for k in range(0, int(span // time_step) + 1):
        tx = x(start + k * time_step)
        out.append(f'<line x1="{tx:.1f}" x2="{tx:.1f}" y1="{bottom}" y2="{bottom + 4}" stroke="{AXIS_TEXT}"/>'
                   f'<text x="{tx:.1f}" y="{bottom + 16}" text-anchor="middle">{format_clock(k * time_step)}</text>')
    for marker in markers:
        if start <= marker.at <= end:
            colour = EVENT_COLOURS.get(marker.kind, AXIS_TEXT)
            mx = x(marker.at)
            out.append(f'<line x1="{mx:.1f}" x2="{mx:.1f}" y1="{top}" y2="{bottom}" stroke="{colour}" '
                       f'stroke-width="1.25" stroke-dasharray="4 3"><title>{escape(marker.label)}</title></line>')
    columns = right - left
    for line in lines:
        thinned = _thin(line.series, start, end, columns)
        data = _path(thinned, x, y, max(_gap(line.series), 2.5 * span / columns))
        if data:
            out.append(f'<path d="{data}" fill="none" stroke="{line.colour}" stroke-width="2" '
                       f'stroke-linejoin="round" stroke-linecap="round"><title>{escape(line.label)}</title></path>')
        if len(thinned) <= _DOTS_UP_TO:
            out.extend(f'<circle cx="{x(t):.1f}" cy="{y(v):.1f}" r="3" fill="{line.colour}"/>'
                       for t, v in thinned if v is not None)
    out.append(f'<rect x="{left}" y="{top}" width="{right - left}" height="{bottom - top}" fill="none" '
               f'stroke="{GRID}"/></svg>')
    return "".join(out)


def legend(lines: list[Line]) -> str:
    """Swatches with labels, as HTML to put above a chart."""
    return '<div class="legend">' + "".join(
        f'<span><i style="background:{line.colour}"></i>{escape(line.label)}</span>' for line in lines) + "</div>"

"""Tiny text charts: sparklines, a braille line plot and a progress bar (pure functions).

Braille cells hold 2×4 dots, so a plot of W×H characters has 2W×4H points of resolution: enough
for a loss curve in a side panel without a plotting dependency.
"""

from __future__ import annotations

import math
from typing import Sequence

BLOCKS = "▁▂▃▄▅▆▇█"
BRAILLE_BASE = 0x2800
# Dot bit for (column 0..1, row 0..3 from the top) inside one braille cell.
_DOTS = ((0x01, 0x02, 0x04, 0x40), (0x08, 0x10, 0x20, 0x80))


def _finite(value: object) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)


def sparkline(values: Sequence[object], width: int, top: float = 100.0) -> str:
    """The last `width` values as block characters scaled 0..top; a missing value is a space.

    Shorter histories are right-aligned, so the newest sample is always at the right edge.
    """
    if width <= 0:
        return ""
    recent = list(values)[-width:]
    cells = []
    for value in recent:
        if not _finite(value):
            cells.append(" ")
            continue
        share = min(max(float(value) / top, 0.0), 1.0)
        cells.append(BLOCKS[min(int(share * len(BLOCKS)), len(BLOCKS) - 1)])
    return "".join(cells).rjust(width)


def braille_plot(points: Sequence[tuple[float, float]], width: int, height: int) -> list[str]:
    """A line through (x, y) points, scaled to fill `width`×`height` characters; rows top first.

    Consecutive points are joined by straight segments. Returns `height` strings of `width`
    characters; blank cells are braille blanks (U+2800) so columns stay aligned.
    """
    if width <= 0 or height <= 0:
        return []
    grid = [[0] * width for _ in range(height)]
    usable = [(float(x), float(y)) for x, y in points if _finite(x) and _finite(y)]
    if usable:
        xs, ys = [x for x, _ in usable], [y for _, y in usable]
        dots = [_to_dot(x, y, (min(xs), max(xs)), (min(ys), max(ys)), width * 2, height * 4) for x, y in usable]
        for a, b in zip(dots, dots[1:] or dots):
            for col, row in _segment(a, b):
                grid[row // 4][col // 2] |= _DOTS[col % 2][row % 4]
    return ["".join(chr(BRAILLE_BASE + bits) for bits in line) for line in grid]


def _to_dot(x: float, y: float, x_range: tuple[float, float], y_range: tuple[float, float],
            cols: int, rows: int) -> tuple[int, int]:
    def scale(value: float, low: float, high: float, size: int) -> int:
        if high <= low:
            return size // 2
        return round((value - low) / (high - low) * (size - 1))

    return scale(x, *x_range, cols), rows - 1 - scale(y, *y_range, rows)


def _segment(a: tuple[int, int], b: tuple[int, int]) -> list[tuple[int, int]]:
    steps = max(abs(b[0] - a[0]), abs(b[1] - a[1]), 1)
    return [(round(a[0] + (b[0] - a[0]) * i / steps), round(a[1] + (b[1] - a[1]) * i / steps))
            for i in range(steps + 1)]


def progress_bar(done: float, total: float, width: int) -> str:
    """`━━━━━━╸     ` filled to done/total; all blank when total is unknown or zero."""
    if width <= 0:
        return ""
    if not total or total <= 0:
        return " " * width
    share = min(max(done / total, 0.0), 1.0)
    halves = round(share * width * 2)
    full, half = divmod(halves, 2)
    return ("━" * full + ("╸" if half else "")).ljust(width)


def squeeze(values: tuple[float | None, ...], width: int) -> list[float | None]:
    """`values` (oldest first) averaged into `width` cells, so the whole window fits the sparkline."""
    if len(values) <= width:
        return list(values)
    cells = []
    for i in range(width):
        part = [v for v in values[i * len(values) // width:(i + 1) * len(values) // width] if v is not None]
        cells.append(sum(part) / len(part) if part else None)
    return cells

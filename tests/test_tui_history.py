"""The TUI's long history (tui/view/gpu_trail.py): downsampling, its bounds, and the node detail's window key.

Stats are the real agent's lines from recorded GPU output (tests/fixtures/tui/), re-stamped a
second apart to stand for hours of a TUI left open; no clock is waited for.
"""

from __future__ import annotations

import sqlite3
from dataclasses import replace
from pathlib import Path

import pytest

from homegpu.remote.config.cluster_spec import parse_cluster
from homegpu.remote.events import NodeState, NodeStateChanged, NodeStatsUpdated
from homegpu.remote.nodes.stats import parse_agent_line
from homegpu.remote.store import bucket_index, bucket_time, bucket_time_sql
from homegpu.tui.app.main import HomegpuApp
from homegpu.tui.view.gpu_trail import SLOTS_PER_SERIES, TIERS, TRAIL_WINDOWS, Series, Tier
from homegpu.tui.view.render import node_detail
from homegpu.tui.view.state import NodeView

FIXTURES = Path(__file__).parent / "fixtures" / "tui"
GPU_FIXTURES = Path(__file__).parent / "fixtures" / "gpu"
T0 = 1795298400.0  # on the hour (2026-11-21 22:40 UTC is not; this is 22:00), so buckets start cleanly
HOUR = 3600


def test_the_tui_and_the_timeline_share_one_bucket_rule() -> None:
    """Python's rule and the SQL the timeline compacts with put every time in the same bucket."""
    db = sqlite3.connect(":memory:")
    for size in (1.0, 10.0, 60.0):
        for t in (T0, T0 + 0.999, T0 + 9.5, T0 + 59.999, T0 + 60.0, 1795316712.345):
            assert db.execute(f"SELECT {bucket_time_sql('?', size)}", (t,)).fetchone()[0] == \
                bucket_time(bucket_index(t, size), size)


def test_a_tier_averages_each_bucket_and_marks_gaps() -> None:
    tier = Tier(10.0, 5)
    for t, value in ((T0 + 1, 10.0), (T0 + 2, 20.0), (T0 + 11, None), (T0 + 12, 50.0), (T0 + 41, 90.0)):
        tier.add(t, value)
    tier.add(T0 + 5, 99.0)  # older than the bucket being filled: dropped
    assert tier.points() == [(T0 + 5, 15), (T0 + 15, 50), (T0 + 45, 90.0)]  # the last one still filling
    tier.add(T0 + 51, 70.0)  # closes it: the empty buckets before it are kept as gaps
    assert tier.points() == [(T0 + 5, 15), (T0 + 15, 50), (T0 + 25, None), (T0 + 35, None), (T0 + 45, 90),
                             (T0 + 55, 70.0)]
    for step in range(20):  # a long run: only the newest five buckets stay
        tier.add(T0 + 60 + 10 * step, 1.0)
    assert len(tier.values) == 5 and tier.points()[-1] == (T0 + 255, 1.0)


def test_an_offline_spell_longer_than_a_tier_leaves_it_bounded() -> None:
    tier = Tier(1.0, 600)
    tier.add(T0, 50.0)
    tier.add(T0 + 10 * HOUR, 60.0)  # ten hours of gap
    tier.add(T0 + 10 * HOUR + 1, 70.0)
    assert len(tier.values) == 600 and set(list(tier.values)[:-1]) == {None} and tier.values[-1] == 60
    assert tier.points()[-1] == (T0 + 10 * HOUR + 1.5, 70.0)


def three_hours() -> Series:
    """An hour at 90%, then two at 10%, one sample a second."""
    series = Series()
    for second in range(3 * HOUR):
        series.add(T0 + second, 90 if second < HOUR else 10)
    return series


def test_windows_come_from_the_finest_tier_that_covers_them() -> None:
    series = three_hours()
    assert series.window(300, 5) == [10.0] * 5  # a minute a cell, from the 1 s tier
    assert series.window(HOUR, 6) == [10.0] * 6  # 10 minutes a cell, from the 10 s tier
    assert series.window(None, 3) == [90.0, 10.0, 10.0]  # all three hours: an hour a cell, from the 60 s tier
    assert series.window(None, 6) == [90.0, 90.0, 10.0, 10.0, 10.0, 10.0]


def test_a_short_history_fills_the_window_from_the_right() -> None:
    series = Series()
    for second in range(30):
        series.add(T0 + second, 40)
    cells = series.window(300, 60)  # 5 s a cell: 30 s of data is the last 6 cells
    assert len(cells) == 60 and cells[-6:] == [40.0] * 6 and cells[:-7] == [None] * 53
    assert series.window(None, 60) == [40.0] * 30  # "all" is 30 s: a 1 s bucket a cell


def test_a_day_and_more_stays_within_the_bound() -> None:
    series = Series()
    for second in range(0, 26 * HOUR, 2):  # 26 hours at one sample every 2 s
        series.add(T0 + second, second % 100)
    assert sum(len(tier.values) for tier in series.tiers) <= SLOTS_PER_SERIES == 2760
    assert [len(tier.values) for tier in series.tiers] == [keep for _, keep in TIERS]
    oldest = series.tiers[-1].points()[0][0]
    assert series.last - oldest < 24 * HOUR + 60  # "all" reaches back 24 h at most
    # Whole percents (Python's shared small ints) or None: every 2 s leaves every other 1 s bucket empty.
    assert all(v is None or isinstance(v, int) for tier in series.tiers for v in tier.values)
    assert list(series.tiers[0].values).count(None) == 300
    assert len(series.window(None, 80)) == 80


# -- the node detail and the h key ----------------------------------------------------------------------

# The agent's lines on an H100 under load (util 100%) and on an idle H100 NVL (0%).
BUSY = parse_agent_line((GPU_FIXTURES / "h100-80gb-hbm3" / "agent_smi.jsonl").read_text().splitlines()[0])
IDLE = parse_agent_line((FIXTURES / "h100nvl_idle.json").read_text())


def idle_then_busy(seconds: int):
    """A GPU node's stats a second apart: idle in the first hour, under load after it."""
    return (replace(IDLE if second < HOUR else BUSY, timestamp=T0 + second) for second in range(seconds))


def hours_of_node(view: NodeView, hours: float) -> None:
    for stats in idle_then_busy(int(hours * HOUR)):
        view.take_stats(stats)


def test_node_detail_draws_the_window_it_is_given() -> None:
    node = NodeView("desktop", "192.168.1.20", NodeState.ONLINE)
    hours_of_node(node, 2)
    drawn = {label: node_detail(node, 60, window=i).plain for i, (label, _) in enumerate(TRAIL_WINDOWS)}
    assert "history: 5 min (h: 5 min · 1 h · all)" in drawn["5 min"]
    util = {label: next(line for line in text.splitlines() if line.startswith(" util"))
            for label, text in drawn.items()}
    assert "▁" not in util["5 min"] and "▁" not in util["1 h"]  # busy throughout the last hour
    assert "▁" in util["all"] and util["all"].rstrip().endswith("%")  # the idle first hour shows


@pytest.mark.asyncio
async def test_the_h_key_cycles_the_node_details_window() -> None:
    app = HomegpuApp(parse_cluster('[cluster]\nname = "home"\n\n[[nodes]]\nname = "desktop"\nhost = "d"\n',
                                   "cluster.toml"), clock=lambda: T0)
    async with app.run_test(size=(160, 48)) as pilot:
        app.take([NodeStateChanged("desktop", NodeState.ONLINE)])
        app.take(NodeStatsUpdated("desktop", stats) for stats in idle_then_busy(2 * HOUR))
        app.redraw()
        await pilot.pause()

        def shown() -> str:
            panel = app.query_one("#detail")
            return panel.render().plain

        assert "history: 5 min" in shown()
        assert " h  History " in app.query_one("#keys").render().plain
        seen = []
        for _ in range(3):
            await pilot.press("h")
            await pilot.pause()
            seen.append(next(line for line in shown().splitlines() if line.startswith("history:")))
        assert [line.split(" (")[0] for line in seen] == ["history: 1 h", "history: all", "history: 5 min"]


async def test_the_h_key_reaches_back_a_day_and_a_week_through_serves_history(tmp_path, monkeypatch) -> None:
    """Where `homegpu serve` records this cluster, h goes on past the TUI's own windows to a day and a week,
    read from the store (here written by the real HistoryRecorder: 20 hours of the recorded H100 at 100 %)."""
    import time

    from history_events import h100_lines, owned

    from homegpu.remote.config import embedded_default
    from homegpu.remote.history import HistoryReader, HistoryRecorder, history_path
    from homegpu.tui.view.lookback import LOOKBACK_WINDOWS, Lookback

    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path))
    spec = embedded_default()
    stored = Lookback(spec)
    view = NodeView("local", "local")
    stats = owned(h100_lines()[0], [None])
    view.take_stats(stats)
    assert not stored.available and "h: 5 min · 1 h · all)" in node_detail(view, 80, "", len(TRAIL_WINDOWS), stored).plain
    now = time.time()
    clock = {"t": now - 20 * HOUR}
    # a sample a minute, as serve records a cluster whose stats_interval is 30 s (its max_gap: 3 intervals)
    recorder = HistoryRecorder(history_path(spec), clock=lambda: clock["t"], max_gap=90.0)
    for minute in range(20 * 60):
        clock["t"] = now - 20 * HOUR + 60 * minute
        recorder.handle(NodeStatsUpdated("local", stats, at=clock["t"]))
    recorder.close()

    assert stored.available and stored.due(LOOKBACK_WINDOWS[0][1])
    await stored.read(LOOKBACK_WINDOWS[0][1])
    text = node_detail(view, 80, "", len(TRAIL_WINDOWS), stored).plain
    assert "history: 1 d (homegpu serve's history) (h: 5 min · 1 h · all · 1 d · 7 d)" in text, text
    util = next(line for line in text.splitlines() if line.startswith(" util "))[6:70]
    assert util.count("█") / len(util) == pytest.approx(20 / 24, abs=0.05), util  # 20 of the day's 24 hours
    assert util.startswith(" ") and not stored.due(LOOKBACK_WINDOWS[0][1])  # the day's first hours: not recorded

    assert stored.today_due()  # the node's energy since midnight: the minutes recorded today, 60 s apart
    await stored.read_today()
    power = next(line for line in node_detail(view, 80, "", 0, stored).plain.splitlines() if line.startswith("power "))
    midnight = time.mktime(time.localtime(now)[:3] + (0, 0, 0, 0, 0, -1))
    with HistoryReader(history_path(spec)) as reader:
        today = sum(gpu.energy_kwh for gpu in reader.gpu_energy(midnight, now))
    said = f" · today {today:.2f} kWh (homegpu serve's history)" if today else ""  # just after midnight: none yet
    assert power == f"power {stats.gpus[0].power:.0f} W now{said}"

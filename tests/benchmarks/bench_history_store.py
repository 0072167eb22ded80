"""The cluster history store's benchmarks (remote/history/). Prints figures; asserts nothing.

Run:  .venv/bin/python tests/benchmarks/bench_history_store.py [--days 31] [--seconds 4200] [--full]

The cluster: 16 nodes, 48 GPUs, made of real recorded agent output parsed by the controller's parser
(tests/history_events.py): 4 nodes of the H100 80GB HBM3 recorded under load through NVML (its process
a homegpu worker), 4 of the MIG H100 under load (three processes of two owners), 4 of 2 idle H100 NVL,
4 of 8 idle H100 SXM. Only their times change.

1. The store's size after a simulated month at 16 nodes × 1 Hz, written by the real recorder with a
   clock that follows the simulated time (one write per simulated second, compaction per minute,
   the size bound checked after every write), and its largest size on disk along the way (database
   and WAL together, measured every simulated minute). Tractable without cheating the tiers: every
   day before the last 25 hours is sampled once per 10 s instead of every second. Whatever is older
   than an hour is kept as 10 s buckets, and whatever is older than a day as 60 s buckets, so a
   sample each 10 s leaves the same rows, with the same keys, as ten samples would (only `n`, the
   samples per bucket, differs, and it takes one byte either way); the last 25 hours, which the store
   keeps at full rate and in 10 s buckets, are sampled at the full 1 Hz. 1b checks that claim on a
   smaller case, written both ways. --full writes every second of the month instead (about half an
   hour here).
2. The write cost per sample, against the run timeline's recorder side by side: per stats line the
   controller parses the agent's line, publishes a NodeStatsUpdated on the hub, and a front end's
   subscription reads it (the baseline); each recorder adds a subscription whose events it handles.
   The events are replayed as fast as they go, their times and each recorder's clock 1 s apart per
   round, so both write once per second of simulated time and compact as they would live; the last
   10 minutes are past the first hour, so compaction is in the figure.
3. The queries on the month's store, for `homegpu history --since 30d` and the TUI: each GPU's use in
   100 points, GPU-hours per user and per run, offline intervals, each GPU's and each owner's energy priced
   by a two-rate tariff (median of 3).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(TESTS))

from history_events import h100_lines, process, sxm8_idle, tui_line, worker  # noqa: E402

from bench_timeline import handle_stream  # noqa: E402  (beside this file: the same stream, timed the same way)

from homegpu.remote.config.tariff import Period, Tariff  # noqa: E402
from homegpu.remote.history import HistoryReader, HistoryRecorder  # noqa: E402
from homegpu.remote.events import NodeStatsUpdated  # noqa: E402
from homegpu.remote.nodes.stats import parse_agent_line  # noqa: E402
from homegpu.remote.record.timeline import TimelineRecorder  # noqa: E402

NODES = 16
T0 = 1_795_316_400.0
DAY = 86400
FULL_RATE_TAIL = 25 * 3600  # the last day and an hour: what the store keeps at 1 s and 10 s
THIN_EVERY = 10  # seconds between samples before that
ROUNDS = 3
WHOLE_CONTROLLER_SECONDS_PER_LINE = 0.0006  # tests/benchmarks/README.md, bench_nodes: 0.06 % of a core per node at 1 Hz


class Clock:
    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def with_owners(line: dict, owners: list[list[dict]]) -> dict:
    line = json.loads(json.dumps(line))
    for gpu, gpu_owners in zip(line["gpus"], owners):
        for proc, owner in zip(gpu["processes"], gpu_owners):
            proc["owner"] = owner
    return line


def node_lines() -> list[list[dict]]:
    """Per node, the agent lines it cycles through (the H100 nodes through their 8 recorded lines)."""
    kinds = [
        [with_owners(line, [[worker("alice", "demo", "demo-1")]]) for line in h100_lines()],
        [with_owners(tui_line("h100_mig_load"),
                     [[process("bob"), process("bob"), worker("carol", "burn", "burn-1")]])],
        [tui_line("h100nvl_idle")],
        [sxm8_idle()],
    ]
    return [kinds[n % len(kinds)] for n in range(NODES)]


def parsed_stats() -> list[list]:
    return [[parse_agent_line(json.dumps(line)) for line in lines] for lines in node_lines()]


def on_disk(path: Path) -> int:
    wal = path.with_name(path.name + "-wal")
    return path.stat().st_size + (wal.stat().st_size if wal.exists() else 0)


def simulate(path: Path, seconds: int, full_rate_tail: int, thin_every: int, nodes: int = NODES) -> dict:
    """Write `seconds` of history for `nodes` nodes; returns the figures."""
    stats = parsed_stats()[:nodes]
    clock = Clock(T0)
    recorder = HistoryRecorder(path, clock=clock)
    thin_until = seconds - full_rate_tail
    biggest, events = 0, 0
    started_cpu, started = time.process_time(), time.perf_counter()
    second = 0
    while second < seconds:
        clock.t = T0 + second
        for n in range(nodes):
            lines = stats[n]
            recorder.handle(NodeStatsUpdated(f"node{n + 1:02d}", lines[second % len(lines)], at=clock.t + n / 100))
        events += nodes
        if second % 60 == 0:
            biggest = max(biggest, on_disk(path))
        second += thin_every if second < thin_until else 1
    cpu, wall = time.process_time() - started_cpu, time.perf_counter() - started
    recorder.close()
    with sqlite3.connect(path) as db:
        counts = {table: db.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
                  for table in ("node_samples", "gpu_samples", "owner_samples")}
        oldest = db.execute("SELECT min(t) FROM node_samples").fetchone()[0]
    return {"size": path.stat().st_size, "biggest": biggest, "events": events, "cpu": cpu, "wall": wall,
            "rows": counts, "oldest_age": T0 + seconds - oldest, "trims": recorder.bound.trims, "clock": clock.t}


def bench_month(days: int, full: bool) -> Path:
    tmp = Path(tempfile.mkdtemp(prefix="bench-history-"))
    path = tmp / "history.sqlite"
    seconds = days * DAY
    tail = seconds if full else FULL_RATE_TAIL
    figures = simulate(path, seconds, tail, THIN_EVERY)
    how = "every second" if full else f"every {THIN_EVERY} s, then 1 Hz for the last {tail // 3600} h"
    per_event = figures["cpu"] / figures["events"] * 1e6
    print(f"1. {days} simulated days of {NODES} nodes (48 GPUs), sampled {how}: {figures['events']:,} stats events "
          f"written in {figures['wall']:.0f} s ({figures['cpu']:.0f} s CPU, {per_event:.1f} µs per event)")
    print(f"   store at the end: {figures['size'] / 2**20:.1f} MiB; largest on disk along the way (with WAL) "
          f"{figures['biggest'] / 2**20:.1f} MiB; bound 256 MiB, trims {figures['trims']}")
    rows = figures["rows"]
    print(f"   rows: {rows['node_samples']:,} node, {rows['gpu_samples']:,} GPU, {rows['owner_samples']:,} owner; "
          f"oldest sample {figures['oldest_age'] / DAY:.2f} days old")
    print(f"   ({figures['size'] / sum(rows.values()):.1f} bytes per row on disk, indexes and free pages included)")
    return path


def bench_thinning_check() -> None:
    """1b: the same 2 days of 4 nodes written at 1 Hz throughout and thinned as part 1 thins."""
    with tempfile.TemporaryDirectory() as tmp:
        full = simulate(Path(tmp) / "full.sqlite", 2 * DAY, 2 * DAY, THIN_EVERY, nodes=4)
        thin = simulate(Path(tmp) / "thin.sqlite", 2 * DAY, FULL_RATE_TAIL, THIN_EVERY, nodes=4)
    print(f"1b. 2 days of 4 nodes, every second: {full['size'] / 2**20:.2f} MiB, rows {full['rows']}; "
          f"thinned before the last {FULL_RATE_TAIL // 3600} h: {thin['size'] / 2**20:.2f} MiB, rows {thin['rows']}")


def stats_lines(seconds: int) -> list[str]:
    """(node, agent line) for every node and second, their times moved on."""
    lines = node_lines()
    return [(f"node{n + 1:02d}", json.dumps(dict(lines[n][s % len(lines[n])], t=T0 + s + n / 100)))
            for s in range(seconds) for n in range(NODES)]


def bench_write_cost(seconds: int) -> None:
    lines = stats_lines(seconds)
    base, timeline, history = [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        for round_ in range(ROUNDS):
            base.append(handle_stream(lines, None, None))
            recorder = TimelineRecorder(Path(tmp) / f"timeline-{round_}.sqlite")
            timeline.append(handle_stream(lines, recorder, None))
            recorder.close()
            clock = Clock(T0)
            store = HistoryRecorder(Path(tmp) / f"history-{round_}.sqlite", clock=clock)
            history.append(handle_stream(lines, store, clock))
            store.close()
        sizes = [(Path(tmp) / f"{name}-0.sqlite").stat().st_size for name in ("timeline", "history")]
    count = len(lines)
    base_s, timeline_s, history_s = (statistics.median(x) for x in (base, timeline, history))
    timeline_cost, history_cost = (timeline_s - base_s) / count, (history_s - base_s) / count
    print(f"2. {NODES} nodes × 1 Hz × {seconds} s = {count:,} stats lines, median of {ROUNDS}:")
    print(f"   the controller's handling alone: {base_s / count * 1e6:.1f} µs per line")
    print(f"   the timeline recorder adds {timeline_cost * 1e6:.1f} µs per line; the history store adds "
          f"{history_cost * 1e6:.1f} µs: history / timeline = {history_cost / timeline_cost:.2f}×")
    print(f"   with the history store, in-process handling: {history_s / base_s:.3f}× of without; against the "
          f"whole controller ({WHOLE_CONTROLLER_SECONDS_PER_LINE * 1e6:.0f} µs per line, tests/benchmarks/README.md): "
          f"{(WHOLE_CONTROLLER_SECONDS_PER_LINE + history_cost) / WHOLE_CONTROLLER_SECONDS_PER_LINE:.3f}×")
    print(f"   at 1 Hz that is {history_cost * NODES * 100:.3f} % of a core for {NODES} nodes; "
          f"files: timeline {sizes[0] / 2**20:.1f} MiB, history {sizes[1] / 2**20:.1f} MiB")


NIGHT_RATE = Tariff(0.35, "EUR", (Period(22 * 60, 6 * 60, 0.18),))  # priced per minute of the day


def bench_queries(path: Path) -> None:
    with HistoryReader(path) as history:
        oldest, newest = history.span()
        window = (oldest, newest + 1)
        timings = {}
        for name, query in (("gpus(100 points)", lambda: history.gpus(*window, points=100)),
                            ("nodes(100 points)", lambda: history.nodes(*window, points=100)),
                            ("gpu_hours_by_user", lambda: history.gpu_hours_by_user(*window)),
                            ("gpu_hours_by_run", lambda: history.gpu_hours_by_run(*window)),
                            ("offline", lambda: history.offline(*window)),
                            ("gpu_energy (night rate)", lambda: history.gpu_energy(*window, NIGHT_RATE)),
                            ("owner_energy (night rate)", lambda: history.owner_energy(*window, NIGHT_RATE))):
            runs = []
            for _ in range(3):
                started = time.perf_counter()
                result = query()
                runs.append(time.perf_counter() - started)
            timings[name] = (statistics.median(runs), len(result))
        hours = history.gpu_hours_by_user(*window)
    print(f"3. queries over the whole store ({(newest - oldest) / DAY:.1f} days), median of 3:")
    for name, (seconds, count) in timings.items():
        print(f"   {name}: {seconds * 1000:.0f} ms ({count} results)")
    print("   GPU-hours per user: " + ", ".join(f"{h.user or '?'} {h.gpu_hours:.1f}" for h in hours))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--days", type=int, default=31, help="simulated days for part 1 (default 31: a month kept, "
                                                           "a day already dropped)")
    parser.add_argument("--seconds", type=int, default=4200, help="stream length for part 2 (default 4200)")
    parser.add_argument("--full", action="store_true", help="part 1 at 1 Hz throughout (slow)")
    parser.add_argument("--skip-month", action="store_true", help="only part 2")
    args = parser.parse_args()
    print(f"{platform.machine()} {os.cpu_count()} cores, Python {platform.python_version()}, "
          f"SQLite {sqlite3.sqlite_version}, {time.strftime('%Y-%m-%d')}")
    if not args.skip_month:
        path = bench_month(args.days, args.full)
        bench_queries(path)
        bench_thinning_check()
        for suffix in ("", "-wal", "-shm"):
            Path(str(path) + suffix).unlink(missing_ok=True)
        path.parent.rmdir()
    bench_write_cost(args.seconds)


if __name__ == "__main__":
    main()

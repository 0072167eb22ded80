"""Timeline and report benchmarks. Prints figures; asserts nothing.

Run:  .venv/bin/python tests/benchmarks/bench_timeline.py [--seconds 600]

1. Controller CPU to handle 16 nodes × 1 Hz of stats for N seconds of run time, with the timeline
   recorder on against off. What the controller does per stats line either way: parse the agent's
   line (real lines recorded in tests/fixtures/tui/, the controller's own parser), publish a
   NodeStatsUpdated on the hub, and a front end's subscription reads it. "On" adds the recorder's
   subscription, each event given to TimelineRecorder.handle (one transaction a second of event
   time). The events are replayed as fast as they go, so the CPU per event is measured
   without a second of idle in between; their times advance 1 s per round, so the recorder flushes
   once per second of run time as it would live. Target: ≤ 1.05×.
   This in-process baseline leaves out what the real controller also spends per line (SSH, asyncio
   wake-ups); the bench_nodes figure in tests/benchmarks/README.md for that (0.06 % of a core per node at 1 Hz) gives a
   second ratio against the whole controller.
   With --live, it also runs the real controller (Cluster) against 16 simulated sshd nodes
   streaming the stats agent at 1 Hz (a replaying nvidia-smi recorded on real GPUs) and measures
   the controller process's CPU over LIVE_SECONDS with TimelineRecorder.run on a subscription
   against without, alternating. The two totals vary by more than the recorder costs on a shared
   machine, so the recorder also meters its own work (thread CPU time around taking the queue and
   writing), and that over the controller's CPU without it is the figure to read (as root, under
   the cluster lock:
   flock /tmp/homegpu-cluster.lock .venv/bin/python tests/benchmarks/bench_timeline.py --live).
2. Time to write the report of a synthetic 1-hour, 4-node run (tests/timeline_events.synthetic_hour):
   the timeline recorded first (not timed), then write_report (median of 3). Target: < 2 s.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(TESTS))

from timeline_events import FIXTURES, RECORDED, synthetic_hour  # noqa: E402

from homegpu.remote.events import EventHub, NodeStatsUpdated  # noqa: E402
from homegpu.remote.nodes.stats import parse_agent_line  # noqa: E402
from homegpu.remote.record.experiment import write_run_manifest  # noqa: E402
from homegpu.remote.record.html_report import write_report  # noqa: E402
from homegpu.remote.record.timeline import TimelineRecorder, load_timeline  # noqa: E402

NODES = 16
LIVE_SECONDS = 20.0
LIVE_ROUNDS = 3
ROUNDS = 5
WHOLE_CONTROLLER_SECONDS_PER_LINE = 0.0006  # tests/benchmarks/README.md, bench_nodes: 0.06 % of a core per node at 1 Hz
T0 = 1_795_316_000.0


def agent_lines(nodes: int, seconds: int) -> list[tuple[str, str]]:
    """(node, line) for every node and second: the recorded lines with their time moved on."""
    recorded = [json.loads((FIXTURES / f"{name}.json").read_text()) for name in RECORDED]
    lines = []
    for second in range(seconds):
        for n in range(nodes):
            obj = dict(recorded[n % len(recorded)], t=T0 + second + n / 100)
            lines.append((f"node{n + 1}", json.dumps(obj)))
    return lines


def handle_stream(lines: list[tuple[str, str]], recorder, clock=None) -> float:
    """CPU seconds to parse, publish and consume every line (and record it when `recorder` is given: the
    run's TimelineRecorder, or anything with handle() and flush(); `clock`, an object with a `t`, follows
    the events' times for a recorder that reads one)."""
    hub = EventHub(max_queue=len(lines) + 1)
    front_end = hub.subscribe()
    own = hub.subscribe() if recorder else None
    seen = 0
    start = time.process_time()
    for node, line in lines:
        stats = parse_agent_line(line)
        hub.publish(NodeStatsUpdated(node, stats, at=stats.timestamp))
        for event in front_end.drain(1000):
            seen += event.stats.has_gpus
        if own is not None:
            for event in own.drain(1000):
                if clock is not None:
                    clock.t = event.at
                recorder.handle(event)
    if recorder is not None:
        recorder.flush()
    return time.process_time() - start


def bench_recording(seconds: int) -> None:
    lines = agent_lines(NODES, seconds)
    off, on = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for round_ in range(ROUNDS):
            off.append(handle_stream(lines, None))
            recorder = TimelineRecorder(Path(tmp) / f"timeline-{round_}.sqlite")
            on.append(handle_stream(lines, recorder))
            recorder.close()
        size = (Path(tmp) / "timeline-0.sqlite").stat().st_size
    off_s, on_s = statistics.median(off), statistics.median(on)
    per_line = (on_s - off_s) / len(lines)
    print(f"1. {NODES} nodes × 1 Hz × {seconds} s = {len(lines)} stats lines, median of {ROUNDS}:")
    print(f"   controller event handling, recorder off: {off_s * 1e6 / len(lines):.1f} µs per line "
          f"({off_s / seconds * 100:.3f} % of a core at 1 Hz)")
    print(f"   recorder on: {on_s * 1e6 / len(lines):.1f} µs per line; the recorder adds {per_line * 1e6:.1f} µs")
    print(f"   ratio on/off, in-process event handling: {on_s / off_s:.3f}×")
    whole = WHOLE_CONTROLLER_SECONDS_PER_LINE
    print(f"   ratio against the whole controller ({whole * 1e6:.0f} µs per line, tests/benchmarks/README.md): "
          f"{(whole + per_line) / whole:.3f}×")
    print(f"   timeline file: {size / 1e6:.1f} MB for {seconds} s of {NODES} nodes")


class MeteredRecorder(TimelineRecorder):
    """Counts the CPU time of its own work (this thread's), which machine noise does not blur."""

    spent = 0.0
    _inside = False

    def _take(self, subscription) -> None:
        self._metered(super()._take, subscription)

    def flush(self) -> None:
        self._metered(super().flush)

    def _metered(self, work, *args) -> None:
        if self._inside:
            return work(*args)
        self._inside, start = True, time.thread_time()
        try:
            work(*args)
        finally:
            self.spent += time.thread_time() - start
            self._inside = False


async def live_cpu(config: Path, timeline: Path | None) -> tuple[float, float]:
    """(controller CPU s, the recorder's own CPU s) over LIVE_SECONDS with every node streaming,
    recording into `timeline` or not."""
    from homegpu.remote.nodes.cluster import Cluster
    from homegpu.remote.config.cluster_spec import load_cluster

    async with Cluster(load_cluster(config)) as cluster:
        await cluster.wait_settled(timeout=60)
        recorder = MeteredRecorder(timeline) if timeline else None
        task = asyncio.create_task(recorder.run(cluster.hub.subscribe())) if recorder else None
        await asyncio.sleep(2)  # let start-up work settle
        start, spent = time.process_time(), recorder.spent if recorder else 0.0
        await asyncio.sleep(LIVE_SECONDS)
        used = time.process_time() - start
        spent = (recorder.spent - spent) if recorder else 0.0
        if task:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            recorder.close()
        return used, spent


def bench_live() -> None:
    from gpu_replay import write_replay_nvidia_smi
    from simcluster import SimCluster

    gpu_fixtures = TESTS / "fixtures" / "gpu"
    nodes = [f"node{i}" for i in range(1, NODES + 1)]
    with SimCluster(NODES, first_host=100, extra_path_nodes=nodes) as sim, tempfile.TemporaryDirectory() as tmp:
        for node in sim.nodes:
            write_replay_nvidia_smi(node.extra_path, gpu_fixtures / "gpus_2x_h100nvl_idle.csv",
                                    gpu_fixtures / "apps_none.csv")
        config = sim.write_cluster_toml(Path(tmp) / "cluster.toml")
        off, on = [], []
        for round_ in range(LIVE_ROUNDS):
            off.append(asyncio.run(live_cpu(config, None)))
            on.append(asyncio.run(live_cpu(config, Path(tmp) / f"timeline-{round_}.sqlite")))
        rows = load_timeline(Path(tmp) / "timeline-0.sqlite").nodes
    print(f"live: the real controller, {NODES} sshd nodes streaming at 1 Hz, {LIVE_SECONDS:g} s × {LIVE_ROUNDS} each:")
    off_cpu, on_cpu = [c for c, _ in off], [c for c, _ in on]
    own = statistics.mean(spent for _, spent in on)
    print(f"   controller CPU off: {', '.join(f'{c:.3f}' for c in off_cpu)} s; "
          f"on: {', '.join(f'{c:.3f}' for c in on_cpu)} s; ratio of sums {sum(on_cpu) / sum(off_cpu):.3f}× (noisy)")
    samples = sum(len(node.cpu.times) for node in rows)
    print(f"   the recorder's own CPU inside the controller: {own * 1000:.1f} ms per {LIVE_SECONDS:g} s "
          f"({samples} node samples recorded in the first round); against the controller's mean off: "
          f"{(statistics.mean(off_cpu) + own) / statistics.mean(off_cpu):.3f}×")


def bench_report() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(tmp) / "demo-hour"
        recorder = TimelineRecorder(run_dir / "timeline.sqlite")
        events = synthetic_hour(nodes=4, seconds=3600)
        started = time.perf_counter()
        for event in events:
            recorder.handle(event)
        recorder.close()
        record_s = time.perf_counter() - started
        write_run_manifest(run_dir, {"name": "demo"}, {}, None)
        load_s, report_s = [], []
        for _ in range(3):
            started = time.perf_counter()
            load_timeline(run_dir / "timeline.sqlite")
            load_s.append(time.perf_counter() - started)
            started = time.perf_counter()
            path, _ = write_report(run_dir)
            report_s.append(time.perf_counter() - started)
        print(f"2. synthetic 1-hour 4-node run: {len(events)} events recorded in {record_s:.2f} s; "
              f"timeline {(run_dir / 'timeline.sqlite').stat().st_size / 1e6:.1f} MB")
        print(f"   load_timeline {statistics.median(load_s):.2f} s; write_report (load included) "
              f"{statistics.median(report_s):.2f} s, median of 3 (target < 2 s); "
              f"report.html {path.stat().st_size / 1e3:.0f} kB")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=int, default=600, help="run time replayed for part 1 (default 600)")
    parser.add_argument("--live", action="store_true", help="also measure the real controller on 16 sshd nodes")
    args = parser.parse_args()
    bench_recording(args.seconds)
    if args.live:
        bench_live()
    bench_report()


if __name__ == "__main__":
    main()

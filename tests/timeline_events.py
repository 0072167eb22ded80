"""Event sequences for the timeline and report tests and the benchmark, made of the hub's real dataclasses.

Node stats are the stats agent's real lines recorded in tests/fixtures/tui/ (an H100 under load, two
H100 NVL idle, a CPU-only node), parsed by the controller's own parser; only their time changes.
Worker metrics replay a real two-worker run's metrics.jsonl (tests/fixtures/tui/demo_metrics.jsonl),
moved in time.
`synthetic_hour` is the benchmark's made-up one-hour run: the recorded lines with GPU util and power
scaled by a load curve, and loss falling, so the report has something to draw over a long run.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

from homegpu.remote.events import (
    JobState, JobStateChanged, Metric, NodeState, NodeStateChanged, NodeStats, NodeStatsUpdated, PreflightResult,
    Straggler, WorkerExited, WorkerMetric,
)
from homegpu.remote.nodes.stats import parse_agent_line

FIXTURES = Path(__file__).parent / "fixtures" / "tui"
RECORDED = ("h100_mig_load", "h100nvl_idle", "cpu_only")
JOB, RUN_ID = "demo", "demo-20261122-120000"


def recorded_stats(name: str) -> NodeStats:
    return parse_agent_line((FIXTURES / f"{name}.json").read_text())


def demo_metrics() -> list[dict]:
    return [json.loads(line) for line in (FIXTURES / "demo_metrics.jsonl").read_text().splitlines()]


def _state(state: JobState, at: float, generation: int = 1, restarts: int = 0, detail: str = "") -> JobStateChanged:
    return JobStateChanged(JOB, RUN_ID, state, generation, restarts, detail, at=at)


def _metrics(at: float, generation_start: float, resumed: bool = False) -> list[WorkerMetric]:
    """The recorded run's metric lines, moved to start at `generation_start` (worker label = node)."""
    rows = demo_metrics()
    first = rows[0]["time"]
    events = []
    for row in rows:
        data = {k: v for k, v in row.items() if k != "worker_label"}
        if resumed and data["event"] == "start":
            data.update(initial_epoch=1, resumed=True)
        worker = "gpu1" if data["worker"] == 0 else "gpu2"
        data["time"] = generation_start + row["time"] - first
        events.append(WorkerMetric(JOB, RUN_ID, worker, data["worker"], Metric(data), at=data["time"]))
    return events


def scripted_run(t0: float = 1_795_316_000.0) -> list[object]:
    """A two-node run with every kind of event: preflight, launch, worker starts, stats at 1 Hz,
    a straggler, the node gpu2 going offline and back, a stall that restarts the run, the workers'
    exits, the resumed generation, and the end (succeeded). Returned sorted by time."""
    load, idle = recorded_stats("h100_mig_load"), recorded_stats("h100nvl_idle")
    events: list[object] = [
        _state(JobState.PREFLIGHT, t0),
        PreflightResult(JOB, "gpu1", (), "1× NVIDIA H100 80GB HBM3", at=t0 + 0.2),
        PreflightResult(JOB, "gpu2", (), "2× NVIDIA H100 NVL", at=t0 + 0.3),
        _state(JobState.PREFLIGHT, t0 + 0.4, detail="syncing code to 2 node(s)"),
        _state(JobState.STARTING, t0 + 0.5),
        _state(JobState.RUNNING, t0 + 1.0),
        *_metrics(t0, t0 + 2.0),
        Straggler(JOB, RUN_ID, "gpu2", 410.0, 1221.3, at=t0 + 6.0),
        NodeStateChanged("gpu2", NodeState.OFFLINE, "connection lost", at=t0 + 12.0),
        NodeStateChanged("gpu2", NodeState.ONLINE, at=t0 + 15.0),
        _state(JobState.RESTARTING, t0 + 20.0, 1, 0, "gpu2: no progress for 5s (stalled)"),
        WorkerExited(JOB, RUN_ID, "gpu1", 1, 1, "failed: restart resumes from the backup", at=t0 + 20.5),
        WorkerExited(JOB, RUN_ID, "gpu2", 1, 137, "killed", at=t0 + 20.6),
        _state(JobState.RUNNING, t0 + 22.0, 2, 1),
        *_metrics(t0, t0 + 23.0, resumed=True),
        WorkerExited(JOB, RUN_ID, "gpu1", 2, 0, "succeeded", at=t0 + 30.0),
        WorkerExited(JOB, RUN_ID, "gpu2", 2, 0, "succeeded", at=t0 + 30.1),
        _state(JobState.SUCCEEDED, t0 + 30.5, 2, 1),
    ]
    for second in range(31):
        events.append(NodeStatsUpdated("gpu1", load, at=t0 + second + 0.1))
        if not 12 <= second < 15:
            events.append(NodeStatsUpdated("gpu2", idle, at=t0 + second + 0.15))
    return sorted(events, key=lambda event: event.at)


def stats_stream(nodes: int, seconds: int, t0: float = 1_795_316_000.0) -> list[NodeStatsUpdated]:
    """`nodes` nodes at 1 Hz for `seconds`, cycling through the recorded lines."""
    lines = [recorded_stats(name) for name in RECORDED]
    return [NodeStatsUpdated(f"node{n + 1}", lines[n % len(lines)], at=t0 + s + n / 100)
            for s in range(seconds) for n in range(nodes)]


def _scaled(stats: NodeStats, load: float) -> NodeStats:
    gpus = tuple(dataclasses.replace(
        gpu, util=round(100 * load), power=round(gpu.power_limit * (0.15 + 0.8 * load), 1),
        mem_used=round(gpu.mem_total * (0.1 + 0.6 * min(1.0, load * 1.3))), temp=round(35 + 40 * load))
        for gpu in stats.gpus)
    return dataclasses.replace(stats, gpus=gpus, cpu=round(20 + 60 * load, 1))


def synthetic_hour(nodes: int = 4, seconds: int = 3600, t0: float = 1_795_316_000.0) -> list[object]:
    """A made-up one-hour run on `nodes` GPU nodes (see the module docstring), with a restart at 40 %
    and the last node a straggler; sorted by time."""
    base = [recorded_stats("h100_mig_load"), recorded_stats("h100nvl_idle")]
    workers = [f"node{n + 1}" for n in range(nodes)]
    restart = int(seconds * 0.4)
    events: list[object] = [_state(JobState.PREFLIGHT, t0)]
    events += [PreflightResult(JOB, w, (), "GPU ready", at=t0 + 0.5) for w in workers]
    events += [_state(JobState.STARTING, t0 + 1), _state(JobState.RUNNING, t0 + 2)]
    events += [_state(JobState.RESTARTING, t0 + restart, 1, 0, "node2: exit 1 (Collective ops is aborted)"),
               _state(JobState.RUNNING, t0 + restart + 20, 2, 1), _state(JobState.SUCCEEDED, t0 + seconds, 2, 1)]
    events.append(Straggler(JOB, RUN_ID, workers[-1], 900.0, 1500.0, at=t0 + 300))
    for generation_start in (t0 + 3, t0 + restart + 21):
        start = {"event": "start", "workers": nodes, "batch_size": 64, "params": 545_098,
                 "resumed": generation_start > t0 + 3, "initial_epoch": 2 if generation_start > t0 + 3 else 0}
        events += [WorkerMetric(JOB, RUN_ID, w, n, Metric({**start, "worker": n}), at=generation_start)
                   for n, w in enumerate(workers)]
    for s in range(seconds):
        down = restart <= s < restart + 25
        for n, worker in enumerate(workers):
            slow = 0.6 if n == nodes - 1 else 1.0 - 0.04 * n
            load = 0.0 if down or s < 10 else slow * (0.82 + 0.12 * math.sin(s / 97 + n))
            events.append(NodeStatsUpdated(worker, _scaled(base[n % 2], load), at=t0 + s + n / 100))
            if not down and s >= 10 and s % 5 == 0:
                progress = s / seconds
                data = {"event": "step", "worker": n, "epoch": 1 + s // 600, "step": s % 600,
                        "loss": 2.3 * math.exp(-3 * progress) + 0.05, "accuracy": 0.98 - 0.8 * math.exp(-4 * progress),
                        "examples_per_sec": 1500 * slow * (0.95 + 0.05 * math.sin(s / 50))}
                events.append(WorkerMetric(JOB, RUN_ID, worker, n, Metric(data), at=t0 + s + 0.5))
            if not down and s % 600 == 599:
                progress = s / seconds
                data = {"event": "epoch", "worker": n, "epoch": 1 + s // 600, "loss": 2.3 * math.exp(-3 * progress),
                        "accuracy": 0.97 - 0.8 * math.exp(-4 * progress),
                        "val_loss": 2.4 * math.exp(-2.8 * progress) + 0.08,
                        "val_accuracy": 0.95 - 0.8 * math.exp(-3.8 * progress), "examples_per_sec": 1500 * slow}
                events.append(WorkerMetric(JOB, RUN_ID, worker, n, Metric(data), at=t0 + s + 0.7))
    return sorted(events, key=lambda event: event.at)

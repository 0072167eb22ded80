"""What `homegpu status` spends a tick on the runs recorded here (remote/record/live_runs.py). Prints figures;
asserts nothing.

Run:  .venv/bin/python tests/benchmarks/bench_live_runs.py [--ended 300] [--lines 200000]

An experiments folder of `--ended` runs that ended (each with a metrics.jsonl no one holds) and one live run,
recorded by a real ExperimentLog, whose metrics.jsonl holds `--lines` step lines and an epoch line of each of two
workers every 500 (a long run). Measured: the first read (the live file read back from its end only as far as
every worker's latest epoch line), a steady tick with nothing new, a tick with one epoch line appended, and the
tick every RECHECK_SECONDS that looks at the ended runs' files again, each the median of 50 reads of the CPU time this process spent (the same LiveRuns, as status --watch keeps it).
No root, no LAN.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from homegpu.remote.events import Metric
from homegpu.remote.record import ExperimentLog, LiveRuns, RunFolder
from homegpu.remote.record.live_runs import RECHECK_SECONDS

STEP = {"event": "step", "worker": 0, "workers": 2, "time": 1795309958.342, "epoch": 1, "step": 10, "loss": 0.9,
        "accuracy": 0.5, "examples_per_sec": 300.0}


def epoch(rank: int, number: int) -> Metric:
    return Metric({"event": "epoch", "worker": rank, "workers": 2, "time": 1795309958.342, "epoch": number,
                   "epochs": 1000, "loss": 0.4, "accuracy": 0.88, "examples_per_sec": 327.0, "seconds": 4.3,
                   "shares": [39, 25], "compute_seconds": 0.94, "overhead_seconds": 0.16, "wait_seconds": 0.24,
                   "step_seconds": 1.34, "compute_examples_per_sec": 41.3})


def make(root: Path, ended: int, lines: int) -> ExperimentLog:
    for index in range(ended):
        folder = RunFolder.of(root, f"old-{index:04d}")
        folder.path.mkdir(parents=True)
        folder.metrics.write_text(json.dumps({"worker_label": "node1", **epoch(0, 1).fields}) + "\n")
    live = ExperimentLog(root, "demo-live")
    step = json.dumps({"worker_label": "node1", **STEP}) + "\n"
    with open(live.folder.metrics, "a") as handle:
        for index in range(lines):
            handle.write(step)
            if index % 500 == 0:
                for rank, label in enumerate(("node1", "node2")):
                    handle.write(json.dumps({"worker_label": label, **epoch(rank, index // 500 + 1).fields}) + "\n")
    return live


def cpu_ms(action) -> float:
    started = time.process_time()
    action()
    return (time.process_time() - started) * 1000


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ended", type=int, default=300)
    parser.add_argument("--lines", type=int, default=200_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        live = make(root, args.ended, args.lines)
        size = live.folder.metrics.stat().st_size
        firsts = [cpu_ms(LiveRuns(root).read) for _ in range(20)]
        now = [0.0]
        runs = LiveRuns(root, clock=lambda: now[0])
        runs.read()
        steady = [cpu_ms(runs.read) for _ in range(50)]
        appended = []
        for number in range(50):
            live.metric("node1", epoch(0, 10_000 + number))
            appended.append(cpu_ms(runs.read))
        rechecks = []
        for _ in range(50):
            now[0] += RECHECK_SECONDS  # due now: the ended runs' files looked at again
            rechecks.append(cpu_ms(runs.read))
        live.close()
    print(f"{args.ended} ended runs, one live run of {size / 2**20:.1f} MiB ({args.lines} step lines)")
    print(f"first read (a new status):       {statistics.median(firsts):6.2f} ms of CPU")
    print(f"a tick, nothing new:             {statistics.median(steady):6.2f} ms of CPU")
    print(f"a tick, an epoch line appended:  {statistics.median(appended):6.2f} ms of CPU")
    print(f"a recheck of the ended (every {RECHECK_SECONDS:g} s): {statistics.median(rechecks):6.2f} ms of CPU")


if __name__ == "__main__":
    main()

"""`homegpu report [RUN-ID]`: write a run's report.html from its record, print where and what happened."""

from __future__ import annotations

import argparse
from pathlib import Path

from homegpu.remote.record import ReportError, write_report
from homegpu.tui.cli.common import EXPERIMENTS, UserError


def register(commands: argparse._SubParsersAction) -> None:
    report = commands.add_parser(
        "report", help="write and summarise a run's report: loss, speed, GPUs, events",
        description="Write experiments/RUN-ID/report.html for a run from what it recorded (its timeline, "
                    "metrics and logs): loss and accuracy, throughput per worker, each node's GPUs and CPU "
                    "over time with the events marked, the job's settings and what limited the run. One "
                    "self-contained file: open it in any browser, no network needed. `homegpu run` writes "
                    "it when a run ends; this writes it again, or for a run that ended elsewhere.")
    report.add_argument("run_id", nargs="?", metavar="RUN-ID", help="the run (default: the latest one)")
    report.add_argument("--experiments", type=Path, default=EXPERIMENTS, metavar="DIR",
                        help="where runs are recorded (default: ./experiments)")
    report.set_defaults(handler=show_report)


def show_report(args: argparse.Namespace) -> int:
    run_dir = find_run(args.experiments, args.run_id)
    try:
        path, text = write_report(run_dir)
    except ReportError as exc:
        raise UserError(str(exc)) from None
    print(f"report: {path}")
    print(text)
    return 0


def find_run(experiments: Path, run_id: str | None) -> Path:
    """experiments/RUN-ID, or the latest run there. Raises UserError naming what to do."""
    if run_id:
        run_dir = experiments / run_id
        if not run_dir.is_dir():
            raise UserError(f"no run {run_id!r} in {experiments}/; `ls {experiments}` lists the runs")
        return run_dir
    runs = [d for d in experiments.iterdir() if d.is_dir()] if experiments.is_dir() else []
    if not runs:
        raise UserError(f"no runs in {experiments}/ yet; start one with `homegpu run`, or give --experiments DIR")
    return max(runs, key=lambda d: d.stat().st_mtime)

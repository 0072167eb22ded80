"""`homegpu run --no-tui`: the job's events as plain lines, and an exit status scripts can trust.

It consumes the same event stream the TUI does; all behaviour (launch, restart, stop) lives in
remote/ — this module only prints.
"""

from __future__ import annotations

import asyncio
import signal
import sys
from pathlib import Path
from typing import TextIO

from homegpu.remote.cluster import Cluster
from homegpu.remote.config import ClusterSpec
from homegpu.remote.events import (
    JobState, JobStateChanged, Metric, NodeState, NodeStateChanged, PreflightResult, Straggler, WorkerExited,
)
from homegpu.remote.job_config import JobSpec
from homegpu.remote.job_run import JobRun, LaunchError, RunOutcome, launch_or_attach
from homegpu.remote.logtail import LogLine
from homegpu.tui.text import table

EXIT_OK, EXIT_FAILED, EXIT_INTERRUPTED = 0, 1, 130


class LinePrinter:
    """Turns events into lines: prefixed logs, a progress line per metric, state changes."""

    def __init__(self, job: JobSpec, out: TextIO = sys.stdout) -> None:
        self.job, self.out = job, out
        self.width = 8

    def show(self, event: object) -> None:
        line = self.format(event)
        if line is not None:
            print(line, file=self.out, flush=True)

    def format(self, event: object) -> str | None:
        if isinstance(event, LogLine):
            if event.metric is not None:
                return None  # shown as a progress line from its Metric event
            return f"{event.worker or event.node:>{self.width}} | {event.text}"
        if isinstance(event, Metric):
            return self._progress(event)
        if isinstance(event, PreflightResult):
            if not event.problems:
                return f"preflight {event.node}: ready" + (f", {event.gpus}" if event.gpus else "")
            return "\n".join(f"preflight {event.node}: ✗ {problem}" for problem in event.problems)
        if isinstance(event, JobStateChanged):
            detail = f": {event.detail}" if event.detail else ""
            return f"== {event.job} {event.state.value} (run {event.run_id}, generation {event.generation}, " \
                   f"restarts {event.restarts}){detail}"
        if isinstance(event, WorkerExited):
            return f"== {event.worker} exited with status {event.exit_status}: {event.meaning}"
        if isinstance(event, Straggler):
            return (f"== straggler: {event.worker} runs {event.examples_per_sec:.0f} examples/s, "
                    f"the others {event.others_median:.0f}")
        if isinstance(event, NodeStateChanged) and event.state is not NodeState.ONLINE \
                and event.state is not NodeState.CONNECTING:
            return f"== node {event.node} {event.state.value}: {event.reason}"
        return None

    def _progress(self, event: Metric) -> str | None:
        data = event.data
        kind = data.get("event")
        if kind == "epoch":
            total = data.get("epochs") or (self.job.epochs if self.job.uses_trainer else "?")
            return (f"{event.worker:>{self.width}} * epoch {data.get('epoch')}/{total}  "
                    f"loss {_num(data.get('loss'))}  accuracy {_num(data.get('accuracy'))}  "
                    f"{_num(data.get('examples_per_sec'), '.0f')} examples/s")
        if kind == "step" and event.index == 0:
            return (f"{event.worker:>{self.width}} . epoch {data.get('epoch')} step {data.get('step')}  "
                    f"loss {_num(data.get('loss'))}  {_num(data.get('examples_per_sec'), '.0f')} examples/s")
        if kind in ("start", "end"):
            extra = f" (resumed at epoch {data['initial_epoch']})" if data.get("initial_epoch") else ""
            return f"{event.worker:>{self.width}} * training {'started' if kind == 'start' else 'finished'}{extra}"
        return None


def _num(value: object, spec: str = ".4f") -> str:
    return format(value, spec) if isinstance(value, (int, float)) else "n/a"


def summary(outcome: RunOutcome) -> str:
    rows = []
    for label, status, metric in outcome.workers:
        rows.append((label, status.exit_status if status and status.exit_status is not None else "-",
                     metric.get("epoch", "-"), _num(metric.get("loss")), _num(metric.get("accuracy")),
                     _num(metric.get("examples_per_sec"), ".0f")))
    head = f"run {outcome.state.value}: {outcome.detail}"
    return head + "\n" + table(("WORKER", "EXIT", "EPOCHS", "LOSS", "ACCURACY", "EXAMPLES/S"), rows)


async def run_headless(spec: ClusterSpec, job: JobSpec, experiments: Path, detach: bool,
                       out: TextIO = sys.stdout) -> int:
    """Launch (or attach to) `job` and print it to the end. Returns the process exit status."""
    printer = LinePrinter(job, out)
    async with Cluster(spec) as cluster:
        run = JobRun(cluster, job, experiments)
        printer.width = max(len(slot.label) for slot in run.slots)
        with cluster.subscribe() as events:
            pump = asyncio.create_task(_pump(events, printer))
            try:
                return await _drive(run, detach, out)
            finally:
                await asyncio.sleep(0.1)  # print what the last events said
                pump.cancel()


async def _drive(run: JobRun, detach: bool, out: TextIO) -> int:
    try:
        if await launch_or_attach(run):
            print(f"{run.job.name} is already running (run {run.run_id}): attaching, nothing new is started",
                  file=out, flush=True)
    except LaunchError as exc:
        print(f"homegpu: {run.job.name} not started: {exc}", file=sys.stderr, flush=True)
        return EXIT_FAILED
    if detach:
        print(f"{run.job.name} runs detached as {run.run_id}; follow it with `homegpu logs {run.job.name} -f`, "
              f"stop it with `homegpu stop {run.job.name}`", file=out, flush=True)
        await run.detach()
        return EXIT_OK
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGINT, run.stop)
    loop.add_signal_handler(signal.SIGTERM, run.stop)
    try:
        outcome = await run.watch()
    finally:
        loop.remove_signal_handler(signal.SIGINT)
        loop.remove_signal_handler(signal.SIGTERM)
    print(summary(outcome), file=out, flush=True)
    if outcome.state is JobState.SUCCEEDED and run.experiment:
        print(f"logs, metrics and model: {run.experiment.dir}", file=out, flush=True)
    return {JobState.SUCCEEDED: EXIT_OK, JobState.STOPPED: EXIT_INTERRUPTED}.get(outcome.state, EXIT_FAILED)


async def _pump(events, printer: LinePrinter) -> None:
    async for event in events:
        printer.show(event)

"""`homegpu run --no-tui`: the job's events as plain lines, and an exit status scripts can trust.

It consumes the same event stream the TUI does; all behaviour (launch, restart, stop) lives in
remote/ — this module only prints.
"""

from __future__ import annotations

import asyncio
import signal
import sys
from pathlib import Path
from typing import Callable, TextIO

from homegpu.remote.alerts import AlertWatcher
from homegpu.remote.config import ClusterSpec, JobSpec
from homegpu.remote.events import (
    Alert, AlertCommandFailed, AlertState, JobState, JobStateChanged, LogLine, NodeState, NodeStateChanged,
    PreflightResult, Straggler, Subscription, WorkerExited, WorkerMetric,
)
from homegpu.remote.jobs import JobRun, LaunchError, RunOutcome
from homegpu.remote.logs import TracebackFold, is_harmless_tf_notice
from homegpu.remote.nodes import Cluster
from homegpu.remote.record import RunFolder
from homegpu.tui.view.text import EpochEcho, epoch_line, number, rate_text, table

EXIT_OK, EXIT_FAILED, EXIT_INTERRUPTED = 0, 1, 130
EXIT_LOG_INCOMPLETE = 3  # every worker succeeded, but a log could not be read to its end


class LinePrinter:
    """Turns events into lines: prefixed logs (each traceback once, bounded: TracebackFold), a
    progress line per metric, state changes. `experiments`: where the run's full logs are said to be."""

    def __init__(self, job: JobSpec, out: TextIO | None = None, experiments: Path = Path("experiments")) -> None:
        self.job, self.out = job, out or sys.stdout  # sys.stdout as it is now: the command's filtered one
        self.width = 8
        self.experiments = experiments
        self._offline: set[str] = set()  # nodes said to be offline, to say when they are back
        self._echo = EpochEcho()
        self._run_id = ""
        self._fold = TracebackFold()

    def show(self, event: object) -> None:
        line = self.format(event)
        if line is not None:
            print(line, file=self.out, flush=True)

    def format(self, event: object) -> str | None:
        if isinstance(event, LogLine):
            return self._log_line(event)
        if isinstance(event, WorkerMetric):
            return _joined(self._logged(event.worker, self._fold.end(event.worker)) + [self._progress(event)])
        if isinstance(event, PreflightResult):
            lines = [f"preflight {event.node}: ✗ {problem}" for problem in event.problems]
            lines += [f"preflight {event.node}: ⚠ {warning}" for warning in event.warnings]
            if not event.problems:
                lines.insert(0, f"preflight {event.node}: ready" + (f", {event.gpus}" if event.gpus else ""))
            return "\n".join(lines)
        if isinstance(event, JobStateChanged):
            detail = f": {event.detail}" if event.detail else ""
            return _joined(self._fold_before(event) + [
                f"== {event.job} {event.state.value} (run {event.run_id}, generation {event.generation}, "
                f"restarts {event.restarts}){detail}"])
        if isinstance(event, WorkerExited):
            return f"== {event.worker} exited with status {event.exit_status}: {event.meaning}"
        if isinstance(event, Straggler):
            return (f"== straggler: {event.worker} runs {event.examples_per_sec:.0f} {event.unit}, "
                    f"the others {event.others_median:.0f}{event.cause_text}")
        if isinstance(event, NodeStateChanged):
            return self._node_state(event)
        if isinstance(event, Alert):
            return f"== alert{' cleared' if event.state is AlertState.CLEARED else ''}: {event.message}"
        if isinstance(event, AlertCommandFailed):
            return f"== {event.heading}: {event.reason} ({event.detail})"
        return None

    def _log_line(self, event: LogLine) -> str | None:
        worker = event.worker or event.node
        shown = self._fold.feed(worker, event.text)  # the fold reads every line, even those not shown
        if self._echo.repeats(worker, event.text):
            return None
        return _joined(self._logged(worker, shown))

    def _logged(self, worker: str, texts: list[str]) -> list[str]:
        """Log lines as shown, but TensorFlow's start-up noise on a node without a GPU (kept in the saved log)."""
        return [f"{worker:>{self.width}} | {text}" for text in texts if not is_harmless_tf_notice(text)]

    def _fold_before(self, event: JobStateChanged) -> list[str]:
        """What the tracebacks held or cut before a state line: all of it when the generation's logs
        were read to their end (a new one starts, or the run ended), else what was cut so far."""
        if event.run_id != self._run_id:
            self._run_id = event.run_id
            self._fold.reset()
            self._fold.log_path = lambda worker: str(RunFolder.of(self.experiments, event.run_id).log(worker))
        done = event.state is JobState.STARTING or event.state.finished
        return [line for worker, text in (self._fold.finish() if done else self._fold.pause())
                for line in self._logged(worker, [text])]

    def _node_state(self, event: NodeStateChanged) -> str | None:
        """Offline and the states that need the user, each once; and back online after them."""
        if event.state is NodeState.ONLINE:
            if event.node in self._offline:
                self._offline.discard(event.node)
                return f"== node {event.node} back online"
            return None
        if event.state is NodeState.CONNECTING or event.node in self._offline:
            return None
        self._offline.add(event.node)
        return f"== node {event.node} {event.state.value}: {event.reason}"

    def _progress(self, event: WorkerMetric) -> str | None:
        metric, worker = event.metric, f"{event.worker:>{self.width}}"
        if metric.event == "epoch":
            self._echo.shown(event.worker)
            total = metric.epochs or (self.job.epochs if self.job.uses_trainer else "?")
            return f"{worker} * {epoch_line(metric, total)}"
        if metric.event == "step" and event.index == 0:
            return (f"{worker} . epoch {metric.epoch} step {metric.step}  loss {number(metric.loss)}  "
                    f"{number(metric.examples_per_sec, '.0f')} examples/s")
        if metric.event == "saving":
            return f"{worker} * saving the model"
        if metric.event in ("start", "end"):
            extra = f" (resumed at epoch {metric.initial_epoch})" if metric.initial_epoch else ""
            return f"{worker} * training {'started' if metric.event == 'start' else 'finished'}{extra}"
        return None


def _joined(lines: list[str | None]) -> str | None:
    """Several lines as one printed text; None when there is none."""
    return "\n".join(line for line in lines if line is not None) or None


def summary(outcome: RunOutcome) -> str:
    rows = []
    with_val = any(metric.has_validation for _, _, metric in outcome.workers)
    for label, status, metric in outcome.workers:
        vals = (number(metric.val_loss), number(metric.val_accuracy)) if with_val else ()
        rows.append((label, status.exit_status if status and status.exit_status is not None else "-",
                     metric.fields.get("epoch", "-"), number(metric.loss), number(metric.accuracy), *vals,
                     rate_text(metric).split()[0]))
    unit = "STEPS/S" if rows and all(m.rate()[1] == "steps/s" for _, _, m in outcome.workers) else "EXAMPLES/S"
    head = f"run {outcome.state.value}: {outcome.detail}"
    val_columns = ("VAL_LOSS", "VAL_ACCURACY") if with_val else ()
    columns = ("WORKER", "EXIT", "EPOCHS", "LOSS", "ACCURACY", *val_columns, unit)
    return head + "\n" + table(columns, rows)


async def run_headless(spec: ClusterSpec, job: JobSpec, experiments: Path, detach: bool,
                       out: TextIO | None = None) -> int:
    """Launch (or attach to) `job` and print it to `out` (stdout) to the end. Returns the process exit status."""
    out = out or sys.stdout
    printer = LinePrinter(job, out, experiments)
    cluster = Cluster(spec)
    alerts = AlertWatcher(spec, cluster.hub).start()
    async with cluster:
        run = JobRun(cluster, job, experiments)
        printer.width = max(len(slot.label) for slot in run.slots)
        with cluster.subscribe() as events:
            pump = Pump(events, printer, run)
            task = asyncio.create_task(pump.run())
            try:
                return await _drive(run, detach, out, pump.flush)
            finally:
                task.cancel()
                await alerts.close()  # the last alerts' commands, and whether they worked
                pump.flush()


async def _drive(run: JobRun, detach: bool, out: TextIO, flush: Callable[[], None]) -> int:
    try:
        if await run.launch_or_attach():
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
    flush()  # every event before the summary, even what a flood left queued
    print(summary(outcome), file=out, flush=True)
    if outcome.energy is not None:
        print(outcome.energy.line(), file=out, flush=True)
    if run.experiment:
        print(record_line(run.experiment.folder.path, outcome), file=out, flush=True)
    for note in outcome.incomplete_logs:
        print(f"homegpu: incomplete log of {note}", file=out, flush=True)
    for note in outcome.left:
        print(f"homegpu: the run went on without {note}", file=out, flush=True)
    if outcome.state is JobState.SUCCEEDED and outcome.incomplete_logs:
        return EXIT_LOG_INCOMPLETE
    return {JobState.SUCCEEDED: EXIT_OK, JobState.STOPPED: EXIT_INTERRUPTED}.get(outcome.state, EXIT_FAILED)


def record_line(run_dir: Path, outcome: RunOutcome) -> str:
    """Where the run's record is, naming only what is really there."""
    have, folder = ["logs"], RunFolder(run_dir)
    if folder.metrics.is_file() and folder.metrics.stat().st_size:
        have.append("metrics")
    have += [name for name, path in (("timeline", folder.timeline), ("report", folder.report)) if path.is_file()]
    fetched = outcome.outputs.fetched
    if fetched and outcome.outputs.partial:
        have.append(f"the chief's partial output ({', '.join(fetched)}: the run {outcome.state.value}, so a file may be "
                    "cut short; output/PARTIAL.txt says why)")
    elif fetched:
        have.append(f"the chief's output ({', '.join(fetched)})")
    line = f"{', '.join(have)}: {run_dir}"
    for left in outcome.outputs.left:
        line += f"\n  left on the chief's node: {left}"
    if outcome.outputs.error:
        line += f"\n  {outcome.outputs.error}"
    report, _ = outcome.report
    if report is not None:
        line += f"\n  the run's report (open it in a browser): {report}"
    return line


class Pump:
    """Prints one subscription's events as they come, and says when a flood of output made the
    subscription drop some (the hub keeps a bounded queue per subscriber)."""

    def __init__(self, events: Subscription, printer: LinePrinter, run: JobRun) -> None:
        self.events, self.printer, self.job_run = events, printer, run
        self._dropped_said = 0

    async def run(self) -> None:
        async for event in self.events:
            self._show(event)

    def flush(self) -> None:
        """Print what is still queued, then say what was dropped, if anything."""
        for event in self.events.drain(1_000_000):
            self._show(event)
        self._say_dropped()

    def _show(self, event: object) -> None:
        self._say_dropped()
        self.printer.show(event)

    def _say_dropped(self) -> None:
        dropped = self.events.dropped - self._dropped_said
        if dropped:
            where = self.job_run.experiment.folder.logs if self.job_run.experiment else "the nodes (homegpu logs)"
            print(f"== {dropped} lines and events were not shown here (output faster than this terminal "
                  f"reads it); every line is in {where}", file=self.printer.out, flush=True)
            self._dropped_said = self.events.dropped

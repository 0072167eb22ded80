"""A run's end: every worker's log read to its end, the chief's outputs home, the backups let go (or removed after
a success), the folder and record closed, and how it ended (RunOutcome)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from homegpu.remote.events import JobState, Metric
from homegpu.remote.jobs.outputs import FetchedOutputs, fetch_outputs, remove_backups, remove_folders
from homegpu.remote.jobs.run_state import RunState
from homegpu.remote.jobs.worker_logs import finish_tails, stop_tails
from homegpu.remote.record import RunEnergy
from homegpu.remote.runtimes import WorkerStatus


@dataclass(frozen=True)
class RunOutcome:
    """How a run ended. `incomplete_logs`: "WORKER: where the full log is" for each worker whose log
    could not be read to its end (its node was gone); `outputs`: what came home from the chief."""

    state: JobState
    detail: str
    workers: tuple[tuple[str, WorkerStatus | None, Metric], ...]
    incomplete_logs: tuple[str, ...] = ()
    outputs: FetchedOutputs = FetchedOutputs()
    report: tuple[Path | None, str] = (None, "")  # report.html and its summary, or why there is none
    energy: RunEnergy | None = None  # the GPUs' energy and its cost, when any GPU reported its power
    left: tuple[str, ...] = ()  # "WORKER: where its full log is" for each worker of a node the run went on without


class RunEnd:
    """Close a run that ended (finish()) or that this controller leaves (leave())."""

    def __init__(self, run: RunState) -> None:
        self.run = run
        self.energy: RunEnergy | None = None  # read from the record when it closes

    async def finish(self, state: JobState, detail: str) -> RunOutcome:
        """Read every worker's log to its end and bring the chief's outputs home; the outcome, before the run's lock
        and nodes are let go (the caller's) and its record closed (close_record())."""
        run = self.run
        incomplete = await finish_tails(run.tracks.values(), run.run_id)
        outputs = await self._fetch_outputs("" if state is JobState.SUCCEEDED else f"the run {state.value}: {detail}")
        for keeper in run.keepers():
            await keeper.stop()
        if run.backup is not None and state is JobState.SUCCEEDED:
            run.backup.copy.discard()
        if run.checkpoints is not None and not outputs.error:  # what the chief wrote came home in output/
            run.checkpoints.copy.discard()
        if state is JobState.SUCCEEDED and run.job.uses_trainer and not outputs.error:
            await remove_backups([(t.runtime.node, t.runtime.out_dir(run.run_id, t.label))
                                  for t in run.tracks.values()])
        if run.instance != run.job.name:  # one of several runs of the job at once: its code copy was its own
            await remove_folders([(run.cluster.node(node), run.code_dir(node)) for node in run.nodes.work_dirs])
        self.close_experiment()
        return self._outcome(state, detail, incomplete, outputs)

    async def with_report(self, outcome: RunOutcome) -> RunOutcome:
        """`outcome` with the record's report and energy, the record closed."""
        report = await self.close_record()
        return replace(outcome, report=report, energy=self.energy)

    async def abandon(self) -> None:
        """The watch ended by an exception: stop what follows the run here, nothing more."""
        for keeper in self.run.keepers():
            await keeper.stop()
        await self.leave()

    async def leave(self) -> None:
        """Stop following the run here (its workers go on) and close its folder and record, with no report."""
        await stop_tails(self.run.tracks.values())
        self.close_experiment()
        await self.close_record(report=False)

    async def _fetch_outputs(self, unfinished: str) -> FetchedOutputs:
        """What the chief wrote in its output dir, into experiments/RUN-ID/output/ (not its backups);
        `unfinished`: why the run did not succeed, so that what came home is marked partial."""
        run = self.run
        if not run.experiment:
            return FetchedOutputs()
        chief = run.chief_track()
        run.publish(run.state, "fetching the chief's outputs")
        return await fetch_outputs(chief.runtime.node, chief.runtime.out_dir(run.run_id, chief.label),
                                   run.experiment.folder.output, unfinished=unfinished)

    def _outcome(self, state: JobState, detail: str, incomplete: tuple[str, ...],
                 outputs: FetchedOutputs) -> RunOutcome:
        run = self.run
        run.publish(state, detail)
        tracks = [*run.tracks.values(), *run.lost_tracks]
        left = tuple(f"{t.label}: its full log is on {t.slot.node.name} in {t.runtime.run_dir(run.run_id)}"
                     for t in run.lost_tracks)
        return RunOutcome(state, detail, tuple((t.label, t.status, t.last_metric) for t in tracks), incomplete, outputs,
                          left=left)

    def close_experiment(self) -> None:
        if self.run.experiment:
            self.run.experiment.close()

    async def close_record(self, report: bool = True) -> tuple[Path | None, str]:
        if self.run.record is None:
            return None, "no record"
        record, self.run.record = self.run.record, None
        closed = await record.close(report)
        self.energy = record.energy
        return closed

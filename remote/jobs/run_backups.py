"""A run's backups: the chief's kept off the chief (jobs/backup_copy.py), and a script's checkpoint in the chief's
working dir (jobs/checkpoint_copy.py), put onto every worker of a new generation, so that all resume from the same
epoch; which epoch that is."""

from __future__ import annotations

from homegpu.remote.events import NodeState
from homegpu.remote.jobs.backup_copy import BackupCopy, BackupKeeper, backup_dir
from homegpu.remote.jobs.checkpoint_copy import CheckpointCopy
from homegpu.remote.jobs.resume_check import Carried, disagreement, drift_line
from homegpu.remote.jobs.run_state import RunState
from homegpu.remote.jobs.watch import WorkerTrack
from homegpu.remote.nodes import NodeSession


def finished_here(track: WorkerTrack) -> int:
    """The last epoch `track`'s worker finished in this generation; 0 before its first (its last_metric is still the
    previous generation's, whose epoch its backup, restored from the copy, may not hold)."""
    return (track.last_metric.epoch or 0) if track.first_epochs.finished is not None else 0


class RunBackups:
    """The run's BackupKeepers: the backup's (TensorFlow jobs) in RunState.backup, a script's checkpoint's in
    RunState.checkpoints."""

    def __init__(self, run: RunState) -> None:
        self.run = run
        self.checkpoint: CheckpointCopy | None = None  # RunState.checkpoints' copy, for what it carried

    def keep_copies(self) -> None:
        run = self.run
        if run.job.is_tensorflow and run.backup is None:
            copy = BackupCopy(run.experiment.folder.path / "chief-backup")
            run.backup = BackupKeeper(copy, self._sources, lambda line: run.publish(run.state, line))
        if run.job.script and run.checkpoints is None:
            self.checkpoint = CheckpointCopy(run.experiment.folder.path / "chief-checkpoint", run.job.checkpoint)
            run.checkpoints = BackupKeeper(self.checkpoint, self._chief_dir, lambda line: run.publish(run.state, line))

    def _backup_of(self, track: WorkerTrack) -> tuple[NodeSession, str]:
        """A worker's node and its backup dir there."""
        return track.runtime.node, backup_dir(track.runtime.out_dir(self.run.run_id, track.label))

    def _sources(self) -> list[tuple[NodeSession, str, int]]:
        """Where the newest backup is, best first (backup_copy.BackupSources): the chief's, and for the built-in
        trainer, whose every worker keeps the same one, the other workers' (node online, an epoch finished)."""
        run = self.run
        tracks = [run.tracks[slot.label] for slot in run.slots]
        return [(*self._backup_of(t), finished_here(t)) for t in (tracks if run.job.uses_trainer else tracks[:1])
                if finished_here(t) and t.runtime.node.state is NodeState.ONLINE]

    def _chief_dir(self) -> list[tuple[NodeSession, str, int]]:
        """Where a script's checkpoint is: the chief's working dir (its output dir), while its node is online."""
        run = self.run
        chief = run.chief_track()
        if chief.runtime.node.state is not NodeState.ONLINE:
            return []
        return [(chief.runtime.node, chief.runtime.out_dir(run.run_id, chief.label), finished_here(chief))]

    def drift(self) -> str | None:
        """Where this generation's workers began at different epochs (their first epoch lines): the line naming
        which checkpoint is missing where (resume_check.py); None while they agree."""
        run = self.run
        said = disagreement({label: track.first_epochs for label, track in run.tracks.items()})
        if said is None:
            return None
        chief = run.chief_track()
        copy = self.checkpoint
        where = chief.runtime.out_dir(run.run_id, chief.label)
        carried = Carried(where, copy.files, copy.left, copy.refused, run.job.checkpoint) if copy else Carried(where)
        return drift_line(said, chief.label, carried)

    async def restore(self) -> list[str]:
        """Put the copy of the chief's backup, and of a script's checkpoint, onto every worker, so that all resume
        from the same epoch."""
        run, problems = self.run, []
        if run.backup is not None:
            problems += await run.backup.put([self._backup_of(t) for t in run.tracks.values()])
        if run.checkpoints is not None:
            problems += await run.checkpoints.put([(t.runtime.node, t.runtime.out_dir(run.run_id, t.label))
                                                   for t in run.tracks.values()])
        return problems

    def resume_epoch(self) -> int | None:
        """The epochs the next generation resumes after: the copy's, else the built-in trainer's workers' (each has
        its own backup); None for a script without a backup (it starts over, unless it resumes by itself)."""
        run = self.run
        if run.backup is not None and run.backup.epoch is not None:
            return run.backup.epoch
        if not run.job.uses_trainer:
            return None
        return max((t.last_metric.epoch or 0 for t in run.tracks.values()), default=0)

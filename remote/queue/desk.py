"""The queue's front desk: what `submit`, `queue` and `cancel` do to the store, checked against the
cluster file as it is now (cluster_file.py: read again when edited; the job must be one of its jobs, every
`--set` must apply, `--after` must name an entry). Starting and stopping runs is the runner's; the desk tells it through `changed` and `stop_run`.
"""

from __future__ import annotations

import time
from typing import Callable

from homegpu.remote.config import ClusterSpec
from homegpu.remote.queue.cluster_file import ClusterFile
from homegpu.remote.queue.entries import QueueEntry, QueueError
from homegpu.remote.queue.overrides import apply_overrides
from homegpu.remote.queue.store import QueueStore


class QueueDesk:
    """Answers the socket's requests (server.QueueService) from `store`, for the jobs of `cluster` (its file
watched, or a spec, which is then watched from here).

    Args:
        changed: called after every change, so the runner looks at the queue now rather than at its next tick.
        stop_run: asked to stop the run of an entry that is starting or running (a cancel).
    """

    def __init__(self, cluster: ClusterFile | ClusterSpec, store: QueueStore, changed: Callable[[], None] = lambda: None,
                 stop_run: Callable[[QueueEntry, str], None] = lambda entry, user: None,
                 clock: Callable[[], float] = time.time) -> None:
        self.cluster_file = cluster if isinstance(cluster, ClusterFile) else ClusterFile(cluster)
        self.store, self.clock = store, clock
        self._changed, self._stop_run = changed, stop_run

    def submit(self, job: str, after: list[str], priority: int, overrides: list[str], user: str) -> QueueEntry:
        cluster = self.cluster_file.check()  # the file as it is now, if it was edited
        if self.cluster_file.refusal:
            raise QueueError(self.cluster_file.refusal)
        spec = cluster.jobs.get(job)
        if spec is None:
            known = ", ".join(sorted(cluster.jobs)) or "none"
            raise QueueError(f"no job {job[:60]!r} in {cluster.source} (its jobs: {known}); add a [jobs.{job[:60]}] "
                             "table there, or submit one of those")
        apply_overrides(cluster, spec, overrides)  # refused now, in the submitter's terminal, not at 3 a.m.
        entry = self.store.submit(job, overrides=overrides, after=after, priority=priority, user=user,
                                  now=self.clock())
        self._changed()
        return entry

    def entries(self) -> list[QueueEntry]:
        return self.store.entries()

    def cancel(self, id_: str, user: str) -> QueueEntry:
        entry = self.store.cancel(id_, f"cancelled by {user}", self.clock())
        if entry.state.active:
            self._stop_run(entry, user)
        self._changed()
        return entry

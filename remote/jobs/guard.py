"""A job's run lock as one run holds it (RunGuard): taken on the chief's node before the run launches
(remote/jobs/lock.py), refreshed from the watch loop so other controllers see it is alive, and released when the run
ends. JobRun.launch_or_attach() decides, by it, whether to launch or attach to another controller's run.
"""

from __future__ import annotations

import contextlib
import time

from homegpu.remote.jobs.job_runtimes import LaunchError
from homegpu.remote.jobs.lock import HEARTBEAT_SECONDS, LockHolder, RunLockError, acquire, refresh, release
from homegpu.remote.nodes import NODE_GONE, NodeSession


class RunGuard:
    """The run lock of `job` on `node` (the chief's), as run `run_id` holds it."""

    def __init__(self, node: NodeSession, work_dir: str, job: str, run_id: str) -> None:
        self.node, self.work_dir, self.job, self.run_id = node, work_dir, job, run_id
        self.held = False
        self._last_heartbeat = 0.0

    async def take(self) -> LockHolder | None:
        """Take the lock; the holder when another controller has it.

        Raises:
            LaunchError: the lock could not be read or written (node gone, no python there).
        """
        try:
            result = await acquire(self.node, self.work_dir, self.job, self.run_id)
        except (RunLockError, *NODE_GONE) as exc:
            raise LaunchError(str(exc)) from None
        self.held = result.acquired
        return None if result.acquired else result.holder

    async def release(self) -> None:
        if self.held:
            self.held = False
            with contextlib.suppress(RunLockError, *NODE_GONE):
                await release(self.node, self.work_dir, self.job, self.run_id)

    async def heartbeat(self) -> None:
        """Refresh the lock when HEARTBEAT_SECONDS have passed since the last time (call it often)."""
        if self.held and time.monotonic() - self._last_heartbeat > HEARTBEAT_SECONDS:
            self._last_heartbeat = time.monotonic()
            with contextlib.suppress(RunLockError, *NODE_GONE):
                await refresh(self.node, self.work_dir, self.job, self.run_id)

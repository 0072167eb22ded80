"""A job started once: launch it or attach to its run, under its run lock (remote/jobs/lock.py).

launch_or_attach() attaches to the job's run when one already runs on its nodes. Else the run takes
the lock on the chief's node before it launches (a RunGuard), refreshes it from the watch loop so
other controllers see it is alive, and releases it when the run ends. A controller that finds the
lock held waits for the holder's workers to appear and attaches to them instead of launching.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Callable, Protocol

from homegpu.remote.config import JobSpec
from homegpu.remote.jobs.job_runtimes import JobRuntimes, LaunchError
from homegpu.remote.jobs.lock import HEARTBEAT_SECONDS, LockHolder, RunLockError, acquire, refresh, release
from homegpu.remote.nodes import NODE_GONE, NodeSession

LOCK_WAIT_SECONDS = 90.0  # for another controller's launch (preflight, sync) to show its workers


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


class Startable(Protocol):
    """What launch_or_attach needs of a run (remote/jobs/run.py's JobRun)."""

    job: JobSpec
    nodes: JobRuntimes | None

    async def prepare(self, timeout: float | None = None, waking: Callable[[str], None] | None = None) -> None: ...
    def say_waking(self, line: str) -> None: ...
    def adopt(self, run_id: str, generation: int) -> None: ...
    async def take_lock(self) -> LockHolder | None: ...
    async def release_lock(self) -> None: ...
    async def launch(self) -> None: ...


async def attach_if_running(run: Startable, wake: bool = False) -> bool:
    """Attach `run` to its job if that already runs on its nodes; True when it did. Raises LaunchError.
    `wake`: the job is to run: its asleep nodes are woken first (only looking wakes nothing)."""
    await run.prepare(waking=run.say_waking if wake else None)
    active = await run.nodes.find()
    if active:
        run.adopt(*active)
    return bool(active)


async def launch_or_attach(run: Startable) -> bool:
    """Attach `run` to its job if that already runs on its nodes, else launch it.

    Returns True when it attached (nothing new was started). Raises LaunchError.
    """
    if await attach_if_running(run, wake=True):
        return True
    holder = await run.take_lock()
    if holder is not None:
        return await _attach_once_started(run, holder)
    try:
        await run.launch()
    except BaseException:
        await run.release_lock()
        raise
    return False


async def _attach_once_started(run: Startable, holder: LockHolder) -> bool:
    """Another controller holds the job's lock: its launch is under way. Attach to it once its
    workers run, rather than start the job a second time. Raises LaunchError when none appear."""
    deadline = time.monotonic() + LOCK_WAIT_SECONDS
    while time.monotonic() < deadline:
        await asyncio.sleep(1.0)
        if await attach_if_running(run):
            return True
    raise LaunchError(f"{run.job.name} is being started by {holder.describe()}, whose workers did not "
                      f"appear within {LOCK_WAIT_SECONDS:g} s; wait for it, or stop it: homegpu stop {run.job.name}")

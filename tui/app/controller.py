"""The TUI's hands: the Cluster, the one job run on screen, bandwidth, doctor and trust, and serve's queue.

No Textual here: the app calls these coroutines from its workers and learns what happened from the
cluster's event stream, exactly as the headless runner does. Every behaviour lives in remote/.
"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

from homegpu.remote.alerts import AlertWatcher
from homegpu.remote.config import ClusterSpec, JobSpec
from homegpu.remote.doctor import Check, diagnose
from homegpu.remote.events import BandwidthMatrix, Subscription
from homegpu.remote.jobs import JobRun, LaunchError, RunOutcome
from homegpu.remote.net import LinkCallback, bandwidth_store, link_timeout, measure, pairs
from homegpu.remote.nodes import Cluster, OfferedKey
from homegpu.remote.plan import JobLayout, job_node_specs, last_timeline, lay_out
from homegpu.remote.queue import QueueClient, socket_path
from homegpu.tui.view.text import serve_command

BANDWIDTH_SECONDS = 1.0


class Busy(Exception):
    """The action cannot start now (a job already runs, a test is under way); the message says why."""


class Controller:
    """Owns the open Cluster and at most one JobRun. Use as `async with Controller(...) as c:`."""

    def __init__(self, spec: ClusterSpec, experiments: Path) -> None:
        self.spec, self.experiments = spec, experiments
        self.cluster = Cluster(spec)
        self.alerts = AlertWatcher(spec, self.cluster.hub)  # [alerts] while open
        self.queue = QueueClient(socket_path(spec), serve_command(spec))  # the queue serve runs, if one does
        self.run: JobRun | None = None
        self.outcome: RunOutcome | None = None
        self._watching: asyncio.Task | None = None
        self._job_lock = asyncio.Lock()

    async def __aenter__(self) -> "Controller":
        self.alerts.start()
        await self.cluster.__aenter__()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close(stop_job=False)

    def subscribe(self) -> Subscription:
        return self.cluster.subscribe()

    # -- jobs ------------------------------------------------------------------------------------

    @property
    def job_running(self) -> bool:
        """A run is followed and has not ended (its tails may still be closing after it ended)."""
        return self._following() and not self.run.state.finished

    def _following(self) -> bool:
        return self._watching is not None and not self._watching.done()

    def layout(self, job: JobSpec) -> JobLayout:
        """`job`'s workers in TF_CONFIG order and its device plan, from the nodes' latest stats, for the
        launch dialog (a node that sent no stats yet leaves the plan out and says so)."""
        stats = {node.name: self.cluster.node(node.name).latest for node in job_node_specs(self.spec, job)}
        return lay_out(self.spec, job, stats, self.cluster.addresses(), last_timeline(self.experiments, job.name))

    async def launch(self, job: JobSpec) -> bool:
        """Launch `job`, or attach if it already runs; then follow it in the background.

        Returns True when it attached to a running job. Raises Busy or LaunchError.
        """
        async with self._job_lock:
            if self.job_running:
                raise Busy(f"{self.run.job.name} is running: stop it (s) before launching another job")
            run = JobRun(self.cluster, job, self.experiments)
            attached = await run.launch_or_attach()
            self._follow(run)
            return attached

    async def attach_running(self) -> JobRun | None:
        """Find a job of cluster.toml that already runs on its nodes (a restarted homegpu) and follow it."""
        for job in self.spec.jobs.values():
            async with self._job_lock:
                if self.job_running:
                    return self.run
                run = JobRun(self.cluster, job, self.experiments)
                with contextlib.suppress(LaunchError):
                    if await run.attach_if_running():
                        self._follow(run)
                        return run
        return None

    def _follow(self, run: JobRun) -> None:
        self.run, self.outcome = run, None
        self._watching = asyncio.create_task(self._watch(run), name=f"watch {run.run_id}")

    async def _watch(self, run: JobRun) -> None:
        self.outcome = await run.watch()

    def stop_job(self) -> None:
        """Ask the run to stop every worker; it ends (JobStateChanged STOPPED) when they have."""
        if self.run is not None:
            self.run.stop()

    async def wait_job(self) -> None:
        if self._watching is not None:
            await asyncio.shield(self._watching)

    async def close(self, stop_job: bool) -> None:
        """Stop the job (or leave it running on its nodes), then close every session."""
        if self.job_running and not stop_job:
            self._watching.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watching
            await self.run.detach()
        elif self._following():
            self.stop_job()  # a no-op for a run that already ended and only closes its tails
            await self.wait_job()
        await self.cluster.close()
        await self.alerts.close()

    # -- nodes -----------------------------------------------------------------------------------

    def link_count(self) -> int:
        return len(pairs(list(self.cluster.nodes)))

    async def measure_bandwidth(self, on_link: LinkCallback) -> BandwidthMatrix:
        matrix = await measure(self.cluster, seconds=BANDWIDTH_SECONDS,
                               timeout=link_timeout(BANDWIDTH_SECONDS), on_link=on_link)
        bandwidth_store.save(self.spec, matrix)
        return matrix

    def saved_bandwidth(self) -> tuple[BandwidthMatrix | None, str]:
        """The matrix the last test on this cluster saved (here or by `homegpu bandwidth`), if any,
        and "" or the line that says the saved file is damaged (bandwidth_store.read)."""
        return bandwidth_store.read(self.spec)

    async def doctor(self) -> list[Check]:
        return await diagnose(self.cluster)

    def reconnect(self, node: str) -> None:
        self.cluster.reconnect(node)

    async def offered_key(self, node: str) -> OfferedKey:
        return await self.cluster.offered_key(node)

    def trust(self, node: str, key: OfferedKey) -> None:
        self.cluster.trust(node, key)

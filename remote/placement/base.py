"""The placement's contract: who decides which nodes a run gets and when, one protocol for every kind of placement.

homegpu's own scheduler (own.py) gives a run its job's nodes at once; Slurm (slurm.py) gives it the nodes of a Slurm
job it submits and waits for. The run, the queue and the command line ask a `Placement` (factory.py makes the one
`[cluster] scheduler` names) and never which kind it is.
"""

from __future__ import annotations

import asyncio
from typing import Callable, Protocol, Sequence

from homegpu.remote.config import JobSpec
from homegpu.remote.events import JobState
from homegpu.remote.nodes import Cluster
from homegpu.remote.slurm import SlurmJob

Say = Callable[[str], None]


class PlacementError(Exception):
    """The placement refused or ended a run's nodes, or its commands could not run; one line that says why."""


class RunPlacement(Protocol):
    """Where one run is placed: the nodes it gets, held while it runs and let go when it ends."""

    async def place(self, job: JobSpec, run_id: str, starting: Say | None, stop: asyncio.Event) -> list[str] | None:
        """The nodes the run gets, in any order: those of a placement of this job that holds nodes already (another
        controller's run, to attach to), else, when work is to start (`starting`, told each step), new ones.

        Returns:
            None where the placement leaves the run its job's own nodes (or only looks, and none hold any).

        Raises:
            PlacementError: the placement refused the run, ended it before it ran, or placed it on a node
                cluster.toml lacks (one line naming the job).
        """

    def launching(self) -> None:
        """The run launches here: what holds its nodes is this controller's, to cancel() when the start fails."""

    async def cancel(self) -> None:
        """Let go of the run's nodes where this controller placed them or launched on them (a start that failed)."""

    async def release(self, state: JobState) -> None:
        """Let go of the run's nodes as it ended in `state` (whichever controller saw the end)."""

    async def ended(self) -> str:
        """Why the placement took the run's nodes back while the run went on; "" while it holds them."""

    def unreachable(self, job: JobSpec, problem: str) -> str:
        """`problem` (homegpu cannot reach the run's nodes over SSH) in the placement's words; "" where it adds
        none."""


class Placement(Protocol):
    """Who places a cluster's runs (`[cluster] scheduler`)."""

    places_nodes: bool  # True: the placement, not serve's queue, decides which nodes an entry's run gets and when

    def for_run(self, cluster: Cluster, priority: int = 0, after: Sequence[str] = (),
                on_placed: Say | None = None) -> RunPlacement:
        """A run's placement. `priority`: the queue entry's; `after`: the placement's ids of the runs that must
        succeed first (those of entries it placed); `on_placed`: told the placement's id of the run once it has one."""

    async def queued(self) -> list[SlurmJob] | None:
        """homegpu's runs in the placement's own queue; None where it has none (serve's queue is the queue).

        Raises:
            PlacementError: its queue could not be read.
        """

    def owns_ids(self, ids: Sequence[str]) -> bool:
        """Whether `ids` (given to `homegpu cancel`) are all the placement's own ids rather than serve's entries."""

    async def cancel_queued(self, ids: Sequence[str], say: Say, complain: Say) -> int:
        """Cancel each of homegpu's runs in the placement's queue named by `ids`, saying each; how many failed.

        Raises:
            PlacementError: its queue could not be reached.
        """

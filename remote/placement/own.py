"""homegpu's own scheduler as a placement: a run gets its job's nodes at once, and serve's queue decides when."""

from __future__ import annotations

import asyncio
from typing import Sequence

from homegpu.remote.config import ClusterSpec, JobSpec
from homegpu.remote.events import JobState
from homegpu.remote.nodes import Cluster
from homegpu.remote.placement.base import Say


class OwnRunPlacement:
    """A run on its job's own nodes: nothing holds them but the run itself."""

    async def place(self, job: JobSpec, run_id: str, starting: Say | None, stop: asyncio.Event) -> list[str] | None:
        return None

    def launching(self) -> None:
        pass

    async def cancel(self) -> None:
        pass

    async def release(self, state: JobState) -> None:
        pass

    async def ended(self) -> str:
        return ""

    def unreachable(self, job: JobSpec, problem: str) -> str:
        return ""


class OwnPlacement:
    """homegpu starts each worker itself, on the nodes its jobs name (`scheduler = "homegpu"`)."""

    places_nodes = False

    def __init__(self, spec: ClusterSpec) -> None:
        self.spec = spec

    def for_run(self, cluster: Cluster, priority: int = 0, after: Sequence[str] = (),
                on_placed: Say | None = None) -> OwnRunPlacement:
        return OwnRunPlacement()

    async def queued(self) -> None:
        return None

    def owns_ids(self, ids: Sequence[str]) -> bool:
        return False

    async def cancel_queued(self, ids: Sequence[str], say: Say, complain: Say) -> int:
        return 0

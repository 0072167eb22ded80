"""A run's events: its state, each node's preflight, a worker that exited, a straggler."""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field


class JobState(str, enum.Enum):
    PREFLIGHT = "preflight"
    STARTING = "starting"
    RUNNING = "running"
    RESTARTING = "restarting"
    STOPPING = "stopping"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    STOPPED = "stopped"

    @property
    def finished(self) -> bool:
        return self in (JobState.SUCCEEDED, JobState.FAILED, JobState.STOPPED)


@dataclass(frozen=True)
class JobStateChanged:
    job: str
    run_id: str
    state: JobState
    generation: int
    restarts: int
    detail: str = ""
    at: float = field(default_factory=time.time)
    regroup: str = ""  # who trains changed (jobs/fewer.py): SHRUNK, a machine left for good, or REJOINED


SHRUNK, REJOINED = "shrunk", "rejoined"  # JobStateChanged.regroup


@dataclass(frozen=True)
class PreflightResult:
    """One node's preflight: empty `problems` means ready; `warnings` do not stop the launch
    (another process holding much of a GPU the job will use, say)."""

    job: str
    node: str
    problems: tuple[str, ...]
    gpus: str = ""
    warnings: tuple[str, ...] = ()
    at: float = field(default_factory=time.time)


@dataclass(frozen=True)
class WorkerExited:
    job: str
    run_id: str
    worker: str
    generation: int
    exit_status: int | None
    meaning: str
    at: float = field(default_factory=time.time)


@dataclass(frozen=True)
class Straggler:
    """A worker clearly slower than the others (its rate against the median of the rest's).

    `examples_per_sec` and `others_median` are in `unit`: examples/s, or steps/s for a script whose
    batch size homegpu does not know (Keras prints steps). `held_back`: what holds the worker's GPUs
    back as its node's stats showed it then (nodes/health.py's sentences), where anything does; `balanced`, in a run
    whose shares follow speed, what they gave it (so the others do not wait for it)."""

    job: str
    run_id: str
    worker: str
    examples_per_sec: float
    others_median: float
    at: float = field(default_factory=time.time)
    unit: str = "examples/s"
    epoch: int | None = None  # the epoch whose rates showed it
    held_back: tuple[str, ...] = ()
    balanced: str = ""  # what balancing did about it (a balanced run: trainer/shares.py), in words

    @property
    def cause_text(self) -> str:
        """". Held back: GPU 0 thermal slowdown ...", then what balancing did, to follow its figures; "" where
        nothing was seen and the run is not balanced."""
        held = ". Held back: " + ". ".join(self.held_back) if self.held_back else ""
        return held + (f". {self.balanced}" if self.balanced else "")

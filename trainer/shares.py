"""Each worker's share of a step's global batch, from its measured speed: pure, standard library only.

A synchronous step ends when its slowest worker does. With even shares a desktop and an old laptop step at
the laptop's pace, slower together than the desktop alone. With shares in proportion to each worker's compute
speed (examples/s of its own forward and backward pass, without the time it waits in the collective), every
worker finishes its part at the same moment and the step takes global batch / sum of the speeds: machines add
up. The global batch stays what the job says; only its split changes.

A share never drops below `floor` (an eighth of an even share, at least one example), which keeps a worker
useful rather than idle; a machine whose floor alone takes longer than the others need for the whole step
without it slows the run, and `slows_the_run` names it with the figures.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping, Sequence

SHARES_ENV = "HOMEGPU_SHARES"  # "422,90": the shares a run starts with (the run's own last, or its job's last run's)
BALANCE_ENV = "HOMEGPU_BALANCE"  # "even": the job keeps the even split
FLOOR_FRACTION = 1 / 8  # the smallest share, as a part of an even share
CHANGE_FRACTION = 0.05  # shares are revised when that makes a step this much shorter


def even(global_batch: int, workers: int) -> list[int]:
    """The even split, the remainder to the first workers (the job's default)."""
    base, extra = divmod(global_batch, workers)
    return [base + (rank < extra) for rank in range(workers)]


def even_asked(environ: Mapping[str, str]) -> bool:
    """Whether the job asked for the even split (its `balance = "even"`)."""
    return environ.get(BALANCE_ENV, "").strip().lower() == "even"


def given(environ: Mapping[str, str], global_batch: int, workers: int) -> list[int] | None:
    """The shares $HOMEGPU_SHARES gives, rescaled to this global batch; None where it gives none that fit
    `workers` (a run of other machines, or no word at all)."""
    try:
        wanted = [int(part) for part in environ.get(SHARES_ENV, "").split(",")]
    except ValueError:
        return None
    if len(wanted) != workers or min(wanted) <= 0:
        return None
    return split(global_batch, wanted)


def floor(global_batch: int, workers: int) -> int:
    """The smallest share a worker gets."""
    return max(1, int(global_batch / workers * FLOOR_FRACTION))


def split(global_batch: int, speeds: Sequence[float | None]) -> list[int]:
    """Shares of `global_batch` in proportion to `speeds` (examples/s), each at least `floor`, summing to
    `global_batch`. Any speed unknown (None, zero, not finite) gives the even split: one guess is no basis."""
    workers = len(speeds)
    if workers == 0:
        return []
    known = [speed for speed in speeds if speed is not None and math.isfinite(speed) and speed > 0]
    least = floor(global_batch, workers)
    if len(known) < workers or global_batch < least * workers:
        return even(global_batch, workers)
    clamped: set[int] = set()
    while True:  # water-filling: a worker below the floor gets it, the rest is shared by the others' speeds
        free = [rank for rank in range(workers) if rank not in clamped]
        left = global_batch - least * len(clamped)
        total = sum(speeds[rank] for rank in free)
        ideal = {rank: left * speeds[rank] / total for rank in free}
        below = {rank for rank, share in ideal.items() if share < least}
        if not below:
            break
        clamped |= below
    shares = [least] * workers
    for rank, share in _rounded(ideal, left).items():
        shares[rank] = share
    return shares


def _rounded(ideal: dict[int, float], total: int) -> dict[int, int]:
    """Whole numbers summing to `total`, the largest remainders rounded up (ties to the lower rank)."""
    whole = {rank: int(share) for rank, share in ideal.items()}
    short = total - sum(whole.values())
    for rank in sorted(ideal, key=lambda rank: (whole[rank] - ideal[rank], rank))[:short]:
        whole[rank] += 1
    return whole


def worth_changing(old: Sequence[int], new: Sequence[int], speeds: Sequence[float | None]) -> bool:
    """Whether moving from `old` to `new` shortens a step by more than CHANGE_FRACTION at these speeds: a wobble
    of measured speed (two alike machines measured a few per cent apart) does not reshuffle the data."""
    if list(old) == list(new) or any(not speed for speed in speeds):
        return False
    return step_seconds(old, speeds) > (1 + CHANGE_FRACTION) * step_seconds(new, speeds)


def offsets(shares: Sequence[int]) -> list[int]:
    """Where each worker's share begins in the global batch (its examples are [offset, offset + share))."""
    starts, at = [], 0
    for share in shares:
        starts.append(at)
        at += share
    return starts


def loss_weight(share: int, global_batch: int, workers: int) -> float:
    """What a worker multiplies its mean loss by so that the collective's MEAN of the workers' gradients is the
    gradient over the global batch: share × workers / global batch (1 for an even split). A plain mean per
    worker, then a mean of means, would overweight a slow worker's few examples."""
    return share * workers / global_batch


def step_seconds(shares: Sequence[int], speeds: Sequence[float]) -> float:
    """A synchronous step's compute time: its slowest part."""
    return max(share / speed for share, speed in zip(shares, speeds))


@dataclass(frozen=True)
class Slow:
    """A worker that slows the run even at its smallest share: its floor's time against the others' step
    without it."""

    rank: int
    floor: int
    floor_seconds: float
    without_seconds: float

    def line(self, name: str, global_batch: int) -> str:
        return (f"{name} slows the run even at its smallest share: {self.floor} of {global_batch} examples a step "
                f"take it {self.floor_seconds:.3g} s, while the others would do the whole step without it in "
                f"{self.without_seconds:.3g} s")


def slows_the_run(global_batch: int, speeds: Sequence[float]) -> list[Slow]:
    """The workers (slowest first) whose smallest share takes longer than the others need for the whole global
    batch without them; empty where every machine adds to the run or a speed is unknown."""
    workers = len(speeds)
    if workers < 2 or any(not speed or not math.isfinite(speed) or speed <= 0 for speed in speeds):
        return []
    least = floor(global_batch, workers)
    slow = []
    for rank in sorted(range(workers), key=lambda rank: speeds[rank]):
        others = sum(speeds) - speeds[rank]
        floor_seconds, without = least / speeds[rank], global_batch / others
        if floor_seconds > without:
            slow.append(Slow(rank, least, floor_seconds, without))
    return slow

"""Each worker's share of a step's global batch, from its measured speed: pure, standard library only.

A synchronous step ends when its slowest worker does. With even shares a desktop and an old laptop step at
the laptop's pace, slower together than the desktop alone. A worker's part of a step takes its overhead (what
it does once a step whatever its share: the optimizer's update, its input, the framework's own work between
steps) plus its share over its compute speed (examples/s of its own forward and backward pass, without the time
it waits in the collective). Shares that make those parts equal let every worker reach the collective at the
same moment: machines add up. The global batch stays what the job says; only its split changes.

A share never drops below `floor` (an eighth of an even share, at least one example), which keeps a worker
useful rather than idle; a machine whose floor alone takes longer than the others need for the whole step
without it slows the run, and `slows_the_run` names it with the figures. Nor does it pass its worker's cap, where
one is known: the examples a step its GPU's memory holds (trainer/memory_cap.py), a fast card with little memory
being given no more than it can take; the others share the rest.
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


def split(global_batch: int, speeds: Sequence[float | None],
          overheads: Sequence[float | None] | None = None, caps: Sequence[int | None] | None = None) -> list[int]:
    """Shares of `global_batch` that bring every worker to the step's collective at once at these `speeds`
    (examples/s) and `overheads` (seconds a step besides the examples, None where not known yet; none at all: in
    proportion to the speeds), each at least `floor` and at most its worker's cap (None: none; below the floor the
    cap wins: memory is a hard limit), summing to `global_batch`. Any speed unknown (None, zero, not finite) gives
    the even split, within the caps: one guess is no basis. Caps that together hold less than `global_batch` have
    no split within them: each worker gets its cap and the rest in proportion to it (`within_caps` tells)."""
    workers = len(speeds)
    if workers == 0:
        return []
    least = floor(global_batch, workers)
    if global_batch < least * workers:
        return even(global_batch, workers)
    if any(speed is None or not math.isfinite(speed) or speed <= 0 for speed in speeds):
        speeds, overheads = [1.0] * workers, None
    highs = [max(1, cap) if cap is not None else math.inf for cap in caps or [None] * workers]
    if sum(highs) < global_batch:
        over = _rounded({rank: high * global_batch / sum(highs) for rank, high in enumerate(highs)}, global_batch)
        return [over[rank] for rank in range(workers)]
    lows = [min(least, high) for high in highs]
    fixed = _fixed(overheads, workers)
    low, high, free = _bounds_at(global_batch, speeds, fixed, lows, highs)
    held = {**{rank: lows[rank] for rank in low}, **{rank: int(highs[rank]) for rank in high}}
    shares = [held.get(rank, 0) for rank in range(workers)]
    left = global_batch - sum(held.values())
    if free:  # every free worker done at `finish`: speed × (finish − overhead) examples each, `left` in all
        finish = (left + sum(speeds[rank] * fixed[rank] for rank in free)) / sum(speeds[rank] for rank in free)
        ideal = {rank: min(highs[rank], max(lows[rank], speeds[rank] * (finish - fixed[rank]))) for rank in free}
        for rank, share in _rounded(ideal, left).items():
            shares[rank] = share
    return shares


def _bounds_at(global_batch: int, speeds: Sequence[float], fixed: Sequence[float], lows: Sequence[int],
               highs: Sequence[float]) -> tuple[set[int], set[int], list[int]]:
    """Water-filling with a floor and a cap: which workers are held at their low bound, which at their cap, and
    which are free when the step ends where the shares, speed × (end − overhead) each within its bounds, sum to
    `global_batch`. That sum grows with the end, bending where a worker reaches a bound: the end lies past the
    last such bend at which the sum is still at most `global_batch`, and before the next."""
    def total_at(end: float) -> float:
        return sum(min(high, max(low, speed * (end - overhead)))
                   for speed, overhead, low, high in zip(speeds, fixed, lows, highs))
    reaches = [(overhead + low / speed, overhead + high / speed)
               for speed, overhead, low, high in zip(speeds, fixed, lows, highs)]
    bends = sorted({end for pair in reaches for end in pair if math.isfinite(end)})
    # at the first bend every share is at its low bound, together at most the global batch (but for rounding)
    past = max((end for end in bends if total_at(end) <= global_batch), default=bends[0])
    low = {rank for rank, (up, _) in enumerate(reaches) if up > past}
    high = {rank for rank, (_, full) in enumerate(reaches) if full <= past}
    return low, high, [rank for rank in range(len(speeds)) if rank not in low | high]


def within_caps(new: Sequence[int], caps: Sequence[int | None] | None) -> bool:
    """Whether no share of `new` passes its worker's cap."""
    return all(cap is None or share <= cap for share, cap in zip(new, caps or []))


def capped(global_batch: int, speeds: Sequence[float | None], overheads: Sequence[float | None] | None,
           caps: Sequence[int | None] | None) -> list[int]:
    """The workers whose caps hold their shares down: by their paces alone they would get more."""
    free = split(global_batch, speeds, overheads)
    return [rank for rank, (share, cap) in enumerate(zip(free, caps or [])) if cap is not None and share > cap]


@dataclass(frozen=True)
class Move:
    """A re-split that moved the shares: from `before` to `after`, aiming at `aimed` (the split the speeds measured
    at `before` gave; `after` is short of it where the last move's speeds turned back, `between`)."""

    before: tuple[int, ...]
    after: tuple[int, ...]
    aimed: tuple[int, ...]
    between: bool = False


def resplit(current: Sequence[int], global_batch: int, speeds: Sequence[float | None],
            overheads: Sequence[float | None], caps: Sequence[int | None],
            last: Move | None = None) -> tuple[Move | None, list[int]]:
    """A re-split as every balancer decides it, from speeds measured at the `current` shares: (the move, or None
    to keep them; the workers whose caps hold their shares down). Shares move where that is worth it and within
    the caps; caps that cannot hold the global batch leave the shares in force, which fit (no measured cap is below
    the share it was measured at). `last` is the move that brought the shares here, if the last re-split made one:
    where these speeds aim back across it, the split goes `between` the two (`settle`)."""
    aimed = split(global_batch, speeds, overheads, caps)
    new, between = settle(current, aimed, last)
    moved = within_caps(new, caps) and worth_changing(current, new, speeds, overheads)
    move = Move(tuple(current), tuple(new), tuple(aimed), between) if moved else None
    return move, capped(global_batch, speeds, overheads, caps)


def settle(current: Sequence[int], aimed: Sequence[int], last: Move | None) -> tuple[list[int], bool]:
    """Where to move from `current`, where speeds measured at it give `aimed`: there, unless `last` brought the
    shares here and `aimed` points back across it. A machine whose speed depends on its share does that: a CPU
    quota or a GPU that throttles in bursts runs a small share at full speed within its allowance and a large
    one at the allowance's pace, so each split by the last one's speeds undoes it, and the shares swing every
    epoch. The balanced split then lies between the two measured points: along the last move, the gap between
    the split and its aim shrinks from `last`'s (positive, at its start) to this one's (negative, here), and the
    shares go back to where it crosses zero, as a secant would (a fraction of the last move, never past its
    start). Figures that point on, or no last move to check against, go the whole way: a machine that really
    slows is followed at once. Returns (the shares, whether they lie between)."""
    if last is None or list(last.after) != list(current):
        return list(aimed), False
    move = [after - before for after, before in zip(last.after, last.before)]
    then = _along(move, [aim - before for aim, before in zip(last.aimed, last.before)])
    now = _along(move, [aim - share for aim, share in zip(aimed, current)])
    if now >= 0 or then <= 0:
        return list(aimed), False
    back = now / (then - now)  # in (-1, 0): the fraction of the last move to go back
    ideal = {rank: share + back * step for rank, (share, step) in enumerate(zip(current, move))}
    rounded = _rounded(ideal, sum(current))
    return [rounded[rank] for rank in range(len(current))], True


def _along(move: Sequence[int], gap: Sequence[int]) -> int:
    """How far `gap` (an aim less the shares it was measured at) points along `move`."""
    return sum(step * part for step, part in zip(move, gap))


def _rounded(ideal: dict[int, float], total: int) -> dict[int, int]:
    """Whole numbers summing to `total`, the largest remainders rounded up (ties to the lower rank)."""
    whole = {rank: int(share) for rank, share in ideal.items()}
    short = total - sum(whole.values())
    for rank in sorted(ideal, key=lambda rank: (whole[rank] - ideal[rank], rank))[:short]:
        whole[rank] += 1
    return whole


def worth_changing(old: Sequence[int], new: Sequence[int], speeds: Sequence[float | None],
                   overheads: Sequence[float | None] | None = None) -> bool:
    """Whether moving from `old` to `new` shortens a step by more than CHANGE_FRACTION at these speeds and
    overheads: a wobble of measured speed (two alike machines measured a few per cent apart) does not reshuffle
    the data."""
    if list(old) == list(new) or any(not speed for speed in speeds):
        return False
    return step_seconds(old, speeds, overheads) > (1 + CHANGE_FRACTION) * step_seconds(new, speeds, overheads)


def moved_line(unit: str, new: Sequence[int], global_batch: int, speeds: Sequence[float | None],
               overheads: Sequence[float | None], between: bool = False) -> str:
    """'each replica's share of a step is now 450/62 of 512 examples, by their measured paces (402, 80
    examples/s of compute and 0.08, 0.31 s a step besides)' (? where a figure is not known), and where the move
    went `between` (`settle`), that it did and why."""
    rates = ", ".join(f"{speed:.0f}" if speed else "?" for speed in speeds)
    fixed = ", ".join(f"{overhead:.2g}" if overhead is not None else "?" for overhead in overheads)
    line = (f"each {unit}'s share of a step is now {'/'.join(map(str, new))} of {global_batch} examples, by their "
            f"measured paces ({rates} examples/s of compute and {fixed} s a step besides)")
    if between:
        line += ("; between the last two splits: the paces measured at each pointed back to the other (a machine "
                 "whose speed swings with its share, as under a CPU quota or a GPU's power limit)")
    return line


def step_parts(share: int, speed: float | None, overhead: float | None,
               step_seconds: float | None) -> dict[str, float]:
    """A worker's step in parts, for its epoch line (trainer/PROTOCOL.md): `compute_seconds` (its share at its
    speed), `overhead_seconds` (its update and input), and `wait_seconds` (the rest of the step's wall time: the
    others, and the all-reduce over the link); those it can tell. With them `compute_examples_per_sec`, the speed
    itself, which the job's next plan takes as the worker's (plan/last_run.py)."""
    parts = {}
    if speed:
        parts["compute_seconds"] = round(share / speed, 4)
    if overhead is not None:
        parts["overhead_seconds"] = round(overhead, 4)
    if step_seconds is not None and len(parts) == 2:
        parts["wait_seconds"] = round(max(0.0, step_seconds - sum(parts.values())), 4)
    if step_seconds is not None:
        parts["step_seconds"] = round(step_seconds, 4)
    if speed:
        parts["compute_examples_per_sec"] = round(speed, 1)
    return parts


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


def step_seconds(shares: Sequence[int], speeds: Sequence[float],
                 overheads: Sequence[float | None] | None = None) -> float:
    """A synchronous step's time up to its collective: its slowest part (overhead and compute)."""
    fixed = _fixed(overheads, len(shares))
    return max(overhead + share / speed for share, speed, overhead in zip(shares, speeds, fixed))


def _fixed(overheads: Sequence[float | None] | None, workers: int) -> list[float]:
    """Each worker's overhead, 0 where it is not known (none given: every one)."""
    return [overhead or 0.0 for overhead in overheads] if overheads is not None else [0.0] * workers


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

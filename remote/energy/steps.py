"""The one rule for the energy between two samples of a GPU: its energy counter's difference where both samples
carry it, else the trapezoid of its draw; samples further apart than MAX_GAP_S are a gap, never filled with a
guess. A run's energy (record/energy.py), serve's history and the budget alerts all step by it, so a run's
kWh agree wherever they are shown.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Hashable, Iterable, NamedTuple, Sequence


MAX_GAP_S = 10.0  # samples come every stats_interval (1 s): a few lost ones are bridged, a longer silence is not
JOULES_PER_KWH = 3.6e6
INTEGRATED = "integrated from power samples"
COUNTER = "measured by the GPUs' energy counters"
MIXED = "counters where the GPUs have them, else integrated from power samples"


@dataclass(frozen=True)
class Energy:
    """Joules over `seconds` of samples, what they cost, and `gap_seconds` that no sample covered."""

    joules: float = 0.0
    seconds: float = 0.0
    gap_seconds: float = 0.0
    cost: float = 0.0
    method: str = ""  # INTEGRATED, COUNTER or MIXED; "" for no energy at all

    @property
    def kwh(self) -> float:
        return self.joules / JOULES_PER_KWH

    def __add__(self, other: "Energy") -> "Energy":
        return Energy(self.joules + other.joules, max(self.seconds, other.seconds),
                      max(self.gap_seconds, other.gap_seconds), self.cost + other.cost,
                      _one_method({self.method, other.method}))


def _one_method(methods: Iterable[str]) -> str:
    """How a sum was obtained from how its parts were: their one way, MIXED, or "" for no energy at all."""
    found = set(methods) - {""}
    return found.pop() if len(found) == 1 else (MIXED if found else "")


def step_joules(span: float, watts: tuple[float | None, float | None],
                counters: tuple[float | None, float | None] = (None, None),
                max_gap: float = MAX_GAP_S) -> tuple[float, str] | None:
    """The joules a GPU used between two samples `span` seconds apart, and how they were obtained: its energy
    counter's difference when both samples carry it, else the trapezoid of its draw. None: a gap (too far
    apart, a reading missing, or a counter that went back because the driver reloaded)."""
    if not 0 < span <= max_gap:
        return None
    before, after = counters
    if before is not None and after is not None:
        return (after - before, COUNTER) if after >= before else None
    w0, w1 = watts
    if w0 is None or w1 is None:
        return None
    return (w0 + w1) / 2 * span, INTEGRATED


class Step(NamedTuple):
    """A GPU's energy between two of its samples: how much, how it was obtained, and the moment between them
    (where a tariff prices it)."""

    joules: float
    method: str
    middle: float


class EnergySteps:
    """Each GPU's energy since its previous sample, by step_joules, as samples come (serve's history, the budget
    alerts): a sample's readings are kept under the caller's key for the GPU's next one. A GPU's first sample,
    and one after forget(), has no step."""

    def __init__(self, max_gap: float = MAX_GAP_S) -> None:
        self.max_gap = max_gap
        self._last: dict[Hashable, tuple[float, float | None, float | None]] = {}

    def step(self, key: Hashable, at: float, power: object, counter: object) -> Step | None:
        """The energy since `key`'s previous sample (None: there is none, or a gap); `power` (W) and `counter`
        (J) as the stats say them (not a number: not read)."""
        reading = (at, _reading(power), _reading(counter))
        before, self._last[key] = self._last.get(key), reading
        if before is None:
            return None
        found = step_joules(at - before[0], (before[1], reading[1]), (before[2], reading[2]), self.max_gap)
        return Step(*found, (before[0] + at) / 2) if found else None

    def forget(self, node: object = None) -> None:
        """Start afresh: every GPU's readings, or those of `node` (the first part of each key)."""
        self._last = {key: reading for key, reading in self._last.items() if node is not None and key[0] != node}


def _reading(value: object) -> float | None:
    """A stats value as a float: not available (NA), not a number or not finite is None."""
    kind = type(value)
    return float(value) if (kind is int or kind is float) and value - value == 0 else None


def integrate(times: Sequence[float], watts: Sequence[float | None], counters: Sequence[float | None] = (),
              price_at: Callable[[float], float] | None = None, max_gap: float = MAX_GAP_S) -> Energy:
    """The energy of one GPU's samples (`times` ascending), each step by step_joules and priced at its midpoint;
    `counters` (the energy counter's readings, None where a sample has none) may be empty."""
    counters = counters or (None,) * len(times)
    joules = seconds = gaps = cost = 0.0
    methods = set()
    for i in range(1, len(times)):
        t0, t1 = times[i - 1], times[i]
        step = step_joules(t1 - t0, (watts[i - 1], watts[i]), (counters[i - 1], counters[i]), max_gap)
        if step is None:
            gaps += max(t1 - t0, 0.0)
            continue
        part, method = step
        joules, seconds = joules + part, seconds + (t1 - t0)
        methods.add(method)
        if price_at is not None:
            cost += part / JOULES_PER_KWH * price_at((t0 + t1) / 2)
    return Energy(joules, seconds, gaps, cost, _one_method(methods))

"""homegpu.remote.energy: the one step rule for a GPU's energy between two samples (its counter, else its draw; a
long gap is a gap), which a run's energy, serve's history and the budget alerts all use.
"""

from __future__ import annotations

from homegpu.remote.energy.steps import (
    COUNTER, INTEGRATED, JOULES_PER_KWH, MAX_GAP_S, MIXED, Energy, EnergySteps, Step, integrate, step_joules,
)

__all__ = [
    "COUNTER", "INTEGRATED", "JOULES_PER_KWH", "MAX_GAP_S", "MIXED", "Energy", "EnergySteps", "Step", "integrate",
    "step_joules",
]

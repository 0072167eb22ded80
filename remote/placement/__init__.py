"""homegpu.remote.placement: who places a run, behind one contract: which nodes it gets and when, held while it
runs and let go at its end, and the queue of runs the placement keeps (homegpu's own scheduler, or Slurm).

base.py says what every placement does; factory.py is the one place a placement is chosen, by `[cluster] scheduler`.
"""

from __future__ import annotations

from homegpu.remote.placement.base import Placement, PlacementError, RunPlacement
from homegpu.remote.placement.factory import make_placement

__all__ = ["Placement", "PlacementError", "RunPlacement", "make_placement"]

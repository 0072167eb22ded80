"""homegpu.remote.doctor: `homegpu doctor`: each node probed for what a job needs, the pure judgements
of what was found (GPUs, Docker, the network), and the Check rows with their fixes.
"""

from __future__ import annotations

from homegpu.remote.doctor.check import Check
from homegpu.remote.doctor.probe import diagnose

__all__ = [
    "Check", "diagnose",
]

"""homegpu.remote.doctor: `homegpu doctor`: each node probed for what a job needs, the pure judgements
of what was found (GPUs and their PCIe links under load, Docker, the network), and the Check rows with
their fixes.
"""

from __future__ import annotations

from homegpu.remote.doctor.check import Check
from homegpu.remote.doctor.judge import CHECK_NAMES
from homegpu.remote.doctor.probe import diagnose

__all__ = [
    "CHECK_NAMES", "Check", "diagnose",
]

"""Which placement a cluster's runs get: the one place a placement class is chosen, by `[cluster] scheduler`."""

from __future__ import annotations

from homegpu.remote.config import ClusterSpec
from homegpu.remote.placement.base import Placement
from homegpu.remote.placement.own import OwnPlacement
from homegpu.remote.placement.slurm import SlurmPlacement

PLACEMENTS = {  # `[cluster] scheduler` -> its placement; a new placement is one module and one line here
    "homegpu": OwnPlacement,
    "slurm": SlurmPlacement,
}


def make_placement(spec: ClusterSpec) -> Placement:
    """The placement `spec`'s scheduler names (config/slurm_keys.py's SCHEDULERS: the names accepted)."""
    return PLACEMENTS[spec.scheduler](spec)

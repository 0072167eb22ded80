"""What every `homegpu` subcommand shares: exit codes, where runs are recorded, the cluster to use.

The command modules import this (never main.py), so main.py can import them without a circle.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from homegpu.remote.config import ClusterSpec, embedded_default, find_config, load_cluster
from homegpu.tui.errors import UserError

__all__ = ["EXIT_USAGE", "EXPERIMENTS", "UserError", "load_spec"]

EXIT_USAGE = 2
EXPERIMENTS = Path("experiments")  # where runs are recorded unless --experiments says otherwise


def load_spec(args: argparse.Namespace) -> ClusterSpec:
    """The cluster for this invocation: --local, --config, ./cluster.toml, or the embedded default."""
    if getattr(args, "local", False):  # commands built without the global options have none
        return embedded_default()
    return load_cluster(find_config(args.config))


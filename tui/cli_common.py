"""What every `homegpu` subcommand shares: the user-error type, exit codes, the cluster to use.

The command modules import this (never cli.py), so cli.py can import them without a circle.
"""

from __future__ import annotations

import argparse
import shlex
from pathlib import Path

from homegpu.remote.config import (
    DEFAULT_CONFIG_NAME, EMBEDDED_DEFAULT, ClusterSpec, embedded_default, find_config, load_cluster,
)

EXIT_USAGE = 2
EXPERIMENTS = Path("experiments")  # where runs are recorded unless --experiments says otherwise
WEB_TOKEN_ENV = "HOMEGPU_WEB_TOKEN"  # a web view's token of your own; never passed on to its apps


class UserError(Exception):
    """A mistake the user can fix; printed as one line, exit status 2."""


def load_spec(args: argparse.Namespace) -> ClusterSpec:
    """The cluster for this invocation: --local, --config, ./cluster.toml, or the embedded default."""
    if getattr(args, "local", False):  # commands built without the global options have none
        return embedded_default()
    return load_cluster(find_config(args.config))


def serve_command(spec: ClusterSpec) -> str:
    """How to start the serve of `spec`'s cluster file from here: the command a "no serve" line names."""
    if spec.source == EMBEDDED_DEFAULT:
        return "homegpu --local serve"
    path = Path(spec.source).resolve()
    if path == Path(DEFAULT_CONFIG_NAME).resolve():
        return "homegpu serve"
    return f"homegpu --config {shlex.quote(str(path))} serve"

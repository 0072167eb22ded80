"""The error every runtime raises, apart from the runtimes (docker_link's errors are of its kind too)."""

from __future__ import annotations


class RuntimeError_(Exception):
    """A runtime could not do what was asked; the message names the node and the fix."""

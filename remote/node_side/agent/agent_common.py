"""What the stats agent's modules share: MiB, and how a failed reading is worded in a line's errors.

Standard library only, Python 3.8+: it runs on the nodes with the agent (see ``stats_agent.py``).
"""

MIB = 1024 * 1024


def describe(exc):
    """``"NVMLError_NotSupported: Not Supported"``: how a failure reads in the ``errors`` list."""
    return f"{type(exc).__name__}: {exc}"


"""Where homegpu keeps its own files on this machine: ~/.cache/homegpu (XDG_CACHE_HOME honoured: the
bandwidth matrices) and ~/.local/share/homegpu (XDG_DATA_HOME honoured: serve's history and queue).
One place knows, so each store finds its folder the same way and code sync can leave both out of a
code dir that happens to hold them.
"""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """homegpu's cache folder: what may be thrown away (the latest bandwidth matrix of each cluster)."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "homegpu"


def data_dir() -> Path:
    """homegpu's data folder: what is kept when a cache is cleared (serve's history and queue)."""
    return Path(os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share") / "homegpu"

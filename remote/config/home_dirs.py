"""Where homegpu keeps its own files on this machine: ~/.cache/homegpu (XDG_CACHE_HOME honoured: the
bandwidth matrices) and ~/.local/share/homegpu (XDG_DATA_HOME honoured: serve's history and queue).
One place knows, so each store finds its folder the same way and code sync can leave both out of a
code dir that happens to hold them.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path


def cache_dir() -> Path:
    """homegpu's cache folder: what may be thrown away (the latest bandwidth matrix of each cluster)."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "homegpu"


def data_dir() -> Path:
    """homegpu's data folder: what is kept when a cache is cleared (serve's history and queue)."""
    return Path(os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share") / "homegpu"


def cluster_data_path(source: str, name: str, kind: str, suffix: str) -> Path:
    """data_dir()/KIND-NAME-HASH.SUFFIX: a store of one cluster, told apart from others by the hash of its
    file's absolute path (`--config cluster.toml` in two folders is two clusters). `source` is the
    ClusterSpec's (the embedded default is kept as it is)."""
    if not source.startswith("<"):  # a file, not the embedded default
        source = str(Path(source).resolve())
    digest = hashlib.sha256(source.encode()).hexdigest()[:8]
    safe = "".join(ch if ch.isalnum() or ch in "-_" else "_" for ch in name)
    return data_dir() / f"{kind}-{safe}-{digest}.{suffix}"

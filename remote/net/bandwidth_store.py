"""The latest bandwidth matrix of each cluster, kept between runs: `homegpu bandwidth` and the TUI
save it, and the TUI opens with it and its age instead of an empty panel."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from homegpu.remote.config import ClusterSpec
from homegpu.remote.net.bandwidth import BandwidthMatrix, LinkResult


def store_path(spec: ClusterSpec) -> Path:
    """~/.cache/homegpu/bandwidth-NAME-HASH.json: one file per cluster file (the hash tells apart two
    clusters with the same name)."""
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    digest = hashlib.sha256(str(spec.source).encode()).hexdigest()[:8]
    safe = "".join(ch if ch.isalnum() or ch in "-_" else "_" for ch in spec.name)
    return cache / "homegpu" / f"bandwidth-{safe}-{digest}.json"


def links_json(matrix: BandwidthMatrix) -> list[dict]:
    return [{"src": r.src, "dst": r.dst, "gbits": r.gbits, "error": r.error} for r in matrix.results]


def save(spec: ClusterSpec, matrix: BandwidthMatrix) -> Path | None:
    """Write the matrix for `spec`; None (and nothing lost but the cache) when it cannot be written."""
    path = store_path(spec)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"at": matrix.at, "links": links_json(matrix)}))
    except OSError:
        return None
    return path


def load(spec: ClusterSpec) -> BandwidthMatrix | None:
    """The saved matrix, keeping only links between nodes the cluster still has; None when there is
    none or it cannot be read (a cache: never an error)."""
    names = {node.name for node in spec.nodes}
    try:
        data = json.loads(store_path(spec).read_text())
        links = tuple(LinkResult(link["src"], link["dst"], link["gbits"], link["error"], data["at"])
                      for link in data["links"] if link["src"] in names and link["dst"] in names)
        return BandwidthMatrix(links, float(data["at"])) if links else None
    except (OSError, ValueError, KeyError, TypeError):
        return None

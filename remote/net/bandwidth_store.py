"""The latest bandwidth matrix of each cluster, kept between runs: `homegpu bandwidth` and the TUI
save it, and the TUI opens with it and its age instead of an empty panel. A run's run.json keeps
the same format ({"at", "links": [{"src", "dst", "gbits", "error"}]}), read back by `from_json`.
"""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path
from typing import Collection

from homegpu.remote.config import EMBEDDED_DEFAULT, ClusterSpec, cache_dir
from homegpu.remote.events import BandwidthMatrix, LinkResult


def store_path(spec: ClusterSpec) -> Path:
    """~/.cache/homegpu/bandwidth-NAME-HASH.json: one file per cluster file, told apart by the hash
    of its absolute path (`--config cluster.toml` in two folders is two clusters)."""
    source = spec.source if spec.source == EMBEDDED_DEFAULT else str(Path(spec.source).resolve())
    digest = hashlib.sha256(source.encode()).hexdigest()[:8]
    safe = "".join(ch if ch.isalnum() or ch in "-_" else "_" for ch in spec.name)
    return cache_dir() / f"bandwidth-{safe}-{digest}.json"


def links_json(matrix: BandwidthMatrix) -> list[dict]:
    return [{"src": r.src, "dst": r.dst, "gbits": r.gbits, "error": r.error} for r in matrix.results]


def from_json(data: object, names: Collection[str] | None = None) -> BandwidthMatrix | None:
    """The stored format back into a BandwidthMatrix, keeping only links between `names` (None: all);
    None when no link is left.

    Raises:
        ValueError: the data is not in that format; the message says what is wrong.
    """
    if not isinstance(data, dict) or not isinstance(data.get("links"), list):
        raise ValueError("not an object with a list of links")
    at = data.get("at")
    if not _number(at):
        raise ValueError(f"'at' is {at!r}, not a time")
    links = []
    for link in data["links"]:
        if not (isinstance(link, dict) and isinstance(link.get("src"), str) and isinstance(link.get("dst"), str)):
            raise ValueError(f"a link is {link!r}, not {{src, dst, gbits, error}}")
        gbits, error = link.get("gbits"), link.get("error") or ""
        if not (gbits is None or (_number(gbits) and gbits >= 0)) or not isinstance(error, str):
            raise ValueError(f"the link {link['src']} → {link['dst']} has gbits {gbits!r}, error {error!r}")
        if names is None or (link["src"] in names and link["dst"] in names):
            links.append(LinkResult(link["src"], link["dst"], None if gbits is None else float(gbits), error, at))
    return BandwidthMatrix(tuple(links), float(at)) if links else None


def _number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def save(spec: ClusterSpec, matrix: BandwidthMatrix) -> Path | None:
    """Write the matrix for `spec`; None (and nothing lost but the cache) when it cannot be written."""
    path = store_path(spec)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"at": matrix.at, "links": links_json(matrix)}))
    except OSError:
        return None
    return path


_SAID: set[tuple[Path, float]] = set()  # damaged files already named in this process


def read(spec: ClusterSpec) -> tuple[BandwidthMatrix | None, str]:
    """The saved matrix, keeping only links between nodes the cluster still has (None when there is
    none), and "" or, the first time this process meets it damaged, one line naming the file and
    what to do. A cache: a damaged one is never an error, only ignored (and the next test rewrites it).
    """
    path = store_path(spec)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        if isinstance(exc, FileNotFoundError):
            return None, ""
        return None, _say_once(path, f"cannot be read ({exc})")
    try:
        return from_json(json.loads(text), {node.name for node in spec.nodes}), ""
    except ValueError as exc:
        return None, _say_once(path, f"is damaged ({exc})")


def _say_once(path: Path, problem: str) -> str:
    try:
        key = (path, path.stat().st_mtime)
    except OSError:
        key = (path, 0.0)
    if key in _SAID:
        return ""
    _SAID.add(key)
    return (f"the saved bandwidth matrix {path} {problem}; it is ignored: press b in the TUI or run "
            "`homegpu bandwidth` to measure again and rewrite it")

"""What code sync leaves out of a job's code dir, beyond the built-in skips (codesync.SKIP_DIRS).

A script beside cluster.toml makes the whole project folder the code dir, and homegpu's own output
may be in it: the run's experiments dir (every earlier run's logs, timelines and models, and this
run's timeline, written while it would be shipped), and homegpu's cache and data folders where
XDG_CACHE_HOME or XDG_DATA_HOME point inside. Those are never shipped. Then the user's word: the
`.homegpuignore` at the code dir's top if there is one (a file for homegpu alone, as SkyPilot reads
`.skyignore`), else its `.gitignore` files, each applying to its own folder's subtree, all with git's
rules (ignore_rules). What is left out here is also left alone on the nodes, as rsync leaves what it
excludes.
"""

from __future__ import annotations

from pathlib import Path

from homegpu.remote.config import cache_dir, data_dir
from homegpu.remote.jobs.ignore_rules import IgnoreTree

IGNORE_FILE = ".homegpuignore"  # at the code dir's top: read instead of every .gitignore
GIT_IGNORE_FILE = ".gitignore"  # in any folder of the code dir


class CodeFilter:
    """Called as `leaves_out(rel, is_dir)` for a path relative to the code dir ('/' between names):
    True for what the sync neither ships nor touches on a node. A path under a folder left out is
    left out too. `experiments`: the run's experiments dir, wherever it is."""

    def __init__(self, root: Path, experiments: Path | None = None) -> None:
        self.root = root
        self.own = tuple(own_folders(root, experiments))
        self.homegpuignore = (root / IGNORE_FILE).is_file()
        self._rules = IgnoreTree(self._read)

    def __call__(self, rel: str, is_dir: bool) -> bool:
        return any(rel == own or rel.startswith(own + "/") for own in self.own) or self._rules.ignored(rel, is_dir)

    def _read(self, folder: str) -> bytes | None:
        """The ignore file of `folder` ("": the top) under the code dir; None where there is none or it
        cannot be read (a folder that is a file here, when asked about a node's path)."""
        if self.homegpuignore and folder:
            return None
        try:
            return (self.root / folder / (IGNORE_FILE if self.homegpuignore else GIT_IGNORE_FILE)).read_bytes()
        except OSError:
            return None


def own_folders(root: Path, experiments: Path | None) -> list[str]:
    """The folders of homegpu's own files that lie inside `root` (strictly), relative to it: the
    experiments dir (relative to the working dir, as the run writes it), and homegpu's cache and
    data folders."""
    inside = []
    top = root.resolve()
    for folder in (*([experiments] if experiments else []), cache_dir(), data_dir()):
        try:
            rel = folder.expanduser().resolve().relative_to(top)
        except ValueError:
            continue
        if rel.parts:
            inside.append(rel.as_posix())
    return inside

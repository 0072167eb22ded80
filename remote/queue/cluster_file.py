"""The cluster file serve runs from, watched: a file edited while serve runs is read again, so that no job
runs from a definition the file no longer has, and `submit` knows the jobs the file has now.

What changed decides what serve does, in one line each time:
- only its jobs (added, removed, changed): serve takes the new jobs at once (a waiting entry of a job that
  is gone is cancelled with that reason; one whose settings no longer apply likewise);
- more than its jobs (nodes, SSH, [alerts], the cluster's settings): those need new sessions, so serve goes
  on with what it has, starts nothing more from the queue and refuses submits, saying to restart it;
- it no longer validates: serve goes on with what it has and refuses submits, with the file's own error,
  until the file is fixed.
"""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path
from typing import Callable

from homegpu.remote.config import EMBEDDED_DEFAULT, ClusterSpec, ConfigError, load_cluster
from homegpu.remote.store import Say, say_on_stderr


def _stamp(path: Path) -> tuple[int, int, int] | None:
    """What tells an edit: the file's identity, size and modification time (None when it is gone)."""
    try:
        info = os.stat(path)
    except OSError:
        return None
    return info.st_ino, info.st_size, info.st_mtime_ns


class ClusterFile:
    """`spec`: the cluster as serve uses it now; `refusal`: why nothing more starts or is submitted ("" when
    the file and serve agree). `check()` looks at the file again (cheap: one stat unless it changed)."""

    def __init__(self, spec: ClusterSpec, say: Say = say_on_stderr,
                 load: Callable[[Path], ClusterSpec] = load_cluster) -> None:
        self.spec, self.say, self.load = spec, say, load
        self.refusal = ""
        self.path = None if spec.source == EMBEDDED_DEFAULT else Path(spec.source)
        self._seen = _stamp(self.path) if self.path else None

    def check(self) -> ClusterSpec:
        """The spec to use now, after reading the file again if it changed since the last look."""
        if self.path is None or (stamp := _stamp(self.path)) == self._seen:
            return self.spec
        self._seen = stamp
        try:
            edited = self.load(self.path)
        except ConfigError as exc:
            self._refuse(f"{self.path} changed and no longer validates ({exc}); serve goes on with the file as "
                         "it read it, and takes no submit until it is fixed")
            return self.spec
        if _beyond_jobs(self.spec, edited):
            self._refuse(f"{self.path} changed beyond its jobs (nodes, SSH, [alerts] or the cluster's settings): "
                         "restart serve to use it; until then nothing more starts from the queue and submits "
                         "are refused")
            return self.spec
        self.say(f"read {self.path} again: {_jobs_change(self.spec, edited)}")
        self.spec, self.refusal = edited, ""
        return self.spec

    def _refuse(self, line: str) -> None:
        if line != self.refusal:
            self.refusal = line
            self.say(line)


def _beyond_jobs(old: ClusterSpec, new: ClusterSpec) -> bool:
    return replace(old, jobs={}) != replace(new, jobs={})


def _jobs_change(old: ClusterSpec, new: ClusterSpec) -> str:
    """"jobs gone: a; new: b; changed: c" (or "its jobs are as they were")."""
    parts = [(label, sorted(names)) for label, names in (
        ("gone", old.jobs.keys() - new.jobs.keys()), ("new", new.jobs.keys() - old.jobs.keys()),
        ("changed", {name for name in old.jobs.keys() & new.jobs.keys() if old.jobs[name] != new.jobs[name]}))]
    said = "; ".join(f"{label}: {', '.join(names)}" for label, names in parts if names)
    return f"jobs {said}" if said else "its jobs are as they were"

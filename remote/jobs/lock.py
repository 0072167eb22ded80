"""One run per job: a lock on the chief's node that every controller sees.

`homegpu run JOB` takes the lock before it launches; a second controller finds it held and attaches
to that run instead of starting another. The lock is a file under the node's work dir,
`WORK_DIR/locks/JOB.lock`, holding the run id, the controller's host and pid and the node's time
of its last heartbeat. All the judging and writing happens on the node in one short stdlib script
(node_side/scripts/job_lock.py) under a flock(), so two controllers racing for it cannot both win.

A lock left by a dead controller is taken over (atomically: the new owner is renamed over the old):
- its controller ran on the node's own machine and that pid is gone: at once;
- it ran elsewhere: once no heartbeat came for `stale_after` seconds. The watch loop calls
  refresh() every HEARTBEAT_SECONDS; a refresh that finds the lock no longer ours returns False.

Usage::

    result = await acquire(node, work_dir, "train", run_id)
    if not result.acquired:
        attach_to(result.holder.run_id)    # someone else's run of this job is live
    ...
    await refresh(node, work_dir, "train", run_id)    # from the watch loop, every HEARTBEAT_SECONDS
    ...
    await release(node, work_dir, "train", run_id)    # when the run has ended
"""

from __future__ import annotations

import json
import os
import socket
from dataclasses import dataclass

from homegpu.remote.node_side import script
from homegpu.remote.nodes import NodeSession

STALE_AFTER_SECONDS = 120.0
HEARTBEAT_SECONDS = 20.0
COMMAND_TIMEOUT = 60.0

_NODE_SCRIPT = script("job_lock")


class RunLockError(Exception):
    """The lock could not be read or written on the node; the message names node and fix."""


@dataclass(frozen=True)
class ProcessIdentity:
    """Who holds a lock: a controller process (this one by default, see `this()`)."""

    host: str
    pid: int
    machine: str = ""  # /etc/machine-id: tells two machines that share a host name apart
    start_time: int | None = None  # the pid's kernel start time: tells a reused pid from ours

    @classmethod
    def this(cls) -> ProcessIdentity:
        return cls(socket.gethostname(), os.getpid(), _machine_id(), _start_time(os.getpid()))


@dataclass(frozen=True)
class LockHolder:
    """A lock's owner as the node sees it; `age`: seconds since its last heartbeat (None: unknown)."""

    run_id: str
    host: str
    pid: int | None
    age: float | None

    def describe(self) -> str:
        age = f", last heard {self.age:.0f} s ago" if self.age is not None else ""
        return f"run {self.run_id or '?'} (controller pid {self.pid} on {self.host or '?'}{age})"


@dataclass(frozen=True)
class LockResult:
    """`acquired`, or the `holder` that has it; `took_over`: the stale holder it was taken from."""

    acquired: bool
    path: str
    holder: LockHolder | None = None
    took_over: LockHolder | None = None


def lock_dir(work_dir: str) -> str:
    return f"{work_dir.rstrip('/')}/locks"


async def acquire(node: NodeSession, work_dir: str, job: str, run_id: str, *,
                  stale_after: float = STALE_AFTER_SECONDS, owner: ProcessIdentity | None = None) -> LockResult:
    """Take the job's lock on `node` for `run_id`, or say who holds it.

    Taking it again for the same run and controller succeeds (and renews the heartbeat).

    Raises:
        RunLockError: the node could not run the lock script.
        NodeOffline, TransportError: the node is gone.
    """
    reply = await _call(node, "acquire", work_dir, job, run_id, owner, stale_after=stale_after)
    return LockResult(bool(reply.get("acquired")), _path(work_dir, job), _holder(reply.get("holder")),
                      _holder(reply.get("took_over")))


async def refresh(node: NodeSession, work_dir: str, job: str, run_id: str, *,
                  owner: ProcessIdentity | None = None) -> bool:
    """Renew the heartbeat; False when the lock is no longer ours (taken over, or removed)."""
    return bool((await _call(node, "refresh", work_dir, job, run_id, owner)).get("held"))


async def release(node: NodeSession, work_dir: str, job: str, run_id: str, *,
                  owner: ProcessIdentity | None = None) -> bool:
    """Remove the lock if it is ours (True); someone else's is left alone (False)."""
    return bool((await _call(node, "release", work_dir, job, run_id, owner)).get("held"))


async def holder(node: NodeSession, work_dir: str, job: str) -> LockHolder | None:
    """Who holds the job's lock now (None: no one), without changing it."""
    return _holder((await _call(node, "peek", work_dir, job, "", None)).get("holder"))


async def _call(node: NodeSession, command: str, work_dir: str, job: str, run_id: str,
                owner: ProcessIdentity | None, **extra: object) -> dict:
    _check_name(job)
    me = owner or ProcessIdentity.this()
    args = {"dir": lock_dir(work_dir), "job": job, **extra,
            "owner": {"run_id": run_id, "host": me.host, "machine": me.machine, "pid": me.pid,
                      "start_time": me.start_time}}
    python = node.spec.python
    result = await node.run([python, "-I", "-S", "-c", _NODE_SCRIPT, command, json.dumps(args)],
                            timeout=COMMAND_TIMEOUT)
    try:
        return json.loads(result.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        detail = (result.stderr.strip().splitlines() or ["no output"])[-1]
        raise RunLockError(f"{node.name}: the run lock under {lock_dir(work_dir)} failed ({detail}); "
                           f"check that {python} runs there and the directory is writable") from None


def _holder(data: dict | None) -> LockHolder | None:
    if data is None:
        return None
    pid = data.get("pid")
    age = data.get("age")
    return LockHolder(str(data.get("run_id") or ""), str(data.get("host") or ""),
                      pid if isinstance(pid, int) else None, float(age) if isinstance(age, (int, float)) else None)


def _path(work_dir: str, job: str) -> str:
    return f"{lock_dir(work_dir)}/{job}.lock"


def _check_name(job: str) -> None:
    if not job or job.startswith(".") or "/" in job or "\0" in job:
        raise ValueError(f"{job!r} cannot name a lock file")


def _machine_id() -> str:
    try:
        with open("/etc/machine-id", encoding="ascii") as handle:
            return handle.read().strip()
    except OSError:
        return ""


def _start_time(pid: int) -> int | None:
    """The kernel's start time of `pid` (as the node script compares it); None off Linux."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
            return int(stat.read().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None

"""The stats agent's nvidia-smi source, for nodes where NVML cannot be loaded from Python.

Standard library only, Python 3.8+: it runs on the nodes with the agent (see ``stats_agent.py``).
``SmiReader`` reads GPU rows from one long-lived ``nvidia-smi --loop-ms`` child (``SmiLoop``),
standing in one-shot queries where the loop has nothing fresh, and compute processes from one-shot
queries. Every nvidia-smi the agent starts goes through ``children.py``'s ``spawn``, so that its
``kill_children`` ends them all when the agent exits; on Linux the kernel also kills the long-lived one
if the agent itself is killed. What is asked and how the answers read is ``smi_parse.py``'s.
"""

from __future__ import annotations

import collections
import contextlib
import os
import select
import subprocess
import threading
import time

if __package__:  # how the node_side modules import each other: see stats_agent.py's docstring
    from . import gpu_health, smi_parse
    from .agent_common import describe
    from .children import forget, run_command, spawn, with_death_signal
else:
    import gpu_health
    import smi_parse
    from agent_common import describe
    from children import forget, run_command, spawn, with_death_signal

LOOP_TRIES = 2  # loop children that end without looping before the agent stays with one-shot
RESTART_MIN_S = 1.0  # pause before restarting an ended loop child, doubling up to the max
RESTART_MAX_S = 30.0
STALE_GRACE_S = 1.0  # a loop iteration older than 2 intervals + this is not used
SILENT_MIN_S = 30.0  # a loop child silent for max(this, 10 intervals) is killed and restarted
MAX_PENDING_ERRORS = 20  # loop errors kept for the next line; older ones are dropped
QUIET_MAX_S = 0.2  # silence that ends a loop child's first iteration (less for loops under 0.4 s)
FIRST_LOOP_WAIT_S = 0.35  # how long the first line waits for nvidia-smi's loop before a one-shot
HEALTH_RETRY_READS = 12  # health queries nvidia-smi refused: asked again after this many health periods



# --- the loop child ------------------------------------------------------------------------------

class SmiLoop:
    """One long-lived ``nvidia-smi --loop-ms`` child, read line by line on a thread of its own.

    Starting nvidia-smi costs far more CPU than one of its queries (it loads and initialises NVML
    each time), so the agent keeps one running and takes the newest complete iteration from it at
    each interval. A child that ends (killed, the driver reloaded) is started again after a pause
    that doubles up to ``RESTART_MAX_S`` and goes back to ``RESTART_MIN_S`` once a child loops.
    The thread sets ``latest``, ``runs``, ``looped``, ``proc`` and ``last_output`` and appends to
    ``errors``; the agent's main thread only reads them (and drains ``errors``, a deque, which is
    safe across threads).
    """

    def __init__(self, path, loop_ms, expected=None, fields=smi_parse.GPU_QUERY, convert=None,
                 name="nvidia-smi loop"):
        query = smi_parse.query_arg("--query-gpu=", fields)
        self.argv = [path, query, smi_parse.SMI_FORMAT, f"--loop-ms={loop_ms}"]
        self.name = name  # how its errors begin
        self.quiet = min(QUIET_MAX_S, loop_ms / 2000.0)
        self.iterations = smi_parse.LoopIterations(expected, fields, convert)
        self.latest = None  # (time.monotonic(), [gpu dicts]) of the newest complete iteration
        self.errors = collections.deque(maxlen=MAX_PENDING_ERRORS)
        self.runs = 0  # children that have ended
        self.looped = False  # some child printed two iterations or more: loop mode works here
        self.proc = None
        self.last_output = time.monotonic()
        self.settled = threading.Event()  # set at the first complete iteration or the first child's end
        self._stop = threading.Event()
        threading.Thread(target=self._run, name=name.replace(" ", "-"), daemon=True).start()

    def fresh(self, max_age):
        """The newest complete iteration, if it is at most ``max_age`` seconds old; else None.
        It is the loop's own: a caller that changes it copies it first."""
        latest = self.latest
        if latest is None or time.monotonic() - latest[0] > max_age:
            return None
        return latest[1]

    def drain_errors(self):
        """What went wrong in the child since the last call, oldest first."""
        drained = []
        while self.errors:
            drained.append(self.errors.popleft())
        return drained

    def kill_if_silent(self, limit):
        """Kill a child that printed nothing for ``limit`` s (hung in the driver); it is restarted."""
        proc = self.proc
        if proc is not None and proc.returncode is None and time.monotonic() - self.last_output > limit:
            self.errors.append(f"{self.name}: silent for {limit:g} s, restarting it")
            self.last_output = time.monotonic()  # one kill per silence, not one per interval
            with contextlib.suppress(OSError):
                proc.kill()

    def stop(self):
        """End the thread and the child; either may be starting the child just now, so both look."""
        self._stop.set()
        proc = self.proc
        if proc is not None:
            with contextlib.suppress(OSError):
                proc.kill()

    def _run(self):
        pause = RESTART_MIN_S
        while not self._stop.is_set():
            code, completed = self._run_child()
            self.runs += 1
            self.settled.set()
            if completed >= 2:
                pause = RESTART_MIN_S
            if self._stop.is_set():
                break
            self.errors.append(f"{self.name}: exit {code} after {completed} samples, restarting in {pause:g} s")
            if self._stop.wait(pause):
                break
            pause = min(2 * pause, RESTART_MAX_S)

    def _run_child(self):
        """Start one child and read it to its end; return (exit code, iterations it completed)."""
        try:
            proc = spawn(with_death_signal(self.argv), stdin=subprocess.DEVNULL,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        except (OSError, subprocess.SubprocessError) as exc:
            return describe(exc), 0
        self.proc, self.last_output = proc, time.monotonic()
        if self._stop.is_set():  # stop() ran while it was starting and could not see it
            proc.kill()
        completed = 0
        try:
            for line in self._lines(proc.stdout.fileno()):
                if line is None:
                    gpus = self.iterations.close()
                else:
                    self.last_output = time.monotonic()
                    gpus = self.iterations.feed(line, self.errors)
                if gpus is not None:
                    self.latest = (time.monotonic(), gpus)
                    self.settled.set()
                    completed += 1
                    self.looped = self.looped or completed >= 2
        finally:
            proc.stdout.close()
            code = proc.wait()
            forget(proc)
        return code, completed

    def _lines(self, fd):
        """The child's output lines, read straight from its pipe so that silence can be seen:
        None stands for ``quiet`` seconds without output while a first iteration is pending."""
        pending = b""
        while True:
            if self.iterations.counting() and not select.select([fd], [], [], self.quiet)[0]:
                yield None
                continue
            chunk = os.read(fd, 65536)
            if not chunk:
                if pending:
                    yield pending.decode("utf-8", "replace")
                return
            *lines, pending = (pending + chunk).split(b"\n")
            for line in lines:
                yield line.decode("utf-8", "replace") + "\n"


# --- the reader ----------------------------------------------------------------------------------

class SmiReader:
    """GPU stats from the ``nvidia-smi`` CLI, for nodes where NVML cannot be loaded from Python.

    With an ``interval`` (a streaming agent) GPU rows come from one ``SmiLoop`` child, started with
    the reader; the first read waits for its first iteration (or its end) up to ``FIRST_LOOP_WAIT_S``
    after the start, so the first line needs no one-shot query. Whenever the loop
    has no iteration younger than two intervals (starting up, restarting, hung) a one-shot query
    stands in, so a line never lacks GPUs that nvidia-smi can report; when that query finds no GPU
    before the loop ever had an iteration, the loop is dropped until one shows GPUs again. If the
    loop child keeps ending without ever looping (an nvidia-smi without ``--loop-ms``) the reader
    stays with one-shot queries. Without an ``interval`` (``--once``) every read is one-shot.
    Compute processes change slowly and cost a fork each, so they are asked for on every
    ``apps_every``-th read only; health (``gpu_health.py``) by a query of its own, new every
    ``health_every``-th read (``SmiHealth``: a second loop child at that period), kept between.
    """

    source = "nvidia-smi"

    def __init__(self, path, interval=None, apps_every=1, owners=None, health_every=1, light_first=False):
        self.path = path
        self.owners = owners
        self.loop_ms = max(1, int(round(interval * 1000))) if interval else None
        self.health = SmiHealth(path, self._run, health_every, self.loop_ms, light_first)
        self.max_age = 2 * interval + STALE_GRACE_S if interval else 0.0
        self.silent_limit = max(SILENT_MIN_S, 10 * interval) if interval else 0.0
        self.apps_every = max(1, apps_every)
        self.loop = None
        self.loop_failed = False
        self._apps = None
        self._reads_since_apps = 0
        code, out, _ = self._run("--version")
        self.cuda = smi_parse.parse_nvidia_smi_version(out) if code == 0 else None
        self.first_deadline = time.monotonic() + FIRST_LOOP_WAIT_S
        if self.loop_ms:  # started now, its first iteration is in by the first read: no one-shot then
            self.loop = SmiLoop(path, self.loop_ms)

    def _run(self, *args):
        try:
            return run_command([self.path] + list(args))
        except (OSError, subprocess.SubprocessError) as exc:
            return None, "", describe(exc)

    def _query(self, query, fields, errors):
        code, out, err = self._run(smi_parse.query_arg(query, fields), smi_parse.SMI_FORMAT)
        if code != 0:
            said = (out.strip() or err.strip()).splitlines()[:1]
            errors.append(f"nvidia-smi {query.strip('-=')}: exit {code}: {''.join(said)}")
            return None
        return out

    def read(self, errors):
        """Return (gpus, driver, cuda) for one sample."""
        gpus = self._gpus(errors)
        apps = self._processes(errors) if gpus else {}
        health = self.health.read(errors) if gpus else {}
        drivers = [gpu.pop("driver") for gpu in gpus]
        for gpu in gpus:
            gpu["processes"] = apps.get(gpu["uuid"], [])
            gpu.update(health.get(gpu["uuid"]) or gpu_health.no_health())
        return gpus, next((d for d in drivers if d), None), self.cuda

    def _gpus(self, errors):
        """The loop's newest iteration when it is fresh; otherwise a one-shot query, now."""
        if self.loop is not None and self.loop.latest is None:
            self.loop.settled.wait(max(0.0, self.first_deadline - time.monotonic()))
        gpus = self.loop.fresh(self.max_age) if self.loop is not None else None
        gpus = [dict(gpu) for gpu in gpus] if gpus is not None else None  # the loop's are kept as they are
        if gpus is None:
            out = self._query("--query-gpu=", smi_parse.GPU_QUERY, errors)
            gpus = smi_parse.parse_nvidia_smi_gpus(out or "", errors)
            if not gpus and self.loop is not None and self.loop.latest is None:
                self.loop.stop()  # nothing to loop over (no devices, no driver): the one-shot said why
                self.loop = None
            elif gpus and self.loop_ms and self.loop is None and not self.loop_failed:
                self.loop = SmiLoop(self.path, self.loop_ms, expected=len(gpus))
        if self.loop is not None:
            self._tend_loop(errors)
        return gpus

    def _tend_loop(self, errors):
        """Pass on the loop's errors, unstick a silent child, give up on a loop that never looped."""
        errors.extend(self.loop.drain_errors())
        self.loop.kill_if_silent(self.silent_limit)
        if self.loop.runs >= LOOP_TRIES and not self.loop.looped:
            self.loop.stop()
            self.loop, self.loop_failed = None, True
            errors.append("nvidia-smi: --loop-ms does not work here; querying once per interval")

    def _processes(self, errors):
        """Compute processes by GPU uuid, queried on every ``apps_every``-th call, else the last."""
        if self._apps is None or self._reads_since_apps >= self.apps_every:
            out = self._query("--query-compute-apps=", smi_parse.APP_QUERY, errors)
            self._apps = smi_parse.parse_nvidia_smi_apps(out or "", errors)
            if self.owners is not None:  # once per new pid, on this slower cadence only
                self.owners.annotate(self._apps.values())
            self._reads_since_apps = 0
        self._reads_since_apps += 1
        return self._apps


class SmiHealth:
    """Each GPU's health (``gpu_health.py``) from nvidia-smi's health query, new every ``every``-th read.

    The query is run apart from the GPU rows' so that those stay as they are (and as recorded) on
    every driver. Its first read asks once, trying the older spelling where nvidia-smi refuses the
    newer. A streaming agent (``loop_ms``: the GPU rows' period) then keeps a loop child of its own
    on the spelling that worked, at the slower period: a one-shot nvidia-smi loads NVML each time,
    far more CPU than a loop iteration. While that loop has nothing fresh, one-shot queries stand in
    at the same cadence. Where both spellings are refused the figures are null, said by nothing
    else, and the query waits ``HEALTH_RETRY_READS`` periods before it is tried again. With ``light_first`` the first
    read asks nothing (its health keys are null): the first line, which a node's first screen waits for, waits for
    no health query, and the next line has them.
    """

    def __init__(self, path, run, every=1, loop_ms=None, light_first=False):
        self.path = path
        self.run = run  # SmiReader._run: (exit code, stdout, stderr) of one nvidia-smi
        self.every = max(1, every)
        self.loop_ms = loop_ms * self.every if loop_ms else None
        self.max_age = 2 * self.loop_ms / 1000.0 + STALE_GRACE_S if loop_ms else 0.0
        self.loop = None
        self.loop_failed = False
        self.query = 0  # index in smi_parse.HEALTH_QUERIES of the spelling that last worked
        self.reads_left = 1 if light_first else 0  # reads until the next one-shot query
        self.latest = {}

    def read(self, errors):
        """Health keys by GPU uuid: the loop's newest, else from a one-shot query when one is due,
        else the last ones."""
        fresh = self._from_loop(errors)
        if fresh is not None:
            self.latest, self.reads_left = fresh, self.every
            return fresh
        if self.reads_left <= 0:
            self.latest = self._ask()
            self.reads_left = self.every * (1 if self.latest else HEALTH_RETRY_READS)
            if self.latest:
                self._start_loop()
        self.reads_left -= 1
        return self.latest

    def _ask(self):
        queries = smi_parse.HEALTH_QUERIES
        for index in [self.query] + [i for i in range(len(queries)) if i != self.query]:
            code, out, _ = self.run(smi_parse.query_arg("--query-gpu=", queries[index]), smi_parse.SMI_FORMAT)
            if code == 0:
                self.query = index
                return smi_parse.parse_nvidia_smi_health(out, queries[index], None, gpu_health.card_max_width)
        return {}

    def _start_loop(self):
        if self.loop_ms is None or self.loop is not None or self.loop_failed:
            return
        fields = smi_parse.HEALTH_QUERIES[self.query]
        self.loop = SmiLoop(self.path, self.loop_ms, expected=len(self.latest), fields=fields,
                            convert=lambda rows: smi_parse.health_by_uuid(rows, fields, gpu_health.card_max_width),
                            name="nvidia-smi health loop")

    def _from_loop(self, errors):
        """The loop's newest iteration when it is fresh; a loop that never loops is given up."""
        if self.loop is None:
            return None
        errors.extend(self.loop.drain_errors())
        self.loop.kill_if_silent(max(SILENT_MIN_S, 10 * self.loop_ms / 1000.0))
        if self.loop.runs >= LOOP_TRIES and not self.loop.looped:
            self.loop.stop()
            self.loop, self.loop_failed = None, True
            return None
        return self.loop.fresh(self.max_age)

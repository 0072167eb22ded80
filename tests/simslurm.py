"""A Slurm cluster on the test LAN: Slurm's own daemons (22.05, Debian's slurm-wlm) on simulated nodes.

`with SimSlurm(cluster, ["node2", "node3"]) as slurm:` makes a started SimCluster (tests/simcluster.py) a
cluster as a lab runs one:

- the controller, slurmctld, runs on this machine, the LAN's 10.213.0.1, as a head node does;
- each compute node runs a slurmd in its own network namespace, so a job's tasks have that node's address
  (entered with `nsenter --net`: `ip netns exec` remounts /sys, where slurmd then finds no cgroup tree and dies);
- every node's SSH sessions get $SLURM_CONF (SimNode.session_env), so `ssh node1 sbatch ...` works on a login
  node that is no compute node, as on a lab's login node; `slurm.run()` runs a client here.

Every part of it is private to a temp dir of its own: slurm.conf, a munged with its own key and socket (named
in slurm.conf's AuthInfo, so daemons and clients all use it), state, spool and logs. Nothing in /etc/slurm,
/etc/munge, /run/munge or /var is read or written, and the ports are its own.

A job runs in its slurmd's mount namespace: this machine's, but for ~/.homegpu, the node's own work dir as
the node's sessions see it, or with `shared_home="node1"` that node's, as a lab's login and compute nodes
share an NFS home. Its tasks get $HOMEGPU_SIMNODE of the node they run on (a TaskProlog), so they count as
that node's processes (SimNode.pids), not as those of the login node whose environment sbatch passes on.

close() cancels every job, ends the daemons and anything left of the jobs (slurmstepd detaches from slurmd,
so they are looked for in the compute nodes' namespaces), and removes the temp dir; it may be called twice,
and after a start that failed halfway.
"""

from __future__ import annotations

import atexit
import os
import shlex
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Iterable, Mapping

import simnet
from simcluster import (
    MARKER_VAR, NODE_HOME, SimCluster, SimClusterError, SimNode, _descendants, _proc_table, _stop_process, alive,
    free_port,
)

DEFAULT_PARTITION = "debug"
REAL_MEMORY_MB = 1000  # under any test machine's memory: slurmd drains a node that has less than it says
SLURMD_PORT = 6818  # Slurm's own: each slurmd listens in a namespace of its own, where nothing else does
SLURMD_TIMEOUT_S = 10  # a node that stops answering is DOWN this soon
MIN_JOB_AGE_S = 120  # a finished job stays in squeue this long
START_TIMEOUT_S = 60.0

_REQUIRED_TOOLS = (
    ("slurmctld", "slurm-wlm"), ("slurmd", "slurm-wlm"), ("sbatch", "slurm-wlm"), ("munged", "munge"),
    ("nsenter", "util-linux"), ("unshare", "util-linux"),
)

# Clusters started by this process and not closed yet: closed at exit, so a test that fails between start
# and close leaves no slurmctld or munged behind (slurmd dies with its node's namespace anyway).
_RUNNING: dict[int, SimSlurm] = {}


class SimSlurmError(SimClusterError):
    """The Slurm cluster did not come up; the message has the daemons' log tails."""


class SimSlurm:
    """Slurm on `cluster`: `compute` names its compute nodes, all in the default partition `debug`.

    `partitions` adds partitions ({"gpu": ["node2"]}), `max_time` gives partitions a MaxTime (minutes, or
    Slurm's "D-HH:MM:SS"; unlimited otherwise), `shared_home` names the node whose ~/.homegpu every job
    sees. The cluster's running nodes restart their sshd (with $SLURM_CONF) when it starts, so make it
    before starting anything on them.
    """

    def __init__(self, cluster: SimCluster, compute: Iterable[str], *,
                 partitions: Mapping[str, Iterable[str]] | None = None,
                 max_time: Mapping[str, int | str] | None = None, shared_home: str | None = None) -> None:
        self.cluster = cluster
        self.compute = [cluster.node(name) for name in compute]
        self.partitions = {DEFAULT_PARTITION: [node.name for node in self.compute]}
        self.partitions.update({name: list(nodes) for name, nodes in (partitions or {}).items()})
        self.max_time = dict(max_time or {})
        strangers = set().union(*self.partitions.values()) - {node.name for node in self.compute}
        if strangers or set(self.max_time) - set(self.partitions):
            raise SimSlurmError(f"partitions of nodes that are not compute nodes ({sorted(strangers)}) or "
                                f"max_time of unknown partitions ({sorted(set(self.max_time) - set(self.partitions))})")
        self.home = cluster.node(shared_home) if shared_home else None
        self.dir: Path | None = None
        self._munged: subprocess.Popen | None = None
        self._slurmctld: subprocess.Popen | None = None
        self._slurmd: dict[str, subprocess.Popen] = {}

    # -- where things are --

    @property
    def conf(self) -> Path:
        """slurm.conf: what $SLURM_CONF names for every client."""
        return self._path("slurm.conf")

    @property
    def env(self) -> dict[str, str]:
        """The variables a Slurm client on this machine needs (add them to os.environ's copy)."""
        return {"SLURM_CONF": str(self.conf)}

    def _path(self, name: str) -> Path:
        if self.dir is None:
            raise SimSlurmError("the Slurm cluster is not started")
        return self.dir / name

    def run(self, argv: list[str], timeout: float = 30.0) -> subprocess.CompletedProcess:
        """Run a Slurm client (sinfo, squeue, scontrol, ...) here, against this cluster; text output."""
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env={**os.environ, **self.env})

    # -- lifecycle --

    def __enter__(self) -> SimSlurm:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self) -> SimSlurm:
        """Start munged, slurmctld and the slurmds; return once every compute node is idle."""
        require_slurm()
        _RUNNING[id(self)] = self
        try:
            self.dir = Path(tempfile.mkdtemp(prefix="homegpu-slurm-"))
            self.dir.chmod(0o755)  # munged: everyone must reach its socket
            self._start_munged()
            self._write_conf()
            self._give_sessions_slurm_conf()
            self._slurmctld = _daemon(["slurmctld", "-D", "-f", str(self.conf)], self._path("slurmctld.out"))
            for node in self.compute:
                self._start_slurmd(node)
            self._wait_idle(START_TIMEOUT_S)
        except BaseException:
            self.close()
            raise
        return self

    def close(self) -> None:
        """Cancel every job, end every daemon and job process, remove the temp dir."""
        if self._slurmctld is not None and self._slurmctld.poll() is None:
            self._cancel_all()
        for proc in self._slurmd.values():
            _stop_process(proc, 5.0)
        self._kill_jobs()
        for proc in (self._slurmctld, self._munged):
            if proc is not None:
                _stop_process(proc, 10.0)
        self._slurmd, self._slurmctld, self._munged = {}, None, None
        for node in self.cluster.nodes:
            if self.dir is not None and node.session_env.get("SLURM_CONF") == str(self.conf):
                del node.session_env["SLURM_CONF"]  # gone at the node's next restart
        if self.dir is not None:
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = None
        _RUNNING.pop(id(self), None)

    # -- munge --

    def _start_munged(self) -> None:
        key = self._path("munge.key")
        key.write_bytes(os.urandom(128))  # what `mungekey` writes: 1024 random bits
        key.chmod(0o400)
        socket_path = self._path("munge.socket")
        self._munged = _daemon(["munged", "--foreground", f"--socket={socket_path}", f"--key-file={key}",
                                f"--pid-file={self._path('munged.pid')}", f"--seed-file={self._path('munged.seed')}",
                                f"--log-file={self._path('munged.log')}"], self._path("munged.out"))
        deadline = time.monotonic() + 10
        while not socket_path.exists():
            if self._munged.poll() is not None or time.monotonic() > deadline:
                raise SimSlurmError(f"munged did not start:\n{_tail(self._path('munged.out'))}")
            time.sleep(0.02)

    # -- slurm.conf --

    def _write_conf(self) -> None:
        self._path("plugstack.conf").write_text("")  # not /etc/slurm's
        for node in self.compute:
            (self._path("spool") / node.name).mkdir(parents=True)
        self._path("state").mkdir()
        prolog = self._path("task_prolog")
        prolog.write_text(_task_prolog(self.compute))
        prolog.chmod(0o755)
        controller = socket.gethostname().split(".")[0]  # slurmctld refuses to run unless it is named
        lines = [
            "ClusterName=homegpu-sim",
            f"SlurmctldHost={controller}({simnet.BRIDGE_ADDRESS})",
            f"SlurmctldPort={free_port('0.0.0.0')}",
            f"SlurmdPort={SLURMD_PORT}",
            f"AuthInfo=socket={self._path('munge.socket')}",
            "SlurmUser=root",
            "SlurmdUser=root",
            f"StateSaveLocation={self._path('state')}",
            f"SlurmctldPidFile={self._path('slurmctld.pid')}",
            f"SlurmctldLogFile={self._path('slurmctld.log')}",
            f"SlurmdSpoolDir={self._path('spool')}/%n",
            f"SlurmdPidFile={self._path('spool')}/slurmd-%n.pid",
            f"SlurmdLogFile={self._path('spool')}/slurmd-%n.log",
            f"PlugStackConfig={self._path('plugstack.conf')}",
            f"TaskProlog={prolog}",
            # No cgroups: every slurmd shares this machine's tree; a job's processes are found by their parents.
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "JobCompType=jobcomp/none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core",
            "MpiDefault=none",
            "ReturnToService=2",  # a node that answers again after a restart or freeze is usable again
            "SchedulerParameters=batch_sched_delay=0",  # a batch job starts in ~1 s, not ~3 s
            f"SlurmdTimeout={SLURMD_TIMEOUT_S}",
            "InactiveLimit=0",
            "KillWait=2",
            f"MinJobAge={MIN_JOB_AGE_S}",
            "SlurmctldDebug=info",
            "SlurmdDebug=info",
        ]
        cpus = len(os.sched_getaffinity(0))  # nproc's count: slurmd drains a node that says more than it has
        for node in self.compute:
            lines.append(f"NodeName={node.name} NodeAddr={node.address} CPUs={cpus} RealMemory={REAL_MEMORY_MB} "
                         "State=UNKNOWN")
        for name, nodes in self.partitions.items():
            limit = self.max_time.get(name, "INFINITE")
            default = " Default=YES" if name == DEFAULT_PARTITION else ""
            lines.append(f"PartitionName={name} Nodes={','.join(nodes)} MaxTime={limit} State=UP{default}")
        self.conf.write_text("\n".join(lines) + "\n")

    def _give_sessions_slurm_conf(self) -> None:
        """Every node's sessions get $SLURM_CONF: sshd reads SetEnv when it starts, so running nodes restart
        (before any slurmd starts: a restart ends everything in the node's namespace)."""
        for node in self.cluster.nodes:
            node.session_env["SLURM_CONF"] = str(self.conf)
            if node.is_running:
                node.restart()

    # -- daemons --

    def _start_slurmd(self, node: SimNode) -> None:
        """slurmd in the node's network namespace, in a mount namespace where ~/.homegpu is the node's (or the
        shared home's) work dir. nsenter, unshare and sh all exec: the pid is slurmd's."""
        if node.namespace is None:
            raise SimSlurmError(f"{node.name} is not started")
        work = (self.home or node).work_dir
        slurmd = shlex.join(["slurmd", "-D", "-f", str(self.conf), "-N", node.name])
        mount = shlex.join(["mount", "--bind", str(work), os.path.join(NODE_HOME, ".homegpu")])
        self._slurmd[node.name] = _daemon(
            ["nsenter", f"--net=/run/netns/{node.namespace}", "unshare", "-m", "--propagation", "private",
             "sh", "-c", f"{mount} && exec {slurmd}"],
            self._path(f"slurmd-{node.name}.out"), env={MARKER_VAR: node.marker})

    def _wait_idle(self, timeout: float) -> None:
        deadline, states = time.monotonic() + timeout, {}
        while time.monotonic() < deadline:
            dead = [name for name, proc in self._daemons().items() if proc.poll() is not None]
            if dead:
                raise SimSlurmError(f"{', '.join(dead)} exited:\n{self.logs()}")
            states = self.node_states()
            if all(states.get(node.name) == "idle" for node in self.compute):
                return
            time.sleep(0.2)
        raise SimSlurmError(f"compute nodes not idle after {timeout:.0f} s ({states}):\n{self.logs()}")

    def node_states(self) -> dict[str, str]:
        """Node name -> its state as sinfo says it ("idle", "alloc", "down*", ...); {} if slurmctld is not answering."""
        result = self.run(["sinfo", "--noheader", "--Node", "--format=%N %T"])
        if result.returncode != 0:
            return {}
        return dict(line.split()[:2] for line in result.stdout.splitlines() if len(line.split()) >= 2)

    def pids(self) -> set[int]:
        """Every live process of it: munged, slurmctld, the slurmds, their slurmstepds and the jobs' processes."""
        daemons = {proc.pid for proc in self._daemons().values() if proc.returncode is None}
        return alive(daemons | _descendants(daemons, _proc_table()) | self._job_pids())

    def _daemons(self) -> dict[str, subprocess.Popen]:
        procs = {"munged": self._munged, "slurmctld": self._slurmctld}
        procs.update({f"slurmd on {name}": proc for name, proc in self._slurmd.items()})
        return {name: proc for name, proc in procs.items() if proc is not None}

    def logs(self, lines: int = 12) -> str:
        """The last lines of every daemon's logs, for an error message."""
        if self.dir is None:
            return ""
        paths = sorted(self.dir.glob("*.out")) + sorted(self.dir.glob("*.log")) + sorted(self.dir.glob("spool/*.log"))
        return "\n".join(f"--- {path.relative_to(self.dir)}\n{_tail(path, lines)}" for path in paths)

    # -- ending jobs --

    def _cancel_all(self) -> None:
        """scancel every job and give their tasks KillWait to end as Slurm ends them (SIGTERM, then SIGKILL)."""
        listed = self.run(["squeue", "--noheader", "--format=%i"], timeout=10)
        jobs = listed.stdout.split() if listed.returncode == 0 else []
        if not jobs:
            return
        self.run(["scancel", *jobs], timeout=10)
        deadline = time.monotonic() + 10
        while self._job_pids() and time.monotonic() < deadline:
            time.sleep(0.1)

    def _job_pids(self) -> set[int]:
        """slurmstepd processes, what they started and any process of a job, in the compute nodes' namespaces."""
        table = _proc_table()
        found: set[int] = set()
        for node in self.compute:
            if node.namespace is None:
                continue
            inside = simnet.namespace_pids(node.namespace)
            found |= {pid for pid in inside if _is_step(pid) or _in_job(pid)}
        return {pid for pid in _descendants(found, table) if table[pid][1] != "Z"}

    def _kill_jobs(self) -> None:
        while pids := self._job_pids():
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            deadline = time.monotonic() + 5
            while alive(pids) and time.monotonic() < deadline:
                time.sleep(0.02)


def require_slurm() -> None:
    """Raise SimSlurmError unless Slurm's daemons and clients and munge are installed."""
    missing = [(tool, package) for tool, package in _REQUIRED_TOOLS if shutil.which(tool) is None]
    if missing:
        packages = " ".join(sorted({package for _, package in missing}))
        raise SimSlurmError(f"missing {', '.join(tool for tool, _ in missing)}; install with: "
                            f"apt-get install -y {packages}")


def _task_prolog(nodes: Iterable[SimNode]) -> str:
    """A TaskProlog that gives each task the marker of the node it runs on (its output sets the task's env)."""
    cases = "".join(f"    {node.name}) echo export {MARKER_VAR}={node.marker} ;;\n" for node in nodes)
    return f'#!/bin/sh\ncase "$SLURMD_NODENAME" in\n{cases}esac\n'


def _daemon(argv: list[str], out: Path, env: Mapping[str, str] | None = None) -> subprocess.Popen:
    """Start a daemon in the foreground, its stdout and stderr into `out`; a session of its own, as sshd's."""
    with open(out, "ab") as log:
        return subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True,
                                env={**os.environ, **(env or {})})


def _is_step(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/comm").read_text().startswith("slurmstepd")
    except OSError:
        return False


def _in_job(pid: int) -> bool:
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        return any(entry.startswith(b"SLURM_JOB_ID=") for entry in environ)
    except OSError:
        return False


def _tail(path: Path, lines: int = 12) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no file)"


def close_all() -> None:
    """Close every cluster this process started and did not close (registered with atexit)."""
    for slurm in list(_RUNNING.values()):
        slurm.close()


atexit.register(close_all)

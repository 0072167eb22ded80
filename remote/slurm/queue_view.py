"""Slurm's queue read into homegpu's: squeue's lines (one fixed `--format`) as SlurmJobs, each with its
state as homegpu's queue names it and, for a pending job, why it waits in homegpu's words.

squeue's `--json` changes shape with every Slurm release (v0.0.38 in 22.05, others since), while its
`--format` fields have stayed put for years, so homegpu asks for the fields it needs, `|`-separated (no
field it asks for can hold one: job names are homegpu's own, and reasons are Slurm's words). The reason
codes are squeue(1)'s "JOB REASON CODES"; tests/fixtures/slurm/squeue_queue.txt holds them as a real Slurm
printed them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from homegpu.remote.slurm.hostlist import HostlistError, expand

JOB_PREFIX = "homegpu-"  # every Slurm job homegpu submits is named homegpu-RUN_ID (batch.py)
# job id, name, state, reason, node count, gres per node, partition, time used, time limit, nodes, dependency
SQUEUE_FIELDS = ("%i", "%j", "%T", "%r", "%D", "%b", "%P", "%M", "%l", "%N", "%E")
SQUEUE_FORMAT = "|".join(SQUEUE_FIELDS)
_RUN_ID = re.compile(r"(?P<job>.+)-\d{8}-\d{6}-[0-9a-f]{4}")  # launch_plan's new_run_id: JOB-STAMP-HEX

# Slurm's job states (squeue(1) "JOB STATE CODES") as homegpu's queue names its entries' (EntryState).
_STATES = {
    "PENDING": "waiting", "REQUEUED": "waiting", "REQUEUE_HOLD": "waiting", "REQUEUE_FED": "waiting",
    "SUSPENDED": "waiting", "CONFIGURING": "starting", "RUNNING": "running", "COMPLETING": "running",
    "STAGE_OUT": "running", "SIGNALING": "running", "RESIZING": "running", "COMPLETED": "succeeded",
    "FAILED": "failed", "TIMEOUT": "failed", "NODE_FAIL": "failed", "OUT_OF_MEMORY": "failed",
    "BOOT_FAIL": "failed", "DEADLINE": "failed", "CANCELLED": "cancelled", "PREEMPTED": "cancelled",
    "REVOKED": "cancelled", "SPECIAL_EXIT": "failed",
}
# How a job that ended went, beside its state, where the state alone does not say it.
_ENDINGS = {"TIMEOUT": "ran past its time limit", "NODE_FAIL": "a node it ran on failed",
            "OUT_OF_MEMORY": "ran out of memory", "PREEMPTED": "preempted by a higher-priority job",
            "BOOT_FAIL": "a node failed to boot", "DEADLINE": "missed its deadline"}
_AFTER_WORDS = {"afterok": "to succeed", "afterany": "to end", "afternotok": "to fail", "after": "to start",
                "aftercorr": "to succeed", "singleton": "to end"}
_DEPENDENCY = re.compile(r"(?P<kind>[a-z]+):(?P<job>\d+)(?:_\*)?(?:\+\d+)?\((?P<status>[a-z]+)\)")


class SqueueError(ValueError):
    """A line that is not what homegpu's squeue format prints (another format, a truncated line)."""


@dataclass(frozen=True)
class SlurmJob:
    """One job as squeue lists it."""

    job_id: str
    name: str
    state: str  # Slurm's: PENDING, RUNNING, COMPLETED, ...
    reason: str  # Slurm's reason code ("Resources", "Dependency", ...), "None" when there is none
    node_count: int
    gres: str  # per node, as sbatch --gres took it ("gpu:1"), "" for none
    partition: str
    elapsed: str  # as squeue prints it: "0:13", "1-02:03:04"
    time_limit: str
    nodelist: str  # a hostlist expression, "" while pending
    dependency: str  # squeue's %E: "afterok:9(unfulfilled)", "" for none

    @property
    def is_homegpus(self) -> bool:
        return self.name.startswith(JOB_PREFIX)

    @property
    def run_id(self) -> str:
        """The homegpu run this Slurm job is ("" for another's job)."""
        return self.name.removeprefix(JOB_PREFIX) if self.is_homegpus else ""

    @property
    def job(self) -> str:
        """The [jobs.NAME] it runs, from its run id ("" when the name is not one homegpu gave)."""
        match = _RUN_ID.fullmatch(self.run_id)
        return match["job"] if match else ""

    @property
    def homegpu_state(self) -> str:
        """The state as homegpu's queue names it: waiting, starting, running, succeeded, failed, cancelled."""
        return _STATES.get(self.state.split()[0], "waiting")

    def nodes(self) -> list[str]:
        """The nodes it runs on, one by one ([] while pending, or where squeue's list is not a hostlist)."""
        try:
            return expand(self.nodelist) if self.nodelist else []
        except HostlistError:
            return []


def squeue_argv() -> list[str]:
    """The squeue command whose output `parse_squeue` reads: every state, so jobs that ended lately show."""
    return ["squeue", "--noheader", "--states=all", f"--format={SQUEUE_FORMAT}"]


def parse_squeue(text: str) -> list[SlurmJob]:
    """Every job of squeue's output in SQUEUE_FORMAT. Raises SqueueError for a line of another shape."""
    return [_job(line) for line in text.splitlines() if line.strip()]


def _job(line: str) -> SlurmJob:
    fields = line.split("|")
    if len(fields) != len(SQUEUE_FIELDS) or not fields[0].strip() or not fields[4].isdigit():
        raise SqueueError(f"squeue printed {line[:80]!r}, not the {len(SQUEUE_FIELDS)} fields homegpu asked for")
    job_id, name, state, reason, count, gres, partition, elapsed, limit, nodelist, dependency = fields
    return SlurmJob(job_id=job_id.strip(), name=name, state=state, reason=reason, node_count=int(count),
                    gres=_gres(gres), partition=partition, elapsed=elapsed, time_limit=limit, nodelist=nodelist,
                    dependency="" if dependency == "(null)" else dependency)


def _gres(text: str) -> str:
    """squeue's %b ("gres:gpu:1", "gres/gpu:1" in later releases, "N/A") as sbatch --gres took it."""
    if text in ("N/A", "(null)", ""):
        return ""
    return ",".join(re.sub(r"^(gres|tres-per-node)?[:/]?", "", item, count=1) for item in text.split(","))


def homegpu_jobs(jobs: list[SlurmJob]) -> list[SlurmJob]:
    """The jobs homegpu submitted, oldest first."""
    return sorted((job for job in jobs if job.is_homegpus), key=lambda job: _id_order(job.job_id))


def _id_order(job_id: str) -> tuple[int, str]:
    digits = re.match(r"\d+", job_id)
    return (int(digits.group()) if digits else 0, job_id)


def status_words(job: SlurmJob) -> str:
    """What the job is doing, in homegpu's words: why it waits, where it runs, or how it ended."""
    state = job.state.split()[0]
    if state == "PENDING":
        return waiting_words(job)
    if job.homegpu_state in ("running", "starting"):
        return f"running on {job.nodelist or 'its nodes'} for {job.elapsed}" + (
            f" (time limit {job.time_limit})" if job.time_limit not in ("", "UNLIMITED") else "")
    ending = _ENDINGS.get(state, "")
    if state == "FAILED" and job.reason == "NonZeroExitCode":
        ending = "a worker exited with an error"
    if state == "CANCELLED" and job.reason == "DependencyNeverSatisfied":  # --kill-on-invalid-dep (batch.py)
        ending = _waiting_for_jobs(job, never=True).split(";")[0].removeprefix("will never start: ")
    return job.homegpu_state + (f": {ending}" if ending else "")


def waiting_words(job: SlurmJob) -> str:
    """Why a pending job waits, in homegpu's words (squeue(1) "JOB REASON CODES"), with what to do where
    waiting will not end by itself."""
    reason = job.reason
    code = reason.split(",")[0].strip()
    fixed = _FIXED_REASONS.get(code)
    if fixed:
        return fixed
    if code == "JobHeldUser":
        return f"held: `scontrol release {job.job_id}` lets it start"
    if code == "Resources":
        return _waiting_for_nodes(job)
    if code in ("Dependency", "DependencyNeverSatisfied"):
        return _waiting_for_jobs(job, never=code == "DependencyNeverSatisfied")
    if code == "ReqNodeNotAvail" or reason.startswith("Nodes required for job are DOWN"):
        unavailable = reason.partition("UnavailableNodes:")[2].strip()
        return "the requested nodes are down or drained" + (f": {unavailable}" if unavailable else
                                                               " (or kept for a higher-priority partition)")
    if code == "PartitionTimeLimit":
        return (f"will not start: its time limit {job.time_limit} is over partition {job.partition}'s (sinfo shows "
                f"it); cancel it and set a shorter time_limit in [jobs.{job.job or 'NAME'}]")
    if code == "PartitionNodeLimit":
        return (f"will not start: {job.node_count} nodes is more than partition {job.partition} allows; cancel it "
                "and run it on fewer nodes, or in another partition")
    if code in ("PartitionDown", "PartitionInactive"):
        return f"waiting: partition {job.partition} is {'down' if code == 'PartitionDown' else 'inactive'}"
    if reason.startswith("Job's account not known"):
        allowed = re.search(r"\((\S+) allows ([^)]*)\)", reason)
        listed = f" (it allows {allowed[2].replace(',', ', ')})" if allowed else ""
        return (f"will not start: its account may not use partition {job.partition}{listed}; cancel it and set "
                f"account in [jobs.{job.job or 'NAME'}]")
    if code.startswith(("AssocGrp", "AssocMax", "QOSGrp", "QOSMax", "MaxCpu", "MaxGRES", "MaxJobs", "MaxNode")):
        return f"waiting: a limit of its account or QOS ({code})"
    return f"waiting ({reason})" if reason and reason != "None" else "waiting"


_FIXED_REASONS = {
    "Priority": "waiting: higher-priority jobs first",
    "JobHeldAdmin": "held by a Slurm administrator",
    "BeginTime": "waiting for its start time",
    "BadConstraints": "will never start: no node has what it asks for; cancel it and ask for less (gres, nodes)",
    "InvalidAccount": "will not start: its account is not valid; cancel it and fix account",
    "InvalidQOS": "will not start: its QOS is not valid; cancel it and fix qos",
    "NodeDown": "a node it needs is down",
    "Reservation": "waiting for its reservation",
    "Licenses": "waiting for licenses",
    "Cleaning": "waiting: Slurm is cleaning up after its last try",
    "Prolog": "starting: its prolog runs",
    "launch": "starting",
}


def _waiting_for_nodes(job: SlurmJob) -> str:
    """'waiting for 2 nodes with gpu:1 in partition gpu'."""
    nodes = f"{job.node_count} node{'s' if job.node_count != 1 else ''}"
    gres = f" with {job.gres}" if job.gres else ""
    return f"waiting for {nodes}{gres} in partition {job.partition}"


def _waiting_for_jobs(job: SlurmJob, never: bool) -> str:
    """'waiting for job 12 to succeed', or, once it cannot, what happened and what to do."""
    found = [match.groupdict() for match in _DEPENDENCY.finditer(job.dependency)]
    if never:
        broken = [d for d in found if d["status"] != "unfulfilled"] or found
        what = (f"{_jobs([d['job'] for d in broken])}, which it runs after, {broken[0]['status']}" if broken
                else "a job it runs after ended otherwise than it needs")
        return f"will never start: {what}; cancel it and submit it again"
    waiting = [d for d in found if d["status"] == "unfulfilled"] or found
    if not waiting:
        return "waiting for the jobs it runs after"
    kinds = {d["kind"] for d in waiting}
    verb = _AFTER_WORDS.get(kinds.pop(), "to end") if len(kinds) == 1 else "to end as it needs"
    return f"waiting for {_jobs([d['job'] for d in waiting])} {verb}"


def _jobs(ids: list[str]) -> str:
    if len(ids) == 1:
        return f"job {ids[0]}"
    return "jobs " + ", ".join(ids[:-1]) + f" and {ids[-1]}"

"""sbatch's refusals as one line naming the job and the fix: "partition 'gpux' does not exist: set
partition in [jobs.train] to one of: debug, gpu (sinfo lists them)".

sbatch says why in Slurm's own words ("Batch job submission failed: Invalid partition name specified",
tests/fixtures/slurm/sbatch_*.txt as a real one printed them), which name neither the key nor what
would do. Each known message maps to the key of [jobs.NAME] that caused it and what to set it to,
using the partitions sinfo lists where it helps; one homegpu does not know is passed on, with the job.
"""

from __future__ import annotations

from typing import Callable, Sequence

from homegpu.remote.slurm.batch import BatchRequest
from homegpu.remote.slurm.partitions import Partition, partition_for

Explain = Callable[[BatchRequest, Sequence[Partition]], str]


def slurms_words(stderr: str) -> str:
    """What Slurm said, without sbatch's prefixes: the last "error:" line of its stderr, else its last line."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    errors = [line for line in lines if "error:" in line]
    last = (errors or lines or [""])[-1]
    text = last.split("error:", 1)[-1].strip()
    return text.removeprefix("Batch job submission failed:").strip()


def refusal_line(request: BatchRequest, stderr: str, partitions: Sequence[Partition] = ()) -> str:
    """One line for sbatch's refusal of `request`: what is wrong, in homegpu's terms, and what to set."""
    words = slurms_words(stderr)
    for known, explain in _KNOWN:
        if known.lower() in words.lower():
            return explain(request, partitions)
    said = words or "sbatch failed and said nothing"
    return (f"Slurm refused job {request.job.name}: {said}; check {_where(request)}'s Slurm keys (partition, "
            "account, qos, time_limit, gres) against the cluster, or ask its administrators")


def _where(request: BatchRequest) -> str:
    return f"[jobs.{request.job.name}]"


def _partition_text(request: BatchRequest, partitions: Sequence[Partition] = ()) -> str:
    """The partition the job went to, by name where the job or sinfo names it."""
    if request.job.partition:
        return f"partition {request.job.partition}"
    default = partition_for(list(partitions), "")
    return f"the default partition {default.name}" if default else "the default partition"


def _names(partitions: Sequence[Partition]) -> str:
    return ", ".join(partition.name for partition in partitions)


def _no_partition(request: BatchRequest, partitions: Sequence[Partition]) -> str:
    listed = f"one of: {_names(partitions)} (sinfo lists them)" if partitions else "one that sinfo lists"
    return f"partition {request.job.partition!r} does not exist: set partition in {_where(request)} to {listed}"


def _time_over(request: BatchRequest, partitions: Sequence[Partition]) -> str:
    partition = partition_for(list(partitions), request.job.partition)
    limit = partition.time_limit if partition else ""
    asked = f"time limit {request.job.time_limit}" if request.job.time_limit else "the default time limit"
    where = _partition_text(request, partitions)
    over = f"over {where}'s {limit}" if limit else f"over what {where} allows"
    most = f"at most {limit}" if limit else "less (sinfo shows each partition's TIMELIMIT)"
    return f"{asked} is {over}: set time_limit in {_where(request)} to {most}, or set a partition that allows it"


def _account(request: BatchRequest, partitions: Sequence[Partition]) -> str:
    who = f"account {request.job.account!r}" if request.job.account else "your default account"
    return (f"{who} may not submit to {_partition_text(request, partitions)}: set account in {_where(request)} to "
            "one that may (sacctmgr show associations user=$USER lists yours), or set another partition")


def _node_count(request: BatchRequest, partitions: Sequence[Partition]) -> str:
    partition = partition_for(list(partitions), request.job.partition)
    has = f" has ({len(partition.nodes)})" if partition else " allows"
    return (f"{request.nodes} nodes is more than {_partition_text(request, partitions)}{has}: run job "
            f"{request.job.name} on fewer nodes (nodes in {_where(request)}), or set another partition")


def _node_config(request: BatchRequest, partitions: Sequence[Partition]) -> str:
    gres = request.gres or "the CPUs and memory it asks for"
    return (f"no node of {_partition_text(request, partitions)} has {gres}: set gres in {_where(request)} to what "
            "one node has (sinfo -o \"%P %G\" lists them), or set a partition with such nodes")


def _gres(request: BatchRequest, partitions: Sequence[Partition]) -> str:
    return (f"gres {request.gres!r} is not one Slurm knows: set gres in {_where(request)} to one sinfo -o \"%P %G\" "
            "lists, or leave it out for the device plan's GPUs")


def _qos(request: BatchRequest, partitions: Sequence[Partition]) -> str:
    return (f"qos {request.job.qos!r} does not exist or is not yours: set qos in {_where(request)} to one you may use "
            "(sacctmgr show associations user=$USER format=qos lists them), or remove it")


def _policy(request: BatchRequest, partitions: Sequence[Partition]) -> str:
    return (f"job {request.job.name} is over a limit of its account or QOS (time, nodes, GPUs or jobs at once): ask "
            f"for less in {_where(request)} (time_limit, gres), or wait for your other jobs (sacctmgr show qos)")


def _nodes_down(request: BatchRequest, partitions: Sequence[Partition]) -> str:
    partition = partition_for(list(partitions), request.job.partition)
    which = f" ({partition.unavailable_text})" if partition and partition.unavailable else ""
    return (f"the nodes job {request.job.name} needs are down or drained{which}: wait for them (sinfo -R says why), "
            f"or set another partition in {_where(request)}")


def _dependency(request: BatchRequest, partitions: Sequence[Partition]) -> str:
    after = ", ".join(request.after) or "none"
    return (f"job {request.job.name} runs after {after}, which Slurm cannot wait for: give --after the Slurm job "
            "ids homegpu queue shows")


def _nice(request: BatchRequest, partitions: Sequence[Partition]) -> str:
    return (f"--priority {request.priority} would put job {request.job.name} ahead of other users' jobs, which only "
            "Slurm's operators may do: give --priority 0 or lower (lower waits behind your other jobs)")


def _time_format(request: BatchRequest, partitions: Sequence[Partition]) -> str:
    return (f"sbatch cannot read time limit {request.job.time_limit!r}: set time_limit in {_where(request)} in one "
            'of Slurm\'s forms ("MM", "HH:MM:SS", "D-HH:MM:SS")')


def _controller(request: BatchRequest, partitions: Sequence[Partition]) -> str:
    return (f"Slurm's controller does not answer, so job {request.job.name} was not submitted: run sinfo on "
            "slurm_login to see why, or ask the cluster's administrators")


def _permission(request: BatchRequest, partitions: Sequence[Partition]) -> str:
    return (f"Slurm denied job {request.job.name} to this user: check account, qos and partition in "
            f"{_where(request)} with the cluster's administrators")


# Slurm's own words (slurm_errno.c, as sbatch prints them) → homegpu's; the first that matches explains.
_KNOWN: tuple[tuple[str, Explain], ...] = (
    ("Invalid partition name specified", _no_partition),
    ("invalid partition specified", _no_partition),
    ("Requested time limit is invalid", _time_over),
    ("Invalid account or account/partition combination", _account),
    ("Node count specification invalid", _node_count),
    ("Requested node configuration is not available", _node_config),
    ("Invalid generic resource (gres) specification", _gres),
    ("Invalid qos specification", _qos),
    ("Job violates accounting/QOS policy", _policy),
    ("Required node not available", _nodes_down),
    ("Job dependency problem", _dependency),
    ("Invalid --nice value", _nice),
    ("Invalid --time specification", _time_format),
    ("Unable to contact slurm controller", _controller),
    ("Access/permission denied", _permission),
)

"""sbatch's refusals, as a real Slurm printed them (tests/fixtures/slurm/sbatch_*.txt), each turned into one line
naming the job, the key of [jobs.NAME] to change and what to set it to."""

from __future__ import annotations

import pytest
from slurm_recorded import recorded

from homegpu.remote.config import parse_cluster
from homegpu.remote.slurm import BatchRequest, parse_sinfo, refusal_line, slurms_words

RUN_ID = "train-20261127-070000-ab12"


def request(*lines: str, **shape) -> BatchRequest:
    text = ('[cluster]\nscheduler = "slurm"\nslurm_login = "node1"\n[[nodes]]\nname = "node1"\nhost = "local"\n'
            "[jobs.train]\n" + "".join(f"{line}\n" for line in lines))
    return BatchRequest(parse_cluster(text).jobs["train"], RUN_ID, **{"nodes": 1, **shape})


PARTITIONS = parse_sinfo(recorded("sinfo_partitions").output)

CASES = [
    ("sbatch_unknown_partition", request('partition = "gpux"'),
     "partition 'gpux' does not exist: set partition in [jobs.train] to one of: debug, gpu (sinfo lists them)"),
    ("sbatch_time_over_partition", request('partition = "debug"', 'time_limit = "2:00:00"'),
     "time limit 2:00:00 is over partition debug's 30:00: set time_limit in [jobs.train] to at most 30:00, or set a "
     "partition that allows it"),
    ("sbatch_account_not_allowed", request('partition = "gpu"', 'account = "chemistry"'),
     "account 'chemistry' may not submit to partition gpu: set account in [jobs.train] to one that may (sacctmgr "
     "show associations user=$USER lists yours), or set another partition"),
    ("sbatch_too_many_nodes", request('partition = "debug"', nodes=5),
     "5 nodes is more than partition debug has (3): run job train on fewer nodes (nodes in [jobs.train]), or set "
     "another partition"),
    ("sbatch_too_many_gpus", request('partition = "debug"', 'gres = "gpu:5"'),
     'no node of partition debug has gpu:5: set gres in [jobs.train] to what one node has (sinfo -o "%P %G" lists '
     "them), or set a partition with such nodes"),
    ("sbatch_unknown_gres", request('gres = "gpu:a100:1"'),
     'no node of the default partition debug has gpu:a100:1: set gres in [jobs.train] to what one node has (sinfo -o '
     '"%P %G" lists them), or set a partition with such nodes'),
    ("sbatch_unreadable_dependency", request(after=("999",)),
     "job train runs after 999, which Slurm cannot wait for: give --after the Slurm job ids homegpu queue shows"),
    ("sbatch_negative_nice", request(priority=10),
     "--priority 10 would put job train ahead of other users' jobs, which only Slurm's operators may do: give "
     "--priority 0 or lower (lower waits behind your other jobs)"),
]


@pytest.mark.parametrize("fixture, refused, line", CASES, ids=[case[0] for case in CASES])
def test_each_recorded_refusal_is_one_line_naming_the_job_and_the_fix(fixture, refused, line):
    answer = recorded(fixture)
    assert answer.exit_status != 0
    assert refusal_line(refused, answer.output, PARTITIONS) == line
    assert "\n" not in line and ("[jobs.train]" in line or "job train" in line)


def test_without_sinfo_the_line_still_says_what_to_set():
    answer = recorded("sbatch_time_over_partition").output
    assert refusal_line(request('partition = "debug"', 'time_limit = "2:00:00"'), answer) == (
        "time limit 2:00:00 is over what partition debug allows: set time_limit in [jobs.train] to less (sinfo shows "
        "each partition's TIMELIMIT), or set a partition that allows it")
    assert refusal_line(request('partition = "gpux"'), recorded("sbatch_unknown_partition").output).endswith(
        "to one that sinfo lists")


def test_slurms_own_words_are_taken_from_its_last_error_line():
    assert slurms_words(recorded("sbatch_unknown_partition").output) == "Invalid partition name specified"
    assert slurms_words(recorded("sbatch_bad_time").output) == "Invalid --time specification"


@pytest.mark.parametrize("stderr, line", [
    ("sbatch: error: Batch job submission failed: Invalid qos specification\n",
     "qos 'fast' does not exist or is not yours: set qos in [jobs.train] to one you may use (sacctmgr show "
     "associations user=$USER format=qos lists them), or remove it"),
    ("sbatch: error: Batch job submission failed: Job violates accounting/QOS policy (job submit limit, user's size "
     "and/or time limits)\n",
     "job train is over a limit of its account or QOS (time, nodes, GPUs or jobs at once): ask for less in "
     "[jobs.train] (time_limit, gres), or wait for your other jobs (sacctmgr show qos)"),
    ("sbatch: error: Batch job submission failed: Required node not available (down, drained or reserved)\n",
     "the nodes job train needs are down or drained (node[2-3]): wait for them (sinfo -R says why), or set another "
     "partition in [jobs.train]"),
    ("sbatch: error: Batch job submission failed: Unable to contact slurm controller (connect failure)\n",
     "Slurm's controller does not answer, so job train was not submitted: run sinfo on slurm_login to see why, or "
     "ask the cluster's administrators"),
    ("sbatch: error: Batch job submission failed: Something else entirely\n",
     "Slurm refused job train: Something else entirely; check [jobs.train]'s Slurm keys (partition, account, qos, "
     "time_limit, gres) against the cluster, or ask its administrators"),
    ("", "Slurm refused job train: sbatch failed and said nothing; check [jobs.train]'s Slurm keys (partition, "
         "account, qos, time_limit, gres) against the cluster, or ask its administrators"),
])
def test_slurms_other_refusals_in_one_line(stderr, line):
    """Refusals this test Slurm cannot make (no slurmdbd for QOS and policies), in the words slurm_errno.c gives."""
    assert refusal_line(request('qos = "fast"'), stderr, PARTITIONS) == line

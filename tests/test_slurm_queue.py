"""Slurm's queue in homegpu's words: squeue's output as a real Slurm printed it (tests/fixtures/slurm/squeue_*.txt)
read into jobs, each with homegpu's state and, while pending, why it waits; sinfo's partitions folded."""

from __future__ import annotations

import shlex

import pytest
from slurm_recorded import recorded

from homegpu.remote.slurm import (
    SinfoError, SqueueError, homegpu_jobs, parse_sinfo, parse_squeue, sinfo_argv, squeue_argv, status_words,
    waiting_words,
)
from homegpu.remote.slurm.queue_view import SlurmJob


def queue() -> dict[str, SlurmJob]:
    return {job.job_id: job for job in parse_squeue(recorded("squeue_queue").output)}


def test_the_recorded_commands_are_the_ones_homegpu_runs():
    assert shlex.split(recorded("squeue_queue").command) == squeue_argv()
    assert shlex.split(recorded("sinfo_partitions").command) == sinfo_argv()


def test_every_line_squeue_printed_is_read_into_a_job():
    jobs = queue()
    assert len(jobs) == len(recorded("squeue_queue").output.splitlines()) == 22
    running = jobs["9"]
    assert (running.name, running.state, running.node_count, running.gres, running.partition, running.time_limit,
            running.nodes(), running.homegpu_state) == (
        "homegpu-train-a1", "RUNNING", 1, "gpu:1", "debug", "20:00", ["node1"], "running")
    assert jobs["14"].dependency == "afterok:9(unfulfilled)" and jobs["11"].dependency == ""
    assert jobs["11"].nodes() == [] and jobs["3"].gres == ""


def test_only_homegpus_jobs_are_its_queue_oldest_first():
    mine = homegpu_jobs(list(queue().values()))
    assert [job.job_id for job in mine] == ["1", "8", "9", "10", "11", "12", "13", "14", "15", "16", "17", "18",
                                            "19", "20", "22"]
    assert "someone-elses-job" not in {job.name for job in mine}


def test_a_run_id_names_its_job():
    job = parse_squeue("40|homegpu-my-model-20261127-070000-ab12|PENDING|Priority|1|N/A|gpu|0:00|1:00:00||(null)")[0]
    assert (job.run_id, job.job) == ("my-model-20261127-070000-ab12", "my-model")
    assert (queue()["9"].job, queue()["21"].run_id) == ("", "")


# why each recorded pending job waits, in homegpu's words
@pytest.mark.parametrize("job_id, words", [
    ("11", "waiting for 1 node with gpu:2 in partition debug"),
    ("12", "waiting: higher-priority jobs first"),
    ("13", "the requested nodes are down or drained: node[2-3]"),
    ("14", "waiting for job 9 to succeed"),
    ("15", "held: `scontrol release 15` lets it start"),
    ("16", "waiting for its start time"),
    ("17", "will not start: its time limit 2:00:00 is over partition debug's (sinfo shows it); cancel it and set a "
           "shorter time_limit in [jobs.NAME]"),
    ("18", "will not start: 5 nodes is more than partition debug allows; cancel it and run it on fewer nodes, or in "
           "another partition"),
    ("19", "the requested nodes are down or drained (or kept for a higher-priority partition)"),
    ("22", "will never start: job 10, which it runs after, failed; cancel it and submit it again"),
])
def test_a_pending_job_says_why_it_waits(job_id, words):
    assert queue()[job_id].homegpu_state == "waiting"
    assert status_words(queue()[job_id]) == words


def test_a_job_asking_for_a_down_node_names_it():
    job = parse_squeue(recorded("squeue_node_down").output)[0]
    assert status_words(job) == "the requested nodes are down or drained: node3"


@pytest.mark.parametrize("job_id, state, words", [
    ("9", "running", "running on node1 for 0:19 (time limit 20:00)"),
    ("10", "failed", "failed: a worker exited with an error"),
    ("1", "cancelled", "cancelled"),
    ("8", "failed", "failed"),
])
def test_a_job_that_runs_or_ended_says_so(job_id, state, words):
    assert (queue()[job_id].homegpu_state, status_words(queue()[job_id])) == (state, words)


def test_a_job_cancelled_because_the_one_before_failed_says_which():
    job = parse_squeue(recorded("squeue_killed_dependency").output)[0]
    assert (job.homegpu_state, status_words(job)) == ("cancelled", "cancelled: job 10, which it runs after, failed")


@pytest.mark.parametrize("reason, partition, words", [
    ("Resources", "gpu", "waiting for 2 nodes with gpu:1 in partition gpu"),
    ("Job's account not known, so it can't use this partition (gpu allows physics,vision)", "gpu",
     "will not start: its account may not use partition gpu (it allows physics, vision); cancel it and set account "
     "in [jobs.train]"),
    ("QOSMaxGRESPerUser", "gpu", "waiting: a limit of its account or QOS (QOSMaxGRESPerUser)"),
    ("PartitionDown", "gpu", "waiting: partition gpu is down"),
    ("SomethingNew", "gpu", "waiting (SomethingNew)"),
])
def test_other_reasons_in_homegpus_words(reason, partition, words):
    line = f"40|homegpu-train-20261127-070000-ab12|PENDING|{reason}|2|gres:gpu:1|{partition}|0:00|1:00:00||(null)"
    assert waiting_words(parse_squeue(line)[0]) == words


def test_several_dependencies_are_listed():
    line = "41|homegpu-x|PENDING|Dependency|1|N/A|gpu|0:00|1:00||afterok:12(unfulfilled),afterok:13(unfulfilled)"
    assert waiting_words(parse_squeue(line)[0]) == "waiting for jobs 12 and 13 to succeed"


@pytest.mark.parametrize("text", ["JOBID PARTITION NAME", "9|homegpu-x|RUNNING", "|a|b|c|x|e|f|g|h|i|j"])
def test_output_of_another_shape_is_refused(text):
    with pytest.raises(SqueueError, match="not the 11 fields homegpu asked for"):
        parse_squeue(text)


def test_sinfos_rows_fold_into_one_partition_each():
    debug, gpu = parse_sinfo(recorded("sinfo_partitions").output)
    assert (debug.name, debug.default, debug.time_limit, debug.time_limit_seconds) == ("debug", True, "30:00", 1800)
    assert (gpu.name, gpu.default, gpu.time_limit_seconds) == ("gpu", False, 86400)
    assert sorted(debug.nodes) == ["node1", "node2", "node3"] and debug.unavailable_text == "node[2-3]"


def test_sinfo_output_of_another_shape_is_refused():
    with pytest.raises(SinfoError):
        parse_sinfo("PARTITION AVAIL  TIMELIMIT  NODES  STATE NODELIST")

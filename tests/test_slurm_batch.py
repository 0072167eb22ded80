"""A run as one Slurm job: the sbatch argv and the batch script batch.py builds, checked against what a real
Slurm accepted and ran (tests/fixtures/slurm/batch_submission.txt), and the script's quoting run through sh."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from slurm_recorded import recorded, sections

from homegpu.remote.config import parse_cluster
from homegpu.remote.slurm import BatchRequest, batch_script, sbatch_argv, submitted_job_id

RUN_ID = "train-20261127-070000-ab12"


def slurm_job(*lines: str):
    text = ('[cluster]\nscheduler = "slurm"\nslurm_login = "node1"\n[[nodes]]\nname = "node1"\nhost = "local"\n'
            "[jobs.train]\n" + "".join(f"{line}\n" for line in lines))
    return parse_cluster(text).jobs["train"]


def test_the_submission_a_real_slurm_accepted_and_ran_is_what_batch_builds():
    recorded_parts = sections("batch_submission")
    request = BatchRequest(slurm_job('partition = "debug"', 'time_limit = "10"'), RUN_ID, nodes=1, gpus_per_node=1,
                           output="/tmp/slurm-rec/%x-%j.out", env={"SEED": "3 it's $HOME"})
    worker = json.loads(recorded_parts["worker"])
    assert sbatch_argv(request) == json.loads(recorded_parts["argv"])
    assert batch_script(request, worker) == recorded_parts["script"]
    assert submitted_job_id(recorded_parts["sbatch stdout"]) == "32"
    # the worker's arguments and the run's environment arrived intact on the allocated node, with its GPU
    assert recorded_parts["the job's output"] == f"args:a b;c|$(x)|3 it's $HOME|{RUN_ID}|node1|0|0\n"


def test_each_slurm_key_of_the_job_becomes_its_sbatch_option():
    job = slurm_job('partition = "gpu"', 'account = "vision"', 'qos = "high"', 'time_limit = "1-12"',
                    'gres = "gpu:rtx4090:2"')
    argv = sbatch_argv(BatchRequest(job, RUN_ID, nodes=3, tasks_per_node=2, gpus_per_node=1))
    assert argv == ["sbatch", "--parsable", f"--job-name=homegpu-{RUN_ID}", "--nodes=3", "--ntasks-per-node=2",
                    "--gres=gpu:rtx4090:2", "--partition=gpu", "--account=vision", "--qos=high",
                    "--time=1-12:00:00"]


def test_without_a_gres_of_its_own_the_job_asks_for_the_plans_gpus_and_for_none_on_cpu_nodes():
    job = slurm_job()
    assert "--gres=gpu:2" in sbatch_argv(BatchRequest(job, RUN_ID, nodes=2, gpus_per_node=2))
    assert not [arg for arg in sbatch_argv(BatchRequest(job, RUN_ID, nodes=2)) if arg.startswith("--gres")]


def test_after_waits_for_each_job_to_succeed_and_cancels_when_one_fails():
    argv = sbatch_argv(BatchRequest(slurm_job(), RUN_ID, nodes=1, after=("12", "13")))
    assert argv[-2:] == ["--dependency=afterok:12:13", "--kill-on-invalid-dep=yes"]


@pytest.mark.parametrize("priority, nice", [(-10, "--nice=10"), (5, "--nice=-5")])
def test_priority_is_slurms_nice_turned_around(priority, nice):
    assert sbatch_argv(BatchRequest(slurm_job(), RUN_ID, nodes=1, priority=priority))[-1] == nice
    assert not [a for a in sbatch_argv(BatchRequest(slurm_job(), RUN_ID, nodes=1)) if a.startswith("--nice")]


@pytest.mark.parametrize("changes, problem", [
    ({"nodes": 0}, "at least one node"), ({"tasks_per_node": 0}, "at least one node and one worker"),
    ({"after": ("q-12",)}, "'q-12' is not a Slurm job id"), ({"after": ("12 --uid=0",)}, "is not a Slurm job id"),
])
def test_a_request_sbatch_cannot_take_is_refused(changes, problem):
    with pytest.raises(ValueError, match=problem):
        sbatch_argv(BatchRequest(slurm_job(), RUN_ID, **{"nodes": 1, **changes}))


def test_the_script_hands_srun_every_argument_and_value_intact(tmp_path: Path):
    """The script run by sh with a stand-in srun that writes what it got: quotes, newlines, $(...), globs."""
    hostile = ["python3", "-c", "print('hi')", "a b", "it's", "$(touch pwned)", "`id`", "*", "line\nbreak", ""]
    env = {"SEED": "$HOME 'x' \"y\"\n;z", "EMPTY": ""}
    (tmp_path / "srun").write_text('#!/bin/sh\nprintf "%s\\0" "$@" > "$OUT"\nenv > "$OUT.env"\n')
    (tmp_path / "srun").chmod(0o755)
    script = batch_script(BatchRequest(slurm_job(), RUN_ID, nodes=2, tasks_per_node=3, env=env), hostile)
    out = tmp_path / "args"
    subprocess.run(["/bin/sh", "-c", script], check=True, cwd=tmp_path,
                   env={"PATH": f"{tmp_path}:{os.environ['PATH']}", "OUT": str(out)})
    assert out.read_bytes().split(b"\0")[:-1] == [arg.encode() for arg in
                                                  ["--kill-on-bad-exit=1", "--ntasks-per-node=3", *hostile]]
    exported = (tmp_path / "args.env").read_text()
    assert f"HOMEGPU_RUN_ID={RUN_ID}\n" in exported and "HOMEGPU_JOB=train\n" in exported
    assert "SEED=$HOME 'x' \"y\"\n;z\n" in exported
    assert not (tmp_path / "pwned").exists()


def test_a_variable_name_a_shell_cannot_export_is_refused():
    with pytest.raises(ValueError, match="'A-B' is not a variable name"):
        batch_script(BatchRequest(slurm_job(), RUN_ID, nodes=1, env={"A-B": "1"}), ["true"])


def test_the_job_id_sbatch_printed_is_read_and_anything_else_refused():
    assert submitted_job_id(recorded("sbatch_accepted").output) == "9"
    assert submitted_job_id("12;rec\n") == "12"
    with pytest.raises(ValueError, match="not a job id"):
        submitted_job_id(recorded("sbatch_unknown_partition").output)

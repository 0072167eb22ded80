"""cluster.toml's Slurm keys: scheduler and slurm_login in [cluster], a job's partition, account, qos,
time_limit and gres, each checked as sbatch reads it, normalised, written back, and refused with one located
line where it would do nothing."""

from __future__ import annotations

from dataclasses import replace
from textwrap import dedent

import pytest

from homegpu.remote.config import ConfigError, parse_cluster
from homegpu.remote.config.slurm_keys import format_time_limit, gres_gpus, time_limit_seconds
from homegpu.remote.config.writer import cluster_to_toml

NODES = dedent("""\
    [[nodes]]
    name = "login1"
    host = "login1.lab"

    [[nodes]]
    name = "gpu1"
    host = "gpu1.lab"
    """)
SLURM = '[cluster]\nscheduler = "slurm"\nslurm_login = "login1"\n\n' + NODES


def slurm_job(*lines: str) -> str:
    return SLURM + "\n[jobs.train]\n" + "".join(f"{line}\n" for line in lines)


def refusal(text: str) -> str:
    with pytest.raises(ConfigError) as error:
        parse_cluster(text, "lab.toml")
    message = str(error.value)
    assert "\n" not in message
    return message


def test_a_slurm_cluster_and_its_job_keys_parse():
    spec = parse_cluster(slurm_job('partition = "gpu"', 'account = "vision"', 'qos = "normal"',
                                   'time_limit = "12:00:00"', 'gres = "gpu:rtx4090:2"'))
    job = spec.jobs["train"]
    assert (spec.scheduler, spec.slurm_login, spec.login_only) == ("slurm", "login1", "login1")
    assert spec.slurm_login_node().host == "login1.lab"
    assert (job.partition, job.account, job.qos, job.time_limit, job.gres) == (
        "gpu", "vision", "normal", "12:00:00", "gpu:rtx4090:2")


def test_homegpu_is_the_default_scheduler_and_the_slurm_keys_stay_empty():
    spec = parse_cluster(NODES + "\n[jobs.train]\n")
    job = spec.jobs["train"]
    assert (spec.scheduler, spec.slurm_login, spec.login_only) == ("homegpu", "", "")
    assert (job.partition, job.account, job.qos, job.time_limit, job.gres) == ("", "", "", "", "")


def test_a_login_that_is_an_ssh_alias_names_no_node():
    spec = parse_cluster(SLURM.replace('"login1"', '"hpc-login"', 1))
    assert spec.slurm_login == "hpc-login" and spec.slurm_login_node() is None


@pytest.mark.parametrize("written, normalised", [
    ("90", "1:30:00"), ("30", "30:00"), ("5:30", "5:30"), ("2:00:00", "2:00:00"), ("48:00:00", "2-00:00:00"),
    ("1-12", "1-12:00:00"), ("1-12:30", "1-12:30:00"), ("3-00:00:05", "3-00:00:05"), ("0:45", "0:45"),
])
def test_time_limits_in_each_of_slurms_forms_are_kept_as_slurm_prints_them(written, normalised):
    assert parse_cluster(slurm_job(f'time_limit = "{written}"')).jobs["train"].time_limit == normalised


@pytest.mark.parametrize("text", ["1:2:3:4", "1-24", "1-2:60", "10:60", "2:60:00", "1h", "", "-5", "UNLIMITED",
                                  "1 - 2", "1-2:3:4:5"])
def test_a_time_that_is_none_of_slurms_forms_is_not_read(text):
    assert time_limit_seconds(text) is None


def test_seconds_are_printed_as_squeue_prints_a_limit():
    assert [format_time_limit(s) for s in (59, 1800, 7200, 86400, 90061)] == [
        "0:59", "30:00", "2:00:00", "1-00:00:00", "1-01:01:01"]


@pytest.mark.parametrize("gres, gpus", [("gpu:1", 1), ("gpu", 1), ("gpu:rtx4090:2", 2), ("gpu:a100", 1),
                                        ("gpu:2,mps:100", 2), ("", 0), ("mps:50", 0)])
def test_the_gpus_a_gres_asks_for_per_node(gres, gpus):
    assert gres_gpus(gres) == gpus


@pytest.mark.parametrize("line, expected", [
    ('time_limit = "1:2:3:4"', 'lab.toml:14: [jobs.train].time_limit: invalid time limit \'1:2:3:4\'; use one of '
                               'Slurm\'s forms: "MM", "MM:SS", "HH:MM:SS", "D-HH", "D-HH:MM" or "D-HH:MM:SS"'),
    ('time_limit = 90', 'lab.toml:14: [jobs.train].time_limit: expected a string, got an integer 90; write it in '
                        'quotes, as sbatch reads it: time_limit = "90" (minutes)'),
    ('time_limit = "0"', "lab.toml:14: [jobs.train].time_limit: '0' is no time; give the run the time it needs, or "
                         "leave time_limit out for the partition's default"),
    ('time_limit = "400-00"', "lab.toml:14: [jobs.train].time_limit: '400-00' is more than a year"),
    ('gres = "gpu:0"', "lab.toml:14: [jobs.train].gres: invalid gres 'gpu:0'; write it as sbatch --gres takes it"),
    ('gres = "gpu;rm -rf"', "lab.toml:14: [jobs.train].gres: invalid gres 'gpu;rm -rf'"),
    ('partition = "--all"', "lab.toml:14: [jobs.train].partition: invalid partition '--all'; use the partition's "
                            "name as Slurm lists it, comma-separated for several"),
    ('account = "a b"', "lab.toml:14: [jobs.train].account: invalid account 'a b'"),
    ('qos = ""', "lab.toml:14: [jobs.train].qos: invalid qos ''"),
    ('partion = "gpu"', "lab.toml:14: [jobs.train].partion: unknown key 'partion'; did you mean 'partition'?"),
])
def test_each_slurm_job_key_refuses_what_sbatch_would_not_read(line, expected):
    assert refusal(slurm_job(line)).startswith(expected)


def test_several_partitions_are_a_comma_separated_list():
    assert parse_cluster(slurm_job('partition = "gpu,debug"')).jobs["train"].partition == "gpu,debug"


@pytest.mark.parametrize("key, value", [("partition", '"gpu"'), ("account", '"vision"'), ("qos", '"normal"'),
                                        ("time_limit", '"4:00:00"'), ("gres", '"gpu:1"')])
def test_a_slurm_job_key_on_homegpus_scheduler_is_refused_naming_the_fix(key, value):
    message = refusal(NODES + f"\n[jobs.train]\n{key} = {value}\n")
    assert message == (f"lab.toml:10: [jobs.train].{key}: a Slurm key, but this cluster's jobs run on homegpu's own "
                       f'scheduler; set scheduler = "slurm" and slurm_login in [cluster], or remove {key}')


def test_slurm_without_a_login_is_refused():
    assert refusal('[cluster]\nscheduler = "slurm"\n\n' + NODES) == (
        'lab.toml:2: [cluster].scheduler: "slurm" needs slurm_login, the machine where sbatch runs; add '
        'slurm_login = "NAME" to [cluster]: a [[nodes]] name or an ~/.ssh/config alias')


def test_a_login_without_slurm_is_refused():
    assert refusal('[cluster]\nslurm_login = "login1"\n\n' + NODES) == (
        'lab.toml:2: [cluster].slurm_login: is only used when jobs run through Slurm; set scheduler = "slurm" in '
        '[cluster], or remove slurm_login')


@pytest.mark.parametrize("text, expected", [
    ('scheduler = "pbs"', "lab.toml:2: [cluster].scheduler: unknown scheduler 'pbs'; use \"homegpu\""),
    ('scheduler = "slurm"\nslurm_login = "a;b"', "lab.toml:3: [cluster].slurm_login: 'a;b' contains shell "
                                                  "metacharacters ';'"),
    ('scheduler = "slurm"\nslurm_login = "-oProxyCommand=x"', "lab.toml:3: [cluster].slurm_login: "
                                                               "'-oProxyCommand=x' starts with '-'"),
])
def test_the_cluster_keys_refuse_what_is_not_a_scheduler_or_a_login(text, expected):
    assert refusal(f"[cluster]\n{text}\n\n" + NODES).startswith(expected)


def test_a_slurm_cluster_is_written_back_as_it_was_read():
    spec = parse_cluster(slurm_job('partition = "gpu"', 'time_limit = "90"', 'gres = "gpu:2"'), "cluster.toml")
    again = parse_cluster(cluster_to_toml(spec), "cluster.toml")
    assert again == spec
    assert 'scheduler = "slurm"' in cluster_to_toml(spec) and 'time_limit = "1:30:00"' in cluster_to_toml(spec)


def test_a_slurm_clusters_jobs_run_on_every_node_but_the_login_unless_they_name_theirs():
    """sbatch runs on slurm_login: a job that names no nodes asks Slurm for the others."""
    from homegpu.remote.plan import job_node_specs

    spec = parse_cluster(slurm_job('partition = "gpu"'), "lab.toml")
    login = spec.slurm_login
    assert spec.slurm_login_node() is not None
    assert [node.name for node in job_node_specs(spec, spec.jobs["train"])] == [
        node.name for node in spec.nodes if node.name != login]
    named = replace(spec.jobs["train"], nodes=(login,))
    assert [node.name for node in job_node_specs(spec, named)] == [login]

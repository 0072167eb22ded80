"""`--set KEY=VALUE` (remote/queue/overrides.py): one run's settings applied to a job of a real cluster.toml
parsed by config's own parser, checked by the same validator, every mistake one line naming the --set."""

from __future__ import annotations

import pytest

from homegpu.remote.config import parse_cluster
from homegpu.remote.queue import OverrideError, apply_overrides, parse_value

CLUSTER = parse_cluster('''
[[nodes]]
name = "desktop"
host = "192.168.1.10"
[[nodes]]
name = "closet"
host = "192.168.1.11"

[jobs.train]
nodes = ["desktop", "closet"]
epochs = 10
args = ["--depth", "4"]
env = { TF_CPP_MIN_LOG_LEVEL = "2" }
''', "cluster.toml")
JOB = CLUSTER.jobs["train"]


def test_values_are_toml_and_bare_words_are_strings() -> None:
    assert parse_value("5") == 5
    assert parse_value("0.5") == 0.5
    assert parse_value('["--lr","0.01"]') == ["--lr", "0.01"]
    assert parse_value("resnet") == "resnet"
    assert parse_value("npz:/d/mnist.npz") == "npz:/d/mnist.npz"
    assert parse_value('"quoted"') == "quoted"
    assert parse_value("1\nx = 2") == "1\nx = 2"  # never two values


def test_good_overrides_replace_only_their_keys() -> None:
    run = apply_overrides(CLUSTER, JOB, ["epochs=5", "batch_size=128", 'args=["--lr","0.01"]',
                                         "env.WANDB_MODE=offline", "env.SEED=3", "model=resnet",
                                         "data=npz:/d/mnist.npz", "stall_timeout=600", "balance=even"])
    assert (run.epochs, run.batch_size, run.args, run.model, run.data) == (
        5, 128, ("--lr", "0.01"), "resnet", "npz:/d/mnist.npz")
    assert dict(run.env) == {"TF_CPP_MIN_LOG_LEVEL": "2", "WANDB_MODE": "offline", "SEED": "3"}
    assert run.stall_timeout == 600.0 and isinstance(run.stall_timeout, float) and run.balance == "even"
    assert (run.nodes, run.name, run.steps_per_epoch) == (JOB.nodes, "train", JOB.steps_per_epoch)
    assert apply_overrides(CLUSTER, JOB, []) == JOB
    assert dict(JOB.env) == {"TF_CPP_MIN_LOG_LEVEL": "2"}  # the cluster's job is untouched


@pytest.mark.parametrize("given, message", [
    ("epochs", "--set epochs: expected KEY=VALUE; write it like --set epochs=5"),
    ("=5", "--set =5: expected KEY=VALUE; write it like --set epochs=5"),
    ("epochs=five", "--set epochs=five: expected an integer, got a string 'five'; write it like epochs = 10"),
    ("epochs=0", "--set epochs=0: must be from 1 to 1,000,000, got 0; use a number in that range"),
    ("epoch=5", "--set epoch=5: unknown key 'epoch'; did you mean epochs? keys a run may set: epochs, batch_size, "
                "steps_per_epoch, args, env, data, model, data_dir, restart, max_restarts, stall_timeout, "
                "reconnect_timeout, keras, min_workers, on_fewer_workers, rejoin, checkpoint, balance"),
    ("args=--lr", "--set args=--lr: expected a list, got a string '--lr'; write it like args = [\"--lr\", \"0.01\"]"),
    ("args=[1]", "--set args=[1]: 1 is not a string; write every argument in quotes: args = [\"--lr\", \"0.01\"]"),
    ("model=gpt9", "--set model=gpt9: unknown value 'gpt9'; use one of:"),
    ("env=x", "--set env=x: set one variable at a time; write it like --set env.WANDB_MODE=offline"),
    ("env.1BAD=x", "--set env.1BAD=x: invalid variable name '1BAD'; use letters, digits and _"),
    ("nodes=[\"desktop\"]", "--set nodes=[\"desktop\"]: nodes decides where the job runs and cannot change for one "
                            "run; edit the job in cluster.toml, or add a second [jobs.NAME] with it"),
    ("script=other.py", "--set script=other.py: script decides what code the job runs and cannot change"),
    ("name=x", "--set name=x: name cannot be set; keys a run may set: epochs"),
    ("stall_timeout=inf", "--set stall_timeout=inf: must be from 1 to 604800 seconds (a week), got inf"),
    ("data=dir:/a;rm", "--set data=dir:/a;rm: 'dir:/a;rm' contains shell metacharacters ';'"),
])
def test_a_bad_override_is_one_line_naming_it(given: str, message: str) -> None:
    with pytest.raises(OverrideError) as caught:
        apply_overrides(CLUSTER, JOB, ["batch_size=32", given])
    text = str(caught.value)
    assert text.startswith(message) and "\n" not in text


def test_a_key_set_twice_is_refused() -> None:
    with pytest.raises(OverrideError, match=r"^--set epochs=6: epochs is set twice \(also by --set epochs=5\); "
                                            r"give each key once$"):
        apply_overrides(CLUSTER, JOB, ["epochs=5", "epochs=6"])


SCRIPTED = parse_cluster('''
[[nodes]]
name = "desktop"
host = "192.168.1.10"

[jobs.quick]
nodes = ["desktop"]
script = "code/job.py"
''', "cluster.toml")


@pytest.mark.parametrize("key", ["epochs=3", "batch_size=8", "steps_per_epoch=10", "model=resnet"])
def test_a_script_jobs_run_is_refused_the_trainers_keys_as_cluster_toml_is(key: str) -> None:
    """The same words `homegpu check` says for the key in cluster.toml (config's own check), naming the --set."""
    name = key.split("=")[0]
    with pytest.raises(OverrideError) as refused:
        apply_overrides(SCRIPTED, SCRIPTED.jobs["quick"], ["args=['--fast']", key])
    assert str(refused.value).startswith(
        f"--set {key}: the built-in trainer's key, but this job runs code/job.py, which never sees it; give the "
        f"script its own setting in args (e.g. args = [\"--{name.replace('_', '-')}\", \"...\"]), or remove {name}")
    assert apply_overrides(SCRIPTED, SCRIPTED.jobs["quick"], ["args=['--fast']"]).args == ("--fast",)

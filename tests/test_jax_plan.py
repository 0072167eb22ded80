"""A JAX job before it runs: its framework read from the script, the plan (one kind of device), what each
process is started with, and homegpu as the cluster environment `jax.distributed.initialize()` finds."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from test_pytorch_plan import RTX, TWO_NODES

from homegpu.remote.config.checks import ConfigError
from homegpu.remote.config.cluster_spec import parse_cluster
from homegpu.remote.jobs.launch_plan import worker_launch
from homegpu.remote.plan import DevicePlanError, lay_out
from homegpu.remote.runtimes.base import NodePaths

CLUSTER = TWO_NODES + """[jobs.jx]
framework = "jax"
script = "train.py"
args = ["--epochs", "3"]
"""
REPO = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("script, env, framework", [
    ("import jax\njax.distributed.initialize()\n", None, "jax"),
    ("from jax import distributed\n", None, "jax"),
    ("import jax.distributed\n", None, "jax"),
    ("import os\nos.environ['KERAS_BACKEND'] = 'jax'\nimport keras\n", None, "jax"),  # keras.io's first lines
    ("import keras\n", {"KERAS_BACKEND": "jax"}, "jax"),
    ("import keras\n", None, "tensorflow"),  # Keras 3 on TensorFlow: refused under MWMS, with the JAX way named
    ("import jax\nimport jax.numpy as jnp\n", None, "tensorflow"),  # one machine's JAX: nothing distributed
    ("import tensorflow as tf\nimport jax\njax.distributed.initialize()\n", None, "jax"),  # tf.data feeding JAX
])
def test_a_jobs_framework_unset_is_jax_for_a_distributed_jax_or_keras_on_jax_script(tmp_path, script, env,
                                                                                     framework):
    (tmp_path / "train.py").write_text(script)
    table = '[jobs.mine]\nscript = "train.py"\n' + (f'env = {{ KERAS_BACKEND = "{env["KERAS_BACKEND"]}" }}\n'
                                                    if env else "")
    assert parse_cluster(CLUSTER + table, str(tmp_path / "cluster.toml")).jobs["mine"].framework == framework


def test_the_plan_gives_each_process_its_devices_and_names_the_collective():
    spec = parse_cluster(CLUSTER)
    layout = lay_out(spec, spec.jobs["jx"], {"desktop": RTX, "laptop": RTX[:1]}, need_plan=True)
    assert layout.plan_lines()[:3] == [
        "process 0  desktop  10.0.0.20:23456  GPUs 0,1 RTX 3090",
        "process 1  laptop   10.0.0.30:23456  GPU 0 RTX 3090",
        "jax.distributed: 2 processes, the coordinator on process 0; collectives NCCL (every process has a GPU)",
    ]
    laptop = layout.slots[1]
    assert layout.launch_line(spec.jobs["jx"], laptop) == (
        "JAX_COORDINATOR_ADDRESS=10.0.0.20:23456 HOMEGPU_JAX_PROCESS_COUNT=2 HOMEGPU_JAX_PROCESS_ID=1 "
        "python train.py --epochs 3")
    cpu_only = lay_out(spec, spec.jobs["jx"], {"desktop": [], "laptop": []}, need_plan=True)
    assert "collectives gloo (every process runs on CPU)" in cpu_only.plan_lines()[2]


def test_a_plan_mixing_gpu_and_cpu_processes_is_refused_naming_the_cpu_node():
    spec = parse_cluster(CLUSTER)
    layout = lay_out(spec, spec.jobs["jx"], {"desktop": RTX, "laptop": []}, need_plan=True)
    assert layout.plan is None
    assert layout.refusal == ("job jx: node laptop: it has no GPU and the others do, and a JAX computation runs on "
                              "one kind of device: leave it out with nodes = [...] in the job")


def test_each_process_is_started_with_what_jax_and_keras_read():
    spec = parse_cluster(CLUSTER.replace('args = ["--epochs", "3"]', 'env = { KERAS_BACKEND = "torch" }'))
    job = spec.jobs["jx"]
    layout = lay_out(spec, job, {"desktop": [], "laptop": []}, need_plan=True)

    class Runtime:  # the two things worker_launch asks of a runtime, as ProcessRuntime answers them
        def worker_paths(self, run_id, label, code_dir, data_dir, python):
            return NodePaths(python="python3", code_dir=code_dir, output_dir=f"/out/{label}", data_dir=data_dir)

        def out_dir(self, run_id, label):
            return f"/out/{label}"

        def device_env(self, plan, devices):
            return {}

    launch = worker_launch(job, "jx-1", 1, layout.slots, layout.slots[1], Runtime(), "/code", layout.plan,
                           "train.py")
    assert launch.argv == ("python3", "-m", "homegpu.trainer.user_script", "/code/train.py")
    assert launch.tf_config == ""
    assert {key: launch.env[key] for key in launch.env if key.startswith(("JAX_", "HOMEGPU_JAX", "KERAS_"))} == {
        "JAX_COORDINATOR_ADDRESS": "10.0.0.20:23456", "HOMEGPU_JAX_PROCESS_COUNT": "2",
        "HOMEGPU_JAX_PROCESS_ID": "1", "HOMEGPU_JAX_ADDRESS": "10.0.0.30",
        "KERAS_DISTRIBUTION_JOB_ADDRESSES": "10.0.0.20:23456", "KERAS_DISTRIBUTION_NUM_PROCESSES": "2",
        "KERAS_DISTRIBUTION_PROCESS_ID": "1",
        "KERAS_BACKEND": "torch",  # the job's env wins over the JAX job's default
    }
    assert "TF_USE_LEGACY_KERAS" not in launch.env


@pytest.mark.parametrize("table, words", [
    ('framework = "jax"\nmodel = "resnet"\n', "the built-in TensorFlow trainer's key: the JAX demo trains"),
    ('framework = "jax"\nscript = "x.py"\nkeras = "tf-keras"\n', "tf-keras runs on TensorFlow, and this is a JAX job"),
])
def test_what_a_jax_job_cannot_be_is_one_line(table, words):
    with pytest.raises(ConfigError) as caught:
        parse_cluster(CLUSTER + "[jobs.bad]\n" + table)
    assert words in str(caught.value) and "\n" not in str(caught.value)


SCRIPT = """
import jax
jax.distributed.initialize()
from jax.experimental import multihost_utils
import jax.numpy as jnp
total = multihost_utils.process_allgather(jnp.array([jax.process_index() + 1.0])).sum()
print("joined", jax.process_index(), jax.process_count(), float(total), flush=True)
"""


def test_a_script_calling_initialize_with_no_arguments_joins_through_homegpus_cluster_environment(jax, tmp_path):
    """Two processes started as homegpu starts them (user_script.py, homegpu's variables, no arguments to
    initialize()): JAX finds the count and id itself, and the variables of a Slurm allocation around them (five
    tasks) do not answer for them (with homegpu's environment last, they wait for five processes: tried)."""
    (tmp_path / "train.py").write_text(SCRIPT)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {**os.environ, "JAX_COORDINATOR_ADDRESS": f"127.0.0.1:{port}", "HOMEGPU_JAX_PROCESS_COUNT": "2",
           "HOMEGPU_JAX_ADDRESS": "127.0.0.1", "PYTHONPATH": str(REPO.parent),
           "SLURM_JOB_ID": "7", "SLURM_NTASKS": "5", "SLURM_PROCID": "3", "SLURM_LOCALID": "0",
           "SLURM_STEP_NODELIST": "gpu[1-5]"}
    processes = [subprocess.Popen([sys.executable, "-m", "homegpu.trainer.user_script", "train.py"], cwd=tmp_path,
                                  env={**env, "HOMEGPU_JAX_PROCESS_ID": str(index)}, stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True) for index in (0, 1)]
    try:
        outputs = [process.communicate(timeout=60)[0] for process in processes]
    finally:
        for process in processes:
            process.kill()
    joined = sorted(line for output in outputs for line in output.splitlines() if line.startswith("joined"))
    assert joined == ["joined 0 2 3.0", "joined 1 2 3.0"], outputs


def test_the_jax_extra_the_image_and_the_test_image_bring_jax_alike():
    """Preflight refuses nodes whose jax versions differ: the JAX image pins the test image's jax, and the
    [jax] extra and the install a node is told to run both bring jax."""
    import tomllib

    from images import JAX_PACKAGES

    from homegpu.remote.runtimes.framework_needs import JAX

    extra = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]["jax"]
    assert any(need.startswith("jax>=") for need in extra) and "jax" in JAX.packages.split()
    (install,) = [line for line in (REPO / "assets" / "jax.Dockerfile").read_text().splitlines()
                  if line.startswith("RUN") and "pip install" in line]
    assert JAX_PACKAGES[0] in install.split(), install  # jax==0.10.2 in both

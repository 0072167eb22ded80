"""A PyTorch job's plan, with no node involved: one torchrun per node, a process per GPU (one on a CPU),
the backend every process can use, and the torchrun each node runs."""

from __future__ import annotations

import os
import re
import sys
import tomllib
from pathlib import Path

import pytest
from images import TORCH_PACKAGES

from homegpu.remote.config.cluster_spec import parse_cluster
from homegpu.remote.config.checks import ConfigError
from homegpu.remote.jobs.launch_plan import torch_program
from homegpu.remote.plan import lay_out
from homegpu.remote.runtimes import NodePaths
from homegpu.remote.runtimes.framework_needs import TORCH, version_mismatch

NODE_INSTALL = TORCH.packages

TWO_NODES = """
[[nodes]]
name = "desktop"
host = "desktop"
address = "10.0.0.20"
[[nodes]]
name = "laptop"
host = "laptop"
address = "10.0.0.30"
"""
CLUSTER = TWO_NODES + """[jobs.ddp]
framework = "pytorch"
script = "multinode.py"
args = ["50", "10"]
port = 29500
"""
RTX = [(0, "NVIDIA GeForce RTX 3090"), (1, "NVIDIA GeForce RTX 3090")]


def test_each_node_runs_a_process_per_gpu_and_one_cpu_process_makes_it_gloo():
    spec = parse_cluster(CLUSTER)
    layout = lay_out(spec, spec.jobs["ddp"], {"desktop": RTX, "laptop": []}, need_plan=True)
    assert [slot.label for slot in layout.slots] == ["desktop", "laptop"]
    assert layout.plan_lines() == [
        "node 0  desktop  10.0.0.20:29500  GPUs 0,1 RTX 3090: 2 processes",
        "node 1  laptop   10.0.0.30:29500  CPU: 1 process",
        "torchrun on each node; WORLD_SIZE 3, backend gloo (a process runs on CPU)",
        'laptop (CPU) would run at about 5% of the GPU processes\' pace: leave it out with nodes = ["desktop"] '
        "(the job would train 13.3× as fast on 2 processes)",
    ]
    desktop, laptop = layout.slots
    assert layout.launch_line(spec.jobs["ddp"], laptop) == (
        "torchrun --nnodes=2 --nproc-per-node=1 --node-rank=1 --master-addr=10.0.0.20 --master-port=29500 "
        "multinode.py 50 10")
    assert "--nproc-per-node=2 --node-rank=0" in layout.launch_line(spec.jobs["ddp"], desktop)


def test_every_process_on_a_gpu_is_nccl():
    spec = parse_cluster(CLUSTER)
    layout = lay_out(spec, spec.jobs["ddp"], {"desktop": RTX, "laptop": RTX[:1]}, need_plan=True)
    assert layout.plan_lines()[-1] == "torchrun on each node; WORLD_SIZE 3, backend nccl (every process has a GPU)"


def test_the_pace_is_weighed_per_process_since_ddp_gives_each_the_same_share():
    """DDP waits for its slowest process each step: a GTX 1060 beside two RTX 3090s is pointed out while it still
    helps, per process (3 processes at the 1060's pace beat 2 at the 3090s' only when it runs above 2/3 of them)."""
    spec = parse_cluster(CLUSTER)
    slow = [(0, "NVIDIA GeForce RTX 2080 Ti")]
    lines = lay_out(spec, spec.jobs["ddp"], {"desktop": RTX, "laptop": slow}, need_plan=True).plan_lines()
    assert lines[-1] == ("laptop (GPU 0 RTX 2080 Ti) would run at about 70% of the other processes' pace, but with it "
                         "the job still trains 1.05× as fast as the other 2 processes alone")
    older = [(2, "NVIDIA GeForce GTX 1060 6GB")]  # a third, far slower card: the desktop is better left out
    lines = lay_out(spec, spec.jobs["ddp"], {"desktop": RTX + older, "laptop": RTX[:1]}, need_plan=True).plan_lines()
    assert lines[-1] == ("desktop (GPU 2 GTX 1060 6GB) would run at about 15% of the other processes' pace: leave it out "
                         'with nodes = ["laptop"] (the job would train 1.7× as fast on 1 process)')


def test_a_tensorflow_job_still_gets_its_tf_config():
    spec = parse_cluster(CLUSTER + '[jobs.tf]\nnodes = ["laptop"]\n')
    layout = lay_out(spec, spec.jobs["tf"], {"laptop": []}, need_plan=True)
    line = layout.launch_line(spec.jobs["tf"], layout.slots[0])
    assert line.startswith("TF_CONFIG='{\"cluster\": {\"worker\": [\"10.0.0.30:23456\"]}")


@pytest.mark.parametrize("table, words", [
    ('framework = "pytorch"\ndata = "npz:x.npz"\n', "the built-in TensorFlow trainer's key: the PyTorch demo trains"),
    ('framework = "pytorch"\nmodel = "resnet"\n', 'model: unknown value \'resnet\'; use one of: "mlp", "cnn"'),
    ('framework = "pytorch"\nscript = "x.py"\nworkers_per_node = 2\n', "a PyTorch job runs one torchrun per node"),
    ('framework = "mxnet"\n', 'use one of: "tensorflow", "pytorch", "jax"'),
])
def test_what_a_pytorch_job_cannot_be_is_one_line(table, words):
    with pytest.raises(ConfigError) as caught:
        parse_cluster(CLUSTER + "[jobs.bad]\n" + table)
    assert words in str(caught.value) and "\n" not in str(caught.value)


def test_the_pytorch_demos_model_is_the_jobs_the_mlp_unless_it_names_the_cnn():
    """The demo's MLP is latency-bound on a LAN (its all-reduce outlasts its compute); `model = "cnn"` gives it steps
    long enough for unlike machines' shares to pay. The trainer's default ("cnn") must not become the demo's."""
    spec = parse_cluster(TWO_NODES + '[jobs.mlp]\nframework = "pytorch"\n[jobs.cnn]\nframework = "pytorch"\n'
                         'model = "cnn"\n[jobs.tf]\n')
    assert (spec.jobs["mlp"].model, spec.jobs["cnn"].model, spec.jobs["tf"].model) == ("mlp", "cnn", "cnn")
    paths = NodePaths(python="python3", code_dir="/code", output_dir="/out")
    for name in ("mlp", "cnn"):
        assert torch_program(spec.jobs[name], paths, "") == [
            "-m", "homegpu.trainer.torch_demo", "--epochs", "2", "--batch-size", "64", "--output", "/out",
            "--model", name]


NCCL_SCRIPT = """\
import torch
from torch.distributed import init_process_group

def ddp_setup():
    init_process_group(backend="nccl")
"""


def test_a_script_that_names_nccl_is_refused_on_a_plan_with_a_cpu_process(tmp_path):
    from homegpu.remote.jobs.script_check import nccl_calls, nccl_on_cpu_problem

    (tmp_path / "multinode.py").write_text(NCCL_SCRIPT)
    (tmp_path / "cluster.toml").write_text(CLUSTER)
    spec = parse_cluster(CLUSTER, str(tmp_path / "cluster.toml"))
    job = spec.jobs["ddp"]
    mixed = lay_out(spec, job, {"desktop": RTX, "laptop": []}, need_plan=True).plan
    problem = nccl_on_cpu_problem(job, spec.source, mixed)
    assert problem.startswith(f"{tmp_path}/multinode.py:5: `init_process_group(backend='nccl')` needs a GPU in "
                              "every process, but laptop has none"), problem
    assert "nodes = [...] in [jobs.ddp]" in problem and "\n" not in problem
    every_gpu = lay_out(spec, job, {"desktop": RTX, "laptop": RTX[:1]}, need_plan=True).plan
    assert nccl_on_cpu_problem(job, spec.source, every_gpu) == ""
    assert nccl_calls('import torch.distributed as dist\ndist.init_process_group("nccl", rank=0)\n') == [
        (2, "dist.init_process_group('nccl', rank=0)")]
    assert nccl_calls('init_process_group(backend="nccl" if torch.cuda.is_available() else "gloo")') == []


@pytest.mark.parametrize("script, framework", [
    ("import torch\nfrom torch.distributed import init_process_group\n", "pytorch"),
    ("import torch\ntorch.distributed.init_process_group('gloo')\n", "pytorch"),
    ("from torch.nn.parallel import DistributedDataParallel as DDP\n", "pytorch"),
    ("import torch\nimport tensorflow as tf\nfrom torch.distributed import init_process_group\n", "tensorflow"),
    ("import torch\nprint(torch.ones(2))\n", "tensorflow"),  # torch alone is no multi-node job
    ("import tensorflow as tf\n", "tensorflow"),
    ("def broken(:\n", "tensorflow"),
])
def test_a_jobs_framework_unset_is_read_from_its_scripts_imports(tmp_path, script, framework):
    (tmp_path / "train.py").write_text(script)
    text = CLUSTER + '[jobs.mine]\nscript = "train.py"\n'
    assert parse_cluster(text, str(tmp_path / "cluster.toml")).jobs["mine"].framework == framework
    explicit = parse_cluster(text + 'framework = "tensorflow"\n', str(tmp_path / "cluster.toml"))
    assert explicit.jobs["mine"].framework == "tensorflow"  # said in the table: never guessed over


def test_nodes_with_different_torch_versions_are_named_once():
    versions = {"desktop": "2.14.1+cu130", "laptop": "2.13.0", "closet": ""}
    assert version_mismatch(TORCH, "desktop", versions) == [
        "torch differs between the nodes (2.14.1+cu130 on desktop, 2.13.0 on laptop): DDP's processes must run one "
        "version; install the same torch on every node (python -m pip install torch==2.14.1)"]
    assert version_mismatch(TORCH, "laptop", versions) == []  # said once, by the first node
    assert version_mismatch(TORCH, "desktop", {"desktop": "2.14.1", "laptop": "2.14.1"}) == []


def test_torchrun_runs_on_the_interface_that_holds_the_nodes_address(monkeypatch):
    """homegpu.trainer.torchrun points gloo and NCCL at the interface of the address it is given (here the
    loopback's), keeps what the job's env set, and hands torchrun its own arguments."""
    from homegpu.trainer import torchrun
    ran = {}
    monkeypatch.setattr(torchrun.runpy, "run_module", lambda name, **_: ran.update(module=name, argv=list(sys.argv)))
    monkeypatch.delenv("GLOO_SOCKET_IFNAME", raising=False)
    monkeypatch.setenv("NCCL_SOCKET_IFNAME", "eth7")  # the job's env said so
    monkeypatch.setattr(sys, "argv", ["x"])
    torchrun.main(["--address", "127.0.0.1", "--nnodes=2", "train.py", "--epochs", "3"])
    assert ran == {"module": "torch.distributed.run", "argv": ["torchrun", "--nnodes=2", "train.py", "--epochs", "3"]}
    assert (os.environ["GLOO_SOCKET_IFNAME"], os.environ["NCCL_SOCKET_IFNAME"]) == ("lo", "eth7")
    assert torchrun.interface_of("192.0.2.77") is None  # TEST-NET-1: on no interface here


def test_a_run_records_only_the_settings_that_apply_to_its_job():
    """run.json and the report show a job's settings: not the TensorFlow trainer's model for the PyTorch demo,
    nor a trainer's epochs for a script (its schedule is in its args), nor TensorFlow's layout for torchrun."""
    spec = parse_cluster(CLUSTER + '[jobs.demo]\nframework = "pytorch"\nepochs = 3\n'
                                   '[jobs.tf]\nepochs = 4\n[jobs.mine]\nscript = "train.py"\nkeras = "tf-keras"\n')
    script, demo, trainer, tf_script = (spec.jobs[name].settings() for name in ("ddp", "demo", "tf", "mine"))
    assert list(script["args"]) == ["50", "10"] and script["framework"] == "pytorch"
    assert not {"model", "data", "epochs", "batch_size", "workers_per_node", "share_gpus", "keras"} & script.keys()
    assert (demo["epochs"], demo["batch_size"]) == (3, 64) and not {"model", "data", "workers_per_node"} & demo.keys()
    assert (trainer["model"], trainer["epochs"], trainer["workers_per_node"]) == ("cnn", 4, 1) and "keras" not in trainer
    assert tf_script["keras"] == "tf-keras" and not {"model", "epochs"} & tf_script.keys()


def test_every_install_of_torch_brings_numpy():
    """torch's wheel leaves NumPy out, and without it every process of a run warns "Failed to initialize NumPy":
    the [pytorch] extra, the PyTorch image, the test image and the install a node is told to run all bring it."""
    root = Path(__file__).resolve().parent.parent
    extra = tomllib.loads((root / "pyproject.toml").read_text())["project"]["optional-dependencies"]["pytorch"]
    assert {re.split(r"[<>=!~ \[]", need)[0] for need in extra} >= {"torch", "numpy"}
    (install,) = [line for line in (root / "assets" / "pytorch.Dockerfile").read_text().splitlines()
                  if "pip install" in line]
    assert "torch==" in install and " numpy" in install.split("pip install", 1)[1]
    assert {package.split("==")[0] for package in TORCH_PACKAGES} >= {"torch", "numpy"}
    assert "numpy" in NODE_INSTALL.split() and "torch" in NODE_INSTALL.split()

"""Pure planning: TF_CONFIG layout, worker command lines, exit meanings, stragglers."""

from __future__ import annotations

import json

import pytest

from homegpu.remote.config.cluster_spec import parse_cluster
from homegpu.remote.config.job_spec import JobSpec
from homegpu.remote.jobs.launch_plan import (
    classify_exit, new_run_id, worker_argv, worker_cwd, worker_env, worker_launch,
)
from homegpu.remote.nodes.connect import peer_address, trust_command
from homegpu.remote.plan.device_plan import DevicePlanError, container_env, docker_device_ids
from homegpu.remote.plan.tfconfig import (
    JobConfigError, find_job, job_device_plan, machine_key, plan_counts, tf_config, worker_slots,
)
from homegpu.remote.record.experiment import find_stragglers
from homegpu.remote.runtimes.base import NodePaths, WorkerLaunch
from homegpu.remote.runtimes.docker_runtime import container_args

CLUSTER = """
[[nodes]]
name = "desktop"
host = "192.168.1.20"
address = "10.0.0.20"
[[nodes]]
name = "closet"
host = "closet"
address = "10.0.0.30"
[[nodes]]
name = "laptop"
host = "laptop"
[jobs.all]
[jobs.two]
nodes = ["laptop", "desktop"]
port = 30000
[jobs.multi]
nodes = ["desktop"]
workers_per_node = 2
"""


def test_workers_follow_the_jobs_nodes_list_and_the_first_listed_is_chief():
    """README: `nodes` lists where workers run in TF_CONFIG order, the first is the chief (here laptop,
    although desktop comes first in the file); without `nodes`, the file's order."""
    spec = parse_cluster(CLUSTER)
    slots = worker_slots(spec, spec.jobs["two"])
    assert [(s.index, s.label, s.endpoint, s.is_chief) for s in slots] == [
        (0, "laptop", "laptop:30000", True), (1, "desktop", "10.0.0.20:30000", False)]
    config = tf_config(slots, 1)
    assert config == {"cluster": {"worker": ["laptop:30000", "10.0.0.20:30000"]},
                      "task": {"type": "worker", "index": 1}}
    json.dumps(config)
    assert [s.label for s in worker_slots(spec, spec.jobs["all"])] == ["desktop", "closet", "laptop"]


def test_workers_on_one_machine_get_consecutive_ports():
    spec = parse_cluster(CLUSTER)
    slots = worker_slots(spec, spec.jobs["multi"])
    assert [(s.label, s.endpoint) for s in slots] == [("desktop", "10.0.0.20:23456"), ("desktop#1", "10.0.0.20:23457")]
    loopback = parse_cluster('[[nodes]]\nname="a"\nhost="127.0.0.2"\n[[nodes]]\nname="b"\nhost="127.0.0.3"\n[jobs.j]\n')
    assert [s.port for s in worker_slots(loopback, loopback.jobs["j"])] == [23456, 23457]


def test_resolved_addresses_name_the_workers_and_an_unresolved_node_keeps_its_host():
    spec = parse_cluster(CLUSTER)
    resolved = {"desktop": "10.0.0.20", "laptop": "192.168.1.31"}  # laptop: where ssh reached the alias
    assert [s.endpoint for s in worker_slots(spec, spec.jobs["two"], resolved)] == [
        "192.168.1.31:30000", "10.0.0.20:30000"]
    assert [s.endpoint for s in worker_slots(spec, spec.jobs["two"], {"desktop": "10.0.0.20"})] == [
        "laptop:30000", "10.0.0.20:30000"]
    # Two aliases that reached this machine's loopback are one machine: consecutive ports.
    both_here = {"desktop": "127.0.0.1", "laptop": "127.0.0.1"}
    assert [s.port for s in worker_slots(spec, spec.jobs["two"], both_here)] == [30000, 30001]


@pytest.mark.parametrize("peername, address", [
    (("192.168.1.20", 22), "192.168.1.20"), (("fe80::1%eth0", 22, 0, 2), "fe80::1"),
    (None, None), (("", 0), None), ("not a tuple", None)])
def test_peer_address_is_the_ip_the_ssh_connection_reached(peername, address):
    assert peer_address(peername) == address


@pytest.mark.parametrize("address, key", [("127.0.0.5", "loopback"), ("::1", "loopback"),
                                          ("10.0.0.2", "10.0.0.2"), ("box.local", "box.local")])
def test_machine_key(address, key):
    assert machine_key(address) == key


def test_find_job_explains_what_is_missing():
    spec = parse_cluster(CLUSTER)
    assert find_job(spec, "all").name == "all"
    with pytest.raises(JobConfigError, match="several jobs"):
        find_job(spec, None)
    with pytest.raises(JobConfigError, match="no job named 'x'.*all, two, multi"):
        find_job(spec, "x")


def test_trainer_and_script_command_lines():
    paths = NodePaths(python="/opt/py", code_dir="/w/code/j", output_dir="/w/runs/r/out/n", data_dir="/data")
    trainer = JobSpec(name="j", data="npz:mnist.npz", epochs=3, batch_size=16, steps_per_epoch=7)
    assert worker_argv(trainer, paths) == (
        "/opt/py", "-m", "homegpu.trainer", "--data", "npz:/data/mnist.npz", "--model", "cnn", "--epochs", "3",
        "--batch-size", "16", "--output", "/w/runs/r/out/n", "--steps-per-epoch", "7")
    env = worker_env(trainer, paths)
    assert env["PYTHONPATH"] == "/w/code/j/_homegpu" and env["TF_USE_LEGACY_KERAS"] == "1"
    script = JobSpec(name="j", script="my/train.py", args=("--lr", "0.1"), env={"A": "1"})
    assert worker_argv(script, paths, "sub/train.py") == (
        "/opt/py", "-m", "homegpu.trainer.user_script", "/w/code/j/sub/train.py", "--lr", "0.1")
    env = worker_env(script, paths)
    assert env["A"] == "1" and env["PYTHONPATH"] == "/w/code/j/_homegpu" and "HOMEGPU_KERAS" not in env
    assert worker_cwd(paths) == "/w/runs/r/out/n"


def test_a_scripts_keras_choice_and_pythonpath_reach_its_workers():
    """The shipped package comes first on PYTHONPATH, the job's own entries after it (user_script.py hands the
    script the job's own back); keras = "tf-keras" reaches the worker as HOMEGPU_KERAS."""
    paths = NodePaths(python="/opt/py", code_dir="/w/code/j", output_dir="/w/out")
    job = JobSpec(name="j", script="train.py", keras="tf-keras", env={"PYTHONPATH": "/opt/libs"})
    env = worker_env(job, paths)
    assert env["PYTHONPATH"] == "/w/code/j/_homegpu:/opt/libs" and env["HOMEGPU_KERAS"] == "tf-keras"
    assert "HOMEGPU_KERAS" not in worker_env(JobSpec(name="j", keras="tf-keras"), paths)  # the trainer has tf-keras


@pytest.mark.parametrize("status, words", [
    (0, "succeeded"), (1, "failed (exit 1)"), (-9, "SIGKILL"), (-15, "SIGTERM"), (137, "out of memory"),
    (143, "SIGTERM"), (127, "not found"), (None, "vanished"), (-11, "SIGSEGV"),
])
def test_exit_meanings(status, words):
    assert words in classify_exit(status)


def test_stragglers_are_clearly_slower_than_the_others():
    assert find_stragglers({"a": 1000, "b": 950, "c": 400}) == [("c", 975.0)]
    assert find_stragglers({"a": 1000, "b": 700}) == []
    assert find_stragglers({"a": 1000}) == []


def test_run_ids_are_unique_and_name_the_job():
    first, second = new_run_id("demo", 0), new_run_id("demo", 0)
    assert first.startswith("demo-") and first != second


def test_per_node_worker_counts_lay_out_slots_and_ports():
    spec = parse_cluster(CLUSTER)
    job = JobSpec(name="mixed", nodes=("desktop", "closet", "laptop"), workers_per_node="per-gpu", port=30000)
    slots = worker_slots(spec, job, {"closet": "10.0.0.20"}, counts={"desktop": 2, "closet": 1, "laptop": 3})
    assert [(s.index, s.label, s.endpoint) for s in slots] == [
        (0, "desktop", "10.0.0.20:30000"), (1, "desktop#1", "10.0.0.20:30001"),
        (2, "closet", "10.0.0.20:30002"),  # the same machine as desktop: its ports go on counting
        (3, "laptop", "laptop:30000"), (4, "laptop#1", "laptop:30001"), (5, "laptop#2", "laptop:30002")]
    # Without counts: a numeric workers_per_node, and one worker per node for "per-gpu" (GPUs unknown).
    assert [s.label for s in worker_slots(spec, job)] == ["desktop", "closet", "laptop"]
    assert [s.label for s in worker_slots(spec, spec.jobs["multi"], counts={})] == ["desktop", "desktop#1"]


def test_the_device_plan_decides_the_slots_and_shows_their_addresses():
    spec = parse_cluster(CLUSTER)
    job = JobSpec(name="mixed", nodes=("desktop", "laptop"), workers_per_node="per-gpu", batch_size=32)
    gpus = {"desktop": [(0, "NVIDIA GeForce RTX 3090"), (1, "NVIDIA GeForce RTX 3090")], "laptop": []}
    plan = job_device_plan(spec, job, gpus)
    assert plan_counts(plan) == {"desktop": 2, "laptop": 1}
    slots = worker_slots(spec, job, counts=plan_counts(plan))
    assert [s.label for s in slots] == [w.label for w in plan.workers] == ["desktop", "desktop#1", "laptop"]
    lines = plan.lines([s.endpoint for s in slots])
    assert lines[:4] == ["worker 0  desktop    10.0.0.20:23456  GPU 0 RTX 3090",
                         "worker 1  desktop#1  10.0.0.20:23457  GPU 1 RTX 3090",
                         "worker 2  laptop     laptop:23456     CPU",
                         "collective RING (a worker runs on CPU)"]
    assert lines[4] == "batch 32 per worker × 3 workers = 96 global, 32 per replica on 3 replicas"
    with pytest.raises(DevicePlanError, match="node laptop: its GPUs are not known"):
        job_device_plan(spec, job, {"desktop": gpus["desktop"]})
    two = JobSpec(name="two", nodes=("desktop", "laptop"), workers_per_node=1)
    with pytest.raises(DevicePlanError, match=r"node desktop: its workers would have 2 replicas"):
        job_device_plan(spec, two, gpus)


def test_containers_get_exactly_their_planned_gpus():
    spec = parse_cluster(CLUSTER)
    job = JobSpec(name="mixed", nodes=("desktop", "laptop"), workers_per_node="per-gpu")
    plan = job_device_plan(spec, job, {"desktop": [(0, "A"), (1, "B")], "laptop": []})
    slots = worker_slots(spec, job, counts=plan_counts(plan))

    def args(index: int, device_ids, gpus: bool = True) -> dict:
        launch = WorkerLaunch(job="mixed", run_id="r", generation=1, slot=slots[index], tf_config="{}",
                              argv=("python3",), cwd="/", python="python3", code_dir="/c", output_dir="/o",
                              env=container_env(plan, plan.workers[index]), image="img", device_ids=device_ids)
        return container_args(launch, code_dir="/c", out_dir="/o", data_dir="", gpus=gpus)

    second = args(1, tuple(docker_device_ids(plan.workers[1])))
    (request,) = second["device_requests"]
    assert request["DeviceIDs"] == ["1"] and request["Capabilities"] == [["gpu"]] and not request["Count"]
    assert second["environment"]["HOMEGPU_COLLECTIVE"] == "RING"
    assert "CUDA_VISIBLE_DEVICES" not in second["environment"]  # the request renumbers its GPU to 0 inside
    cpu = args(2, tuple(docker_device_ids(plan.workers[2])))  # a CPU worker, even on a node with GPUs
    assert "device_requests" not in cpu and cpu["environment"]["CUDA_VISIBLE_DEVICES"] == "-1"
    (every,) = args(0, None)["device_requests"]  # no plan: every GPU of the node, as before
    assert every["Count"] == -1


def test_the_trust_hint_names_the_cluster_file_only_when_it_is_not_the_default_here(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    here = parse_cluster(CLUSTER, file=str(tmp_path / "cluster.toml"))
    elsewhere = parse_cluster(CLUSTER, file=str(tmp_path / "lab" / "cluster.toml"))
    assert trust_command(here, here.nodes[0]) == f"homegpu trust {here.nodes[0].name}"
    assert trust_command(elsewhere, elsewhere.nodes[0]) == \
        f"homegpu --config {tmp_path / 'lab' / 'cluster.toml'} trust {elsewhere.nodes[0].name}"


def test_one_layout_for_every_caller_silent_nodes_and_refusals():
    """lay_out is what the run, `jobs`/`logs`/`stop`, the launch dialog and `tfconfig` all use."""
    from homegpu.remote.plan.layout import lay_out

    spec = parse_cluster('[[nodes]]\nname = "box"\nhost = "10.0.0.2"\n[[nodes]]\nname = "laptop"\nhost = "10.0.0.3"\n'
                         '[jobs.mixed]\nworkers_per_node = "per-gpu"\n[jobs.two]\nworkers_per_node = 2\n')
    gpus = {"box": [(0, "NVIDIA GeForce RTX 3090"), (1, "NVIDIA GeForce RTX 3090")], "laptop": []}
    planned = lay_out(spec, spec.jobs["mixed"], gpus, {"box": "192.168.1.2"})
    assert [s.label for s in planned.slots] == ["box", "box#1", "laptop"] and planned.plan is not None
    assert planned.slots[1].endpoint == "192.168.1.2:23457" and not planned.silent and not planned.refusal
    waiting = lay_out(spec, spec.jobs["mixed"], {"box": gpus["box"]})
    assert waiting.plan is None and waiting.silent == ("laptop",) and not waiting.refusal
    assert [s.label for s in waiting.slots] == ["box", "laptop"]
    launching = lay_out(spec, spec.jobs["mixed"], {"box": gpus["box"]}, need_plan=True)
    assert "laptop" in launching.refusal and "GPUs are not known" in launching.refusal
    refused = lay_out(spec, spec.jobs["two"], {"box": [(0, "NVIDIA GeForce RTX 3090")], "laptop": []})
    assert refused.plan is None and refused.refusal.startswith("job two: node box: 2 workers for 1 GPU")
    assert refused.plan_lines() == [f"launch would be refused: {refused.refusal}"]


def test_the_balance_choice_and_the_first_shares_reach_the_workers():
    """balance reaches every worker as HOMEGPU_BALANCE; the shares a run starts with as HOMEGPU_SHARES, only where
    the job balances by speed."""
    paths = NodePaths(python="/opt/py", code_dir="/w/code/j", output_dir="/w/out")
    assert worker_env(JobSpec(name="j"), paths)["HOMEGPU_BALANCE"] == "speed"
    assert worker_env(JobSpec(name="j", balance="even"), paths)["HOMEGPU_BALANCE"] == "even"

    class Here:  # the runtime's part worker_launch asks
        def worker_paths(self, *args):
            return paths

        def out_dir(self, run_id, label):
            return paths.output_dir

    cluster = parse_cluster(CLUSTER, "cluster.toml")
    slots = worker_slots(cluster, cluster.jobs["two"])
    launch = worker_launch(JobSpec(name="j"), "r", 0, slots, slots[0], Here(), "/w/code/j", None, "", (422, 90))
    assert launch.env["HOMEGPU_SHARES"] == "422,90"
    even = worker_launch(JobSpec(name="j", balance="even"), "r", 0, slots, slots[0], Here(), "/w/code/j", None, "",
                         (422, 90))
    assert "HOMEGPU_SHARES" not in even.env
    assert "HOMEGPU_SHARES" not in worker_launch(JobSpec(name="j"), "r", 0, slots, slots[0], Here(), "/w/code/j",
                                                 None, "").env

"""The device plan: which GPUs each worker gets, the collective, the batch and the pace advice.

Pure tables. The GPU inventories are the nodes' stats as the agent streams them; where a test reads
NodeStats it parses lines recorded on real GPUs (tests/fixtures/gpu/README.md).
"""

from __future__ import annotations

import pytest

from homegpu.remote.node_side.agent.smi_parse import parse_nvidia_smi_gpus
from homegpu.remote.nodes.stats import parse_agent_line
from homegpu.remote.plan.device_plan import (
    NCCL,
    RING,
    DevicePlanError,
    Gpu,
    WorkerDevices,
    container_env,
    docker_device_ids,
    gpu_inventory,
    plan_devices,
    process_env,
)
from homegpu.remote.plan.gpu_speed import CPU_SPEED, UNKNOWN_GPU_SPEED, gpu_model, gpu_speed, short_gpu_name
from homegpu.remote.plan.pace import advise_pace, job_pace, worker_speed
from gpu_replay import FIXTURES

RTX3090 = "NVIDIA GeForce RTX 3090"
RTX2080 = "NVIDIA GeForce RTX 2080 SUPER"
ONE_GPU = [(0, RTX3090)]
TWO_GPUS = [(0, RTX3090), (1, RTX3090)]
FOUR_GPUS = [(i, RTX3090) for i in range(4)]
CPU: list = []


def layout(plan) -> list[tuple[str, int, tuple[int, ...]]]:
    """(label, replicas, GPU indices) per worker, in TF_CONFIG order."""
    return [(w.label, w.replicas, w.gpus) for w in plan.workers]


# -- layouts ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("nodes, workers_per_node, share, expected", [
    # per-gpu: a worker per GPU, one CPU worker on a node without GPUs
    ({"box": TWO_GPUS}, "per-gpu", False, [("box", 1, (0,)), ("box#1", 1, (1,))]),
    ({"desk": ONE_GPU}, "per-gpu", False, [("desk", 1, (0,))]),
    ({"laptop": CPU}, "per-gpu", False, [("laptop", 1, ())]),
    ({"box": TWO_GPUS, "desk": ONE_GPU, "laptop": CPU}, "per-gpu", False,
     [("box", 1, (0,)), ("box#1", 1, (1,)), ("desk", 1, (0,)), ("laptop", 1, ())]),
    # integer: the node's GPUs split evenly between its workers
    ({"box": TWO_GPUS}, 1, False, [("box", 2, (0, 1))]),
    ({"box": TWO_GPUS}, 2, False, [("box", 1, (0,)), ("box#1", 1, (1,))]),
    ({"big": FOUR_GPUS}, 2, False, [("big", 2, (0, 1)), ("big#1", 2, (2, 3))]),
    ({"a": TWO_GPUS, "b": TWO_GPUS}, 1, False, [("a", 2, (0, 1)), ("b", 2, (0, 1))]),
    ({"desk": ONE_GPU, "laptop": CPU}, 1, False, [("desk", 1, (0,)), ("laptop", 1, ())]),
    ({"laptop": CPU}, 2, False, [("laptop", 1, ()), ("laptop#1", 1, ())]),
    # sharing a GPU only when the job asks for it
    ({"desk": ONE_GPU}, 2, True, [("desk", 1, (0,)), ("desk#1", 1, (0,))]),
    ({"box": TWO_GPUS}, 3, True, [("box", 1, (0,)), ("box#1", 1, (1,)), ("box#2", 1, (0,))]),
])
def test_layouts(nodes, workers_per_node, share, expected):
    plan = plan_devices(nodes, workers_per_node, 64, share_gpus=share)
    assert layout(plan) == expected
    assert [w.index for w in plan.workers] == list(range(len(expected)))


def test_gpu_indices_come_from_the_inventory_not_the_position():
    """A node whose agent lists GPUs 1 and 3 only (say, CUDA_VISIBLE_DEVICES on the node)."""
    plan = plan_devices({"box": [(1, RTX3090), (3, RTX2080)]}, "per-gpu", 64)
    assert [(w.gpus, w.gpu_names) for w in plan.workers] == [((1,), (RTX3090,)), ((3,), (RTX2080,))]


@pytest.mark.parametrize("nodes, workers_per_node, share, fragments", [
    ({"box": TWO_GPUS, "desk": ONE_GPU}, 1, False,
     ["node box", "2 replicas", "GPUs 0,1 RTX 3090", 'workers_per_node = "per-gpu"']),
    ({"desk": ONE_GPU, "big": FOUR_GPUS}, 2, False,
     ["node desk: 2 workers for 1 GPU would share a GPU", 'workers_per_node = "per-gpu" (or 1)',
      "share_gpus = true"]),
    ({"box": [(0, RTX3090), (1, RTX3090), (2, RTX3090)]}, 2, False,
     ["node box: 3 GPUs do not split evenly between 2 workers", "a divisor of 3"]),
    ({"box": TWO_GPUS, "laptop": CPU}, 1, False, ["node box", "2 replicas", "the others 1"]),
    ({"a": TWO_GPUS, "b": TWO_GPUS, "laptop": CPU}, 1, False, ["node laptop", "1 replica (CPU)", "the others 2"]),
    ({"box": TWO_GPUS, "desk": None}, "per-gpu", False, ["node desk: its GPUs are not known"]),
    ({"box": TWO_GPUS}, 0, False, ['workers_per_node = 0: use "per-gpu" or a positive integer']),
    ({"box": TWO_GPUS}, "per-node", False, ["workers_per_node = 'per-node'"]),
    ({}, 1, False, ["no nodes"]),
])
def test_refusals_are_one_line_naming_node_and_fix(nodes, workers_per_node, share, fragments):
    with pytest.raises(DevicePlanError) as caught:
        plan_devices(nodes, workers_per_node, 64, share_gpus=share)
    message = str(caught.value)
    assert "\n" not in message
    for fragment in fragments:
        assert fragment in message, message


# -- collective ------------------------------------------------------------------------------------

@pytest.mark.parametrize("nodes, workers_per_node, collective", [
    ({"box": TWO_GPUS}, "per-gpu", NCCL),
    ({"box": TWO_GPUS, "desk": ONE_GPU}, "per-gpu", NCCL),
    ({"box": TWO_GPUS, "desk": ONE_GPU, "laptop": CPU}, "per-gpu", RING),
    ({"laptop": CPU}, 2, RING),
    ({"desk": ONE_GPU, "laptop": CPU}, 1, RING),
])
def test_collective_is_nccl_only_when_every_worker_has_a_gpu(nodes, workers_per_node, collective):
    plan = plan_devices(nodes, workers_per_node, 64)
    assert plan.collective == collective
    assert all(process_env(plan, w)["HOMEGPU_COLLECTIVE"] == collective for w in plan.workers)
    assert any(line.startswith(f"collective {collective}") for line in plan.lines())


# -- what each worker is given ----------------------------------------------------------------------

def test_process_env_shows_each_worker_exactly_its_gpus():
    plan = plan_devices({"big": FOUR_GPUS, "laptop": CPU, "box": TWO_GPUS}, "per-gpu", 64)
    assert [process_env(plan, w)["CUDA_VISIBLE_DEVICES"] for w in plan.workers] == \
        ["0", "1", "2", "3", "-1", "0", "1"]
    two_each = plan_devices({"big": FOUR_GPUS}, 2, 64)
    assert [process_env(two_each, w)["CUDA_VISIBLE_DEVICES"] for w in two_each.workers] == ["0,1", "2,3"]


def test_containers_get_device_ids_and_cpu_workers_no_gpu():
    two_each = plan_devices({"big": FOUR_GPUS}, 2, 64)
    assert [docker_device_ids(w) for w in two_each.workers] == [["0", "1"], ["2", "3"]]
    plan = plan_devices({"box": TWO_GPUS, "laptop": CPU}, "per-gpu", 64)
    assert [docker_device_ids(w) for w in plan.workers] == [["0"], ["1"], []]
    # Inside a container its GPUs are renumbered from 0: the device request decides, not the env.
    assert container_env(plan, plan.workers[1]) == {"HOMEGPU_COLLECTIVE": RING}
    assert container_env(plan, plan.workers[2]) == {"HOMEGPU_COLLECTIVE": RING, "CUDA_VISIBLE_DEVICES": "-1"}


@pytest.mark.parametrize("gpus, names, text", [
    ((), (), "CPU"),
    ((0,), (RTX3090,), "GPU 0 RTX 3090"),
    ((0, 1), ("NVIDIA H100 NVL", "NVIDIA H100 NVL"), "GPUs 0,1 H100 NVL"),
    ((0, 1), (RTX3090, RTX2080), "GPUs 0 RTX 3090, 1 RTX 2080 SUPER"),
])
def test_device_text(gpus, names, text):
    assert WorkerDevices("n", 0, 0, gpus, names, max(1, len(gpus))).device_text == text


# -- batch -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("nodes, workers_per_node, batch, global_batch, per_replica, text", [
    ({"box": TWO_GPUS, "laptop": CPU}, "per-gpu", 64, 192, 64,
     "batch 64 per worker × 3 workers = 192 global, 64 per replica on 3 replicas"),
    ({"a": TWO_GPUS, "b": TWO_GPUS}, 1, 64, 128, 32,
     "batch 64 per worker × 2 workers = 128 global, 32 per replica on 4 replicas"),
    ({"desk": ONE_GPU}, 1, 10, 10, 10, "batch 10 per worker × 1 worker = 10 global, 10 per replica on 1 replica"),
])
def test_batch_is_shown(nodes, workers_per_node, batch, global_batch, per_replica, text):
    plan = plan_devices(nodes, workers_per_node, batch)
    assert (plan.batch.global_batch, plan.batch.per_replica) == (global_batch, per_replica)
    assert plan.batch.per_replica * plan.batch.replicas == plan.batch.global_batch
    assert plan.batch.text == text and text in plan.lines()


@pytest.mark.parametrize("batch, fragment", [
    (63, "batch_size = 63 per worker does not split over its 2 replicas: set batch_size to a multiple of 2 (e.g. 64)"),
    (0, "batch_size = 0: use a positive integer"),
])
def test_batch_that_does_not_divide_is_refused(batch, fragment):
    with pytest.raises(DevicePlanError, match="batch_size") as caught:
        plan_devices({"a": TWO_GPUS, "b": TWO_GPUS}, 1, batch)
    assert fragment in str(caught.value)


def test_a_scripts_plan_has_no_batch_of_ours_to_refuse():
    """batch_size is the built-in trainer's: a user's script on a 3-GPU worker (default batch_size 64, which
    does not split in 3) is laid out, and the plan says nothing of a batch."""
    from homegpu.remote.config import parse_cluster
    from homegpu.remote.plan.tfconfig import job_device_plan

    three = [(0, "NVIDIA GeForce RTX 3090"), (1, "NVIDIA GeForce RTX 3090"), (2, "NVIDIA GeForce RTX 3090")]
    spec = parse_cluster('[[nodes]]\nname = "box"\nhost = "10.0.0.2"\n[jobs.mine]\nscript = "train.py"\n'
                         '[jobs.demo]\n')
    plan = job_device_plan(spec, spec.jobs["mine"], {"box": three})
    assert plan.batch is None and plan.workers[0].gpus == (0, 1, 2)
    assert not any("batch" in line for line in plan.lines())
    with pytest.raises(DevicePlanError, match="batch_size = 64 per worker does not split over its 3 replicas"):
        job_device_plan(spec, spec.jobs["demo"], {"box": three})


# -- inventories as the nodes report them -----------------------------------------------------------

def test_inventory_from_the_h100_agent_line():
    """NodeStats parsed from the agent's line recorded on a real H100 80GB HBM3."""
    line = (FIXTURES / "h100-80gb-hbm3" / "agent_nvml.jsonl").read_text().splitlines()[0]
    stats = parse_agent_line(line)
    assert gpu_inventory(stats) == (Gpu(0, "NVIDIA H100 80GB HBM3", 81559),)
    plan = plan_devices({"h100": stats, "laptop": parse_agent_line(_cpu_line())}, "per-gpu", 64)
    assert [w.device_text for w in plan.workers] == ["GPU 0 H100 80GB HBM3", "CPU"]
    assert plan.collective == RING


def test_inventory_from_the_eight_gpu_recording():
    gpus = parse_nvidia_smi_gpus((FIXTURES / "gpus_8x_h100sxm_idle.csv").read_text())
    inventory = gpu_inventory([(g["index"], g["name"]) for g in gpus])
    plan = plan_devices({"dgx": inventory}, 4, 256)
    assert layout(plan) == [("dgx", 2, (0, 1)), ("dgx#1", 2, (2, 3)), ("dgx#2", 2, (4, 5)), ("dgx#3", 2, (6, 7))]
    assert plan.collective == NCCL


def _cpu_line() -> str:
    return ('{"v":1,"t":1795359493.8,"source":"none","gpus":[],"driver":null,"cuda":null,"cpu":3.0,'
            '"load":[0.1,0.1,0.1],"mem_used":1000,"mem_total":8000,"disk_free":50000}')


# -- speed and pace ----------------------------------------------------------------------------------

@pytest.mark.parametrize("name, model", [
    ("NVIDIA GeForce RTX 3090", "rtx 3090"),
    ("NVIDIA GeForce RTX 3090 Ti", "rtx 3090 ti"),
    ("NVIDIA GeForce RTX 2080 SUPER", "rtx 2080 super"),
    ("NVIDIA GeForce RTX 4060 Ti", "rtx 4060 ti"),
    ("NVIDIA A100-SXM4-80GB", "a100"),
    ("NVIDIA A10", "a10"),
    ("NVIDIA H100 80GB HBM3", "h100"),
    ("NVIDIA H100 NVL", "h100"),
    ("NVIDIA H200", "h200"),
    ("Tesla V100-SXM2-16GB", "v100"),
    ("Tesla T4", "t4"),
    ("NVIDIA L4", "l4"),
    ("GeForce GTX 1080 Ti", "gtx 1080 ti"),
    ("GeForce GTX 770", None),
])
def test_gpu_models(name, model):
    assert gpu_model(name) == model
    assert gpu_speed(name) > 0


def test_speed_order_and_unknown_cards():
    assert gpu_speed("NVIDIA H200") > gpu_speed("NVIDIA H100 80GB HBM3") > gpu_speed("NVIDIA A100-PCIE-40GB")
    assert gpu_speed("NVIDIA GeForce RTX 4090") > gpu_speed(RTX3090) > gpu_speed(RTX2080) > gpu_speed("Tesla T4")
    assert gpu_speed("GeForce GTX 770") == UNKNOWN_GPU_SPEED
    assert short_gpu_name(RTX3090) == "RTX 3090" and short_gpu_name("Tesla T4") == "T4"


def test_worker_speed_counts_its_gpus():
    assert worker_speed(WorkerDevices("a", 0, 0, (0, 1), (RTX3090, RTX3090), 2)) == 2 * gpu_speed(RTX3090)
    assert worker_speed(WorkerDevices("a", 0, 0, (), (), 1)) == CPU_SPEED
    assert job_pace([1.0, 1.0, 0.1]) == pytest.approx(0.3)


def test_mixed_cluster_says_the_laptop_holds_the_gpus_back():
    plan = plan_devices({"closet": TWO_GPUS, "desktop": [(0, "NVIDIA GeForce RTX 3080")], "laptop": CPU},
                        "per-gpu", 64)
    pace = plan.pace
    assert pace.leave_out == ("laptop",) and not pace.measured
    share = round(100 * CPU_SPEED / gpu_speed("NVIDIA GeForce RTX 3080"))
    assert pace.sentences[0] == (f"laptop (CPU) would run at about {share}% of the GPU workers' pace: leave it "
                                 f'out with nodes = ["closet", "desktop"] (the job would train '
                                 f"{pace.gain:.1f}× as fast on 3 workers)")
    assert pace.gain == pytest.approx(3 * gpu_speed("NVIDIA GeForce RTX 3080") / (4 * CPU_SPEED))
    assert pace.sentences[0] in plan.lines()


@pytest.mark.parametrize("cpu_speed, leave_out, gain_word", [
    (70.0, (), "1.40× as fast as the other 2 workers alone"),   # seed 002's claim holds: 4×0.7 / 2
    (40.0, ("c", "d"), "leave them out"),                        # 4×0.4 < 2: the CPUs slow it down
])
def test_whether_cpu_workers_beside_gpus_speed_the_job_up(cpu_speed, leave_out, gain_word):
    """Measured examples/s from a last run decide; sync training runs at min × workers."""
    nodes = {"a": ONE_GPU, "b": ONE_GPU, "c": CPU, "d": CPU}
    measured = {"a": 100.0, "b": 100.0, "c": cpu_speed, "d": cpu_speed}
    pace = plan_devices(nodes, "per-gpu", 64, measured=measured).pace
    assert pace.measured and pace.speeds == (100.0, 100.0, cpu_speed, cpu_speed)
    assert pace.leave_out == leave_out
    assert any(gain_word in s for s in pace.sentences), pace.sentences


def test_even_workers_get_no_advice_and_partial_timelines_are_ignored():
    plan = plan_devices({"a": TWO_GPUS, "b": ONE_GPU}, "per-gpu", 64, measured={"a": 100.0})
    assert not plan.pace.measured and plan.pace.sentences == () and plan.pace.gain == 1.0


def test_measured_speeds_by_worker_label():
    plan = plan_devices({"a": TWO_GPUS}, "per-gpu", 64, measured={"a": 100.0, "a#1": 20.0})
    advice = advise_pace(plan.workers, {"a": 100.0, "a#1": 20.0})
    assert advice.speeds == (100.0, 20.0)
    # One node: nothing to leave out, but its slow GPU is pointed out against the other.
    assert advice.leave_out == ()
    assert advice.sentences == ("a#1 (GPU 1 RTX 3090) sets the pace, at about 20% of the fastest worker's",)


def test_balanced_a_slower_machine_adds_to_the_job_unless_its_smallest_share_slows_it():
    """Balanced (each share by speed: the built-in trainers' default) the job trains at about the sum of the
    speeds: the issue's desktop and laptop (1,714 and 366 examples/s alone) add up, where even shares would
    leave the laptop out; a machine whose smallest share outlasts the others' whole step is still left out."""
    nodes = {"desktop": CPU, "laptop": CPU}
    measured = {"desktop": 1714.0, "laptop": 366.0}
    even = plan_devices(nodes, 1, 256, measured=measured).pace
    assert even.leave_out == ("laptop",)
    balanced = plan_devices(nodes, 1, 256, measured=measured, balanced=True)
    assert balanced.pace.leave_out == () and balanced.pace.balanced
    assert balanced.pace.sentences == ("laptop (CPU) would run at about 21% of the other workers' pace; balanced by "
                                       "speed, with it the job trains 1.21× as fast as the other 1 worker alone",)
    assert 'each step\'s 512 examples split by speed (balance = "speed"): desktop 422, laptop 90' in balanced.lines()
    assert job_pace([1714.0, 366.0], balanced=True) == pytest.approx(1714 + 366, rel=0.01)

    crawl = plan_devices(nodes, 1, 256, measured={"desktop": 1714.0, "laptop": 30.0}, balanced=True).pace
    assert crawl.leave_out == ("laptop",) and crawl.sentences[0].startswith("laptop (CPU) would run at about 2%")

"""A job's `gpu_memory` before it runs: the key's forms and refusals, the plan that holds each process to it (and
refuses a card that cannot hold its processes), "auto" from the last run's timeline, and the known cause that
names the key. The cards are recorded ones (tests/fixtures/gpu: nvidia-smi rows as the stats agent parses them)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from homegpu.remote.config import AUTO, ConfigError, cluster_to_toml, parse_cluster
from homegpu.remote.jobs.launch_plan import worker_launch
from homegpu.remote.logs.known_causes import known_cause
from homegpu.remote.node_side.agent.smi_parse import parse_nvidia_smi_gpus
from homegpu.remote.plan import lay_out
from homegpu.remote.record.timeline_schema import GpuTimeline, NodeTimeline, Series, Timeline
from homegpu.remote.runtimes.base import NodePaths
from homegpu.trainer.gpu_budget import say_if_over_budget

FIXTURES = Path(__file__).parent / "fixtures" / "gpu"
GIB = 1024 ** 3
CLUSTER = """[cluster]
name = "home"

[[nodes]]
name = "desktop"
host = "10.0.0.20"

[jobs.sweep]
epochs = 1
"""


def recorded_gpus(fixture: str) -> list[SimpleNamespace]:
    """A node's GPUs as its stats carry them, from an nvidia-smi recording."""
    return [SimpleNamespace(**row) for row in parse_nvidia_smi_gpus((FIXTURES / fixture).read_text())]


RTX_2080_SUPER = recorded_gpus("gpus_1x_rtx2080super_windows_load.csv")  # 8192 MiB
H100_NVL = recorded_gpus("gpus_2x_h100nvl_idle.csv")  # 2 × 95830 MiB


def job_with(line: str, tmp_path: Path | None = None):
    spec = parse_cluster(CLUSTER + line + "\n", str(tmp_path / "cluster.toml") if tmp_path else "cluster.toml")
    return spec, spec.jobs["sweep"]


@pytest.mark.parametrize("value, size", [
    ('"5GiB"', 5 * GIB), ('"512MiB"', 512 * 1024 ** 2), ('"8GB"', 8 * 1000 ** 3), ('"1.5G"', 3 * GIB // 2),
    ('"5 gib"', 5 * GIB), ('"auto"', AUTO),
])
def test_gpu_memory_takes_a_size_with_its_unit_or_auto(value, size):
    assert job_with(f"gpu_memory = {value}")[1].gpu_memory == size


def test_a_job_without_gpu_memory_has_the_whole_card():
    assert job_with("")[1].gpu_memory == 0


@pytest.mark.parametrize("value, problem", [
    ("5", "expected a size, got an integer 5"),  # 5 bytes to one reader, 5 GiB to another
    ('"5 potatoes"', "'5 potatoes' is not a size"),
    ("true", "expected a size, got a boolean"),
    ('"10MiB"', "'10MiB' is outside 64 MiB to 1.0 TiB"),
])
def test_a_gpu_memory_that_is_not_a_size_is_refused_in_one_line_naming_the_line(value, problem):
    with pytest.raises(ConfigError) as refused:
        job_with(f"gpu_memory = {value}")
    message = str(refused.value)
    assert message.startswith("cluster.toml:10: [jobs.sweep].gpu_memory: " + problem), message
    assert "\n" not in message


@pytest.mark.parametrize("value", ['"5GiB"', '"8GB"', '"1536MiB"', '"auto"'])
def test_the_cluster_writer_writes_gpu_memory_back_as_the_file_takes_it(value):
    spec, job = job_with(f"gpu_memory = {value}")
    written = cluster_to_toml(spec)
    assert f"gpu_memory = {value}" in written
    assert parse_cluster(written).jobs["sweep"].gpu_memory == job.gpu_memory


class Runtime:  # what worker_launch asks of a runtime, as ProcessRuntime answers it
    def worker_paths(self, run_id, label, code_dir, data_dir, python):
        return NodePaths(python="python3", code_dir=code_dir, output_dir=f"/out/{label}", data_dir=data_dir)

    def out_dir(self, run_id, label):
        return f"/out/{label}"

    def device_env(self, plan, devices):
        from homegpu.remote.plan import process_env
        return process_env(plan, devices)


def test_the_plan_holds_each_worker_to_the_budget_and_its_launch_carries_it():
    spec, job = job_with('gpu_memory = "5GiB"')
    layout = lay_out(spec, job, {"desktop": RTX_2080_SUPER}, need_plan=True)
    assert layout.plan_lines()[-1] == "gpu_memory 5.0 GiB: each worker held to it on its GPU"
    launch = worker_launch(job, "sweep-1", 0, layout.slots, layout.slots[0], Runtime(), "/code", layout.plan, "")
    assert launch.env["HOMEGPU_GPU_MEMORY"] == str(5 * GIB)
    assert launch.env["CUDA_VISIBLE_DEVICES"] == "0"


def test_without_gpu_memory_a_launch_carries_no_budget():
    spec, job = job_with("")
    layout = lay_out(spec, job, {"desktop": RTX_2080_SUPER}, need_plan=True)
    launch = worker_launch(job, "sweep-1", 0, layout.slots, layout.slots[0], Runtime(), "/code", layout.plan, "")
    assert "HOMEGPU_GPU_MEMORY" not in launch.env
    assert not any("gpu_memory" in line for line in layout.plan_lines())


@pytest.mark.parametrize("lines, refusal", [
    ('gpu_memory = "12GiB"', "job sweep: node desktop: GPU 0 (NVIDIA GeForce RTX 2080 SUPER, 8.0 GiB) cannot hold "
                             "gpu_memory 12.0 GiB: lower gpu_memory in the job, or leave the node out with nodes = [...]"),
    ('gpu_memory = "5GiB"\nworkers_per_node = 2\nshare_gpus = true',
     "job sweep: node desktop: GPU 0 (NVIDIA GeForce RTX 2080 SUPER, 8.0 GiB) cannot hold gpu_memory 2 processes × "
     "5.0 GiB: lower gpu_memory in the job, or workers_per_node"),
])
def test_a_plan_whose_processes_a_card_cannot_hold_is_refused_before_launch(lines, refusal):
    spec, job = job_with(lines)
    layout = lay_out(spec, job, {"desktop": RTX_2080_SUPER}, need_plan=True)
    assert layout.plan is None
    assert layout.refusal == refusal


def test_processes_that_fit_a_card_together_share_it():
    spec, job = job_with('gpu_memory = "3GiB"\nworkers_per_node = 2\nshare_gpus = true')
    layout = lay_out(spec, job, {"desktop": RTX_2080_SUPER}, need_plan=True)
    assert [w.gpus for w in layout.plan.workers] == [(0,), (0,)]


def test_a_card_whose_memory_the_agent_could_not_read_is_not_refused():
    spec, job = job_with('gpu_memory = "500GiB"')
    unknown = [SimpleNamespace(index=0, name="NVIDIA GeForce GTX 770", mem_total=None)]
    assert lay_out(spec, job, {"desktop": unknown}, need_plan=True).plan.gpu_memory == 500 * GIB


def last_run_peaking_at(mib: float) -> Timeline:
    """A timeline whose two GPUs held up to `mib` MiB between them (the stats agent's unit)."""
    def gpu(index: int, used: tuple[float, ...]) -> GpuTimeline:
        return GpuTimeline(index, Series(), Series((1.0, 2.0, 3.0), used), 95830.0, Series(), Series(), Series())
    node = NodeTimeline("desktop", Series(), Series(), None, (gpu(0, (100.0, mib, 900.0)), gpu(1, (None, 50.0, 60.0))))
    return Timeline({"job": "sweep"}, 0.0, 3.0, (node,), (), ())


def test_auto_is_the_most_a_gpu_held_in_the_last_run_and_a_tenth_more():
    spec, job = job_with('gpu_memory = "auto"\nworkers_per_node = "per-gpu"')
    layout = lay_out(spec, job, {"desktop": H100_NVL}, last_run=last_run_peaking_at(4000.0), need_plan=True)
    assert layout.plan.gpu_memory == 4400 * 1024 ** 2
    assert layout.plan_lines()[-1] == ("gpu_memory 4.3 GiB (auto: its last run's peak 3.9 GiB, plus a tenth): "
                                       "each worker held to it on its GPU")


def test_auto_without_an_earlier_run_gives_the_whole_card_and_says_why():
    spec, job = job_with('gpu_memory = "auto"')
    layout = lay_out(spec, job, {"desktop": H100_NVL}, need_plan=True)
    assert layout.plan.gpu_memory == 0
    assert layout.plan_lines()[-1] == ("gpu_memory auto (no earlier run of the job sampled a GPU's memory): "
                                       "each worker has its whole GPU")


# PyTorch's out-of-memory message as torch.OutOfMemoryError prints it (c10/cuda/CUDACachingAllocator.cpp's format).
TORCH_OOM = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of "
             "7.79 GiB of which 1.12 GiB is free. Including non-PyTorch memory, this process has 5.00 GiB memory in use.")


def test_running_out_of_a_budget_names_the_key_and_without_one_the_batch():
    held = known_cause(TORCH_OOM, "homegpu: this process was held to the job's gpu_memory (5.0 GiB)")
    assert held.cause == "the run needed more GPU memory than its gpu_memory (5.0 GiB)"
    assert held.fix.startswith("raise gpu_memory in the job")
    assert known_cause(TORCH_OOM).fix == "use a smaller batch_size"


@pytest.mark.parametrize("error, held, said", [
    (RuntimeError(TORCH_OOM.split(": ", 1)[1]), True, True),
    (RuntimeError(TORCH_OOM.split(": ", 1)[1]), False, False),  # a CPU process was held to nothing
    (ValueError("shapes (3,) and (4,) not aligned"), True, False),
])
def test_an_out_of_memory_error_in_a_held_process_says_so_after_its_traceback(capsys, error, held, said):
    say_if_over_budget(error, 5 * GIB, held)
    line = "homegpu: this process was held to the job's gpu_memory (5.0 GiB)\n"
    assert capsys.readouterr().err == (line if said else "")
    if said:
        assert known_cause(TORCH_OOM, line).cause.endswith("than its gpu_memory (5.0 GiB)")

"""A balanced run whose new shares ran a GPU out of memory restarts from the even split, not from the shares that
failed (which would only run out again until the restarts were spent): run_restarts.py, failure.ran_out_of_memory.
The errors are the frameworks' own words (remote/logs/known_causes.py lists them); no GPU is needed to read them."""

from __future__ import annotations

from pathlib import Path

import pytest

from homegpu.remote.config.cluster_spec import parse_cluster
from homegpu.remote.events import Metric
from homegpu.remote.jobs.failure import WorkerEnd, ran_out_of_memory
from homegpu.remote.jobs.run_restarts import Restarts
from homegpu.remote.jobs.run_state import RunState
from homegpu.remote.jobs.watch import WorkerTrack
from homegpu.remote.nodes import Cluster
from homegpu.remote.runtimes import WorkerStatus

CLUSTER = """
[[nodes]]
name = "desktop"
host = "desktop.lan"
[[nodes]]
name = "laptop"
host = "laptop.lan"
[jobs.demo]
"""

TF_OUT_OF_MEMORY = (
    "Traceback (most recent call last):",
    '  File "/w/code/train.py", line 9, in <module>',
    "    model.fit(data, epochs=6)",
    "tensorflow.python.framework.errors_impl.ResourceExhaustedError: Graph execution error:",
    "OOM when allocating tensor with shape[445,64,64,32] and type float on /job:worker/replica:0/task:0/device:GPU:0",
)
TORCH_OUT_OF_MEMORY = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",)
VALUE_ERROR = ("Traceback (most recent call last):", '  File "/w/code/train.py", line 3, in <module>',
               "ValueError: bad shape")


@pytest.mark.parametrize("lines, ran_out", [(TF_OUT_OF_MEMORY, True), (TORCH_OUT_OF_MEMORY, True),
                                            (VALUE_ERROR, False)])
def test_a_generation_that_ran_out_of_gpu_memory_is_told_by_its_workers_errors(lines, ran_out):
    assert ran_out_of_memory([WorkerEnd("desktop", 1, progressed=True, last_lines=lines)]) is ran_out
    # a worker stopped because a peer failed, or one that succeeded, says nothing of it
    assert not ran_out_of_memory([WorkerEnd("desktop", 1, last_lines=lines, stopped=True)])
    assert not ran_out_of_memory([WorkerEnd("desktop", 0, last_lines=lines)])


def failed_run(tmp_path: Path, lines: tuple[str, ...], shares: list[int]) -> RunState:
    """Generation 1 of a two-worker run: the chief's last epoch line told `shares`, and it failed printing `lines`."""
    spec = parse_cluster(CLUSTER, "cluster.toml")
    run = RunState(Cluster(spec), spec.jobs["demo"], tmp_path, "demo-1", placement=None)
    for slot in run.slots:
        track = WorkerTrack(slot, runtime=None, status=WorkerStatus(slot.label, "exited", 1),
                            last_metric=Metric({"event": "epoch", "epoch": 2, "shares": shares}), progressed=True)
        for line in lines if slot.index == 0 else ():
            track.tracebacks.feed(line)
        run.tracks[slot.label] = track
    return run


def test_a_balanced_run_out_of_gpu_memory_starts_its_next_generation_even_and_says_why(tmp_path):
    run = failed_run(tmp_path, TF_OUT_OF_MEMORY, [445, 67])
    said = []
    run.publish = lambda state, detail="", regroup="": said.append(detail)
    assert list(run.first_shares()) == [445, 67]
    Restarts(run, generations=None, members=None)._even_after_out_of_memory()
    run.generation = 2  # as Generations.start_next begins the next one
    assert run.first_shares() is None  # the workers start from the even split
    assert said == ["out of GPU memory at the shares 445/67: the next generation starts from the even split, and "
                    "each GPU's memory then caps its share"]
    run.generation = 3  # a later one starts from what the even one's chief told again
    assert list(run.first_shares()) == [445, 67]


@pytest.mark.parametrize("lines, shares", [(VALUE_ERROR, [445, 67]), (TF_OUT_OF_MEMORY, [256, 256])])
def test_another_error_or_an_even_split_keeps_the_shares(tmp_path, lines, shares):
    run = failed_run(tmp_path, lines, shares)
    run.publish = lambda *args, **kwargs: pytest.fail("nothing to say")
    Restarts(run, generations=None, members=None)._even_after_out_of_memory()
    run.generation = 2
    assert list(run.first_shares()) == shares

"""serve's queue sharing cards by gpu_memory, end to end on this machine as the node (host = "local": its real
stats agent and process runtime, no LAN needed): its nvidia-smi is tests/gpu_replay.py answering with two
recorded H100 NVL (95830 MiB each; there is no GPU here). A sweep: one job of 40 GiB submitted five times, each
run with its own `--set args`: four run at once, two on each card, each worker started with its card alone
visible, its budget and a port of its own; the fifth waits with the reason, and starts on the card the first one
leaves."""

from __future__ import annotations

import asyncio
import os
import sys
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from gpu_replay import FIXTURES, write_replay_nvidia_smi
from helpers import homegpu, local_cluster_toml, wait_until
from homegpu.remote.config import load_cluster
from homegpu.remote.events import JobState, JobStateChanged
from homegpu.remote.jobs import JobRun
from homegpu.remote.nodes import Cluster
from homegpu.remote.queue import EntryState, QueueRunner, QueueStore

from simcluster import free_job_port

# Says what it was started with, then runs until its stop file is there.
SCRIPT = """import json, os, pathlib, sys, time
port = json.loads(os.environ["TF_CONFIG"])["cluster"]["worker"][0].rsplit(":", 1)[1]
print("gpu", os.environ.get("CUDA_VISIBLE_DEVICES"), "budget", os.environ.get("HOMEGPU_GPU_MEMORY"), "port", port,
      flush=True)
stop = pathlib.Path(sys.argv[1])
while not stop.exists():
    time.sleep(0.2)
"""


@pytest.fixture
def two_cards(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A cluster file whose one node has two replayed H100 NVL and the job `sweep` (40 GiB, held until the file its
    args name is there); and the job's port."""
    bin_dir = write_replay_nvidia_smi(tmp_path / "bin", FIXTURES / "gpus_2x_h100nvl_idle.csv",
                                      FIXTURES / "apps_none.csv")
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    code = tmp_path / "code"
    code.mkdir()
    (code / "hold.py").write_text(SCRIPT)
    port = free_job_port(4)
    job = (f'[jobs.sweep]\nscript = "hold.py"\npython = "{sys.executable}"\nport = {port}\ngpu_memory = "40GiB"\n'
           'restart = "never"\n')
    return load_cluster(local_cluster_toml(code, job, name="share", cluster="stats_interval = 1.0")), tmp_path, port


def submit_sweep(store: QueueStore, folder: Path) -> list[str]:
    """Five runs of `sweep`, run n held until folder/stopN is there."""
    return [store.submit("sweep", overrides=[f"args=[{str(folder / f'stop{n}')!r}]"], user="root", now=float(n)).id
            for n in range(1, 6)]


def worker_line(experiments: Path, run_id: str) -> str:
    log = experiments / run_id / "logs" / "here.log"
    return next((line for line in log.read_text().splitlines() if line.startswith("gpu ")), "") if log.exists() else ""


async def attached_detail(cluster: Cluster, folder: Path) -> str:
    """What a controller that attaches to the job (the TUI's, `homegpu run` of it) says once attached."""
    events = cluster.hub.subscribe()
    watcher = JobRun(cluster, cluster.spec.jobs["sweep"], folder / "watching")
    try:
        assert await watcher.attach_if_running()
        while not isinstance(event := await asyncio.wait_for(events.__anext__(), 30), JobStateChanged) \
                or event.state is not JobState.RUNNING:
            pass
        return event.detail
    finally:
        events.close()
        await watcher.detach()


@asynccontextmanager
async def sweep_queued(spec, folder: Path):
    """The sweep's five runs submitted to a queue with a runner on this machine's node: (store, cluster, ids,
    runners), runners[-1] the one running now (a test may start another); at the end every run is let end and that
    runner closed."""
    with QueueStore(folder / "queue.sqlite") as store:
        async with Cluster(spec) as cluster:
            await cluster.node("here").wait_for(lambda n: n.latest is not None and n.latest.gpus, timeout=60)
            runners = [QueueRunner(cluster, store, folder / "experiments").start()]
            ids = submit_sweep(store, folder)
            runners[0].wake()
            try:
                yield store, cluster, ids, runners
            finally:
                for n in range(1, 6):
                    (folder / f"stop{n}").touch()
                await wait_until(lambda: all(store.get(id_).state.finished for id_ in ids), 120, "every run's end")
                await runners[-1].close()


async def test_a_sweeps_four_40_gib_runs_share_two_cards_and_a_fifth_waits_for_room(two_cards):
    spec, folder, port = two_cards
    experiments = folder / "experiments"
    async with sweep_queued(spec, folder) as (store, cluster, ids, _):
        def four_running():
            states = [store.get(id_).state for id_ in ids]
            return states[:4] == [EntryState.RUNNING] * 4 and states[4] is EntryState.WAITING
        await wait_until(four_running, 180, "four runs running and the fifth waiting")
        assert store.get(ids[4]).reason == ("needs 40.0 GiB on a GPU: the most free is 13.6 GiB on here GPU 0, "
                                            "held by q-1 (40.0 GiB) and q-3 (40.0 GiB)")
        lines = [await wait_until(lambda: worker_line(experiments, store.get(id_).run_id), 60, id_)
                 for id_ in ids[:4]]
        budget = str(40 * 1024 ** 3)
        assert lines == [f"gpu {card} budget {budget} port {port + n}" for n, card in enumerate((0, 1, 0, 1))]
        assert [store.get(id_).reason for id_ in ids[:2]] == ["on here GPU 0 with 40.0 GiB",
                                                              "on here GPU 1 with 40.0 GiB"]
        copies = folder / "code-node" / "code"  # each run's own copy of the code, in the node's work dir
        assert sorted(path.name for path in copies.iterdir()) == [f"sweep.q-{n}" for n in range(1, 5)]
        assert await attached_detail(cluster, folder) == (  # the TUI opened now: which of the four it shows
            "attached to a running job (the newest of 4 runs of sweep at once: `homegpu queue` lists them)")

        (folder / "stop1").touch()  # q-1 ends: its card has room for the fifth
        await wait_until(lambda: store.get(ids[4]).state is EntryState.RUNNING, 120, "the fifth run")
        assert store.get(ids[0]).state is EntryState.SUCCEEDED
        assert sorted(path.name for path in copies.iterdir()) == [f"sweep.q-{n}" for n in range(2, 6)]  # q-1's gone
        assert await wait_until(lambda: worker_line(experiments, store.get(ids[4]).run_id), 60, "q-5") == \
            f"gpu 0 budget {budget} port {port}"  # q-1's, free again

        # `homegpu stop` and `logs` of a job that runs four times at once: which run is asked, never guessed
        config, second = str(spec.source), store.get(ids[1]).run_id
        refused = await asyncio.to_thread(homegpu, "--config", config, "stop", "sweep", cwd=folder)
        assert refused.returncode != 0 and "sweep runs 4 times at once (" in refused.stderr, refused.stderr
        assert "--run RUN_ID" in refused.stderr and second in refused.stderr
        logs = await asyncio.to_thread(homegpu, "--config", config, "logs", "sweep", "--run", second, cwd=folder)
        assert f"gpu 1 budget {budget} port {port + 1}" in logs.stdout, logs.stderr
        stopped = await asyncio.to_thread(homegpu, "--config", config, "stop", "sweep", "--run", second, cwd=folder)
        assert stopped.returncode == 0 and f"stopped sweep (run {second})" in stopped.stdout, stopped.stderr
        await wait_until(lambda: store.get(ids[1]).state.finished, 60, "q-2's end")
        assert [store.get(id_).state for id_ in ids[2:]] == [EntryState.RUNNING] * 3  # the others go on


async def test_serve_started_again_keeps_the_cards_room_and_ports_of_the_runs_it_finds(two_cards):
    """The runner stopped with four runs sharing the cards (they go on) and a new one started on the same queue:
    it finds their GPUs and ports in their run.json, so the fifth still waits for room, and takes the first's card
    and port when that one ends."""
    spec, folder, port = two_cards
    async with sweep_queued(spec, folder) as (store, cluster, ids, runners):
        await wait_until(lambda: [store.get(i).state for i in ids[:4]] == [EntryState.RUNNING] * 4, 180,
                         "four runs running")
        waits = store.get(ids[4]).reason
        await runners[0].close()  # serve stopped: its runs go on

        runners.append(QueueRunner(cluster, store, folder / "experiments").start())
        await wait_until(lambda: not runners[-1]._unresumed, 120, "the four runs found again")
        runners[-1].wake()
        await asyncio.sleep(3)  # passes of the new runner: the fifth must still wait
        assert store.get(ids[4]).state is EntryState.WAITING and store.get(ids[4]).reason == waits

        (folder / "stop1").touch()
        await wait_until(lambda: store.get(ids[4]).state is EntryState.RUNNING, 120, "the fifth run")
        assert await wait_until(lambda: worker_line(folder / "experiments", store.get(ids[4]).run_id), 60, "q-5") == \
            f"gpu 0 budget {40 * 1024 ** 3} port {port}"


async def test_a_start_that_meets_a_bug_fails_its_entry_saying_so_and_the_queue_goes_on(two_cards, monkeypatch):
    """An error homegpu did not expect while a run launches (a bug, stood in for here: the one real way found, a
    script outside its code_dir, is now refused by the cluster file's check) fails that entry with the error, puts
    the traceback in serve's log, and the next entry starts: no entry is left `starting` for ever."""
    spec, folder, _ = two_cards
    launch, calls = JobRun.launch, []

    async def first_launch_breaks(run: JobRun) -> None:
        calls.append(run.run_id)
        if len(calls) == 1:
            raise ValueError("a bug")
        await launch(run)

    monkeypatch.setattr(JobRun, "launch", first_launch_breaks)
    said: list[str] = []
    with QueueStore(folder / "queue.sqlite") as store:
        async with Cluster(spec) as cluster:
            await cluster.node("here").wait_for(lambda n: n.latest is not None and n.latest.gpus, timeout=60)
            runner = QueueRunner(cluster, store, folder / "experiments", say=said.append).start()
            ids = [store.submit("sweep", overrides=[f"args=[{str(folder / f'stop{n}')!r}]"], user="root",
                                now=float(n)).id for n in (1, 2)]
            runner.wake()
            try:
                failed = await wait_until(lambda: [store.get(i) for i in ids if store.get(i).state.finished], 120,
                                          "the first launch's end")  # the two launch at once: either may be first
                assert [(e.state, e.reason) for e in failed] == [
                    (EntryState.FAILED, "not started: homegpu failed (ValueError: a bug); serve's log has the details")]
                [line] = said
                assert line.startswith(f"queue: {failed[0].id} (sweep) not started, by an error homegpu did not "
                                       "expect:\nTraceback (most recent call last):\n")
                assert line.endswith("ValueError: a bug")
                other = next(i for i in ids if i != failed[0].id)
                await wait_until(lambda: store.get(other).state is EntryState.RUNNING, 120, "the other running")
            finally:
                for n in (1, 2):
                    (folder / f"stop{n}").touch()
                await wait_until(lambda: all(store.get(i).state.finished for i in ids), 120, "both ends")
                await runner.close()

"""serve keeps what it records through a full disk (issue 31, finding 1): its history and its queue live on a
real, small tmpfs that the test fills while they are written, then frees.

The history: a write that fails is said once (the file, the filesystem and what to free), the samples it
could not write are a gap (not data, and no GPU time across it), and recording resumes by itself. The
queue: a start that cannot be recorded is not launched (the entry waits, never left starting), a run's end
that cannot be recorded is recorded when space is back, and nothing raises out of the runner or at close.
The queue's node is this machine (host = "local", its real stats agent and process runtime: no LAN needed).
"""

from __future__ import annotations

import contextlib
import errno
import os
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import pytest

from helpers import local_cluster_toml, wait_until
from test_history_store import T0, Clock, feed, h100
from homegpu.remote.config import load_cluster
from homegpu.remote.events import JobState
from homegpu.remote.history import HistoryRecorder
from homegpu.remote.jobs import JobRun
from homegpu.remote.nodes import Cluster
from homegpu.remote.queue import EntryState, QueueRunner, QueueStore, apply_overrides



class SmallDisk:
    """A tmpfs of a few MiB mounted at `path`, filled and freed on demand."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.filler = path / "filler"

    def fill(self) -> None:
        """Write until the filesystem has not one byte left (ENOSPC), as a `dd` beside serve would."""
        fd = os.open(self.filler, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        try:
            for size in (65536, 4096, 1):  # smaller and smaller, so that no page is left over
                try:
                    while True:
                        os.write(fd, b"\0" * size)
                except OSError as exc:
                    assert exc.errno == errno.ENOSPC, exc
        finally:
            os.close(fd)

    def free(self) -> None:
        self.filler.unlink()


@pytest.fixture
def small_disk(root, tmp_path: Path) -> Iterator[SmallDisk]:
    mount = tmp_path / "disk"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mount)], check=True)
    try:
        yield SmallDisk(mount)
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=True)


def feed_seconds(recorder: HistoryRecorder, clock: Clock, first: int, last: int) -> None:
    """The recorded H100's samples, a second apart, from T0 + first to T0 + last, the clock following."""
    feed(recorder, clock, "h100", lambda k: h100(k=k), T0 + first, T0 + last)


def recorded_seconds(path: Path) -> list[int]:
    with contextlib.closing(sqlite3.connect(path)) as db:
        return [round(t - T0) for (t,) in db.execute("SELECT DISTINCT t FROM gpu_samples ORDER BY t")]


def test_the_history_says_a_full_disk_once_leaves_a_gap_and_resumes_by_itself(small_disk: SmallDisk):
    said: list[str] = []
    clock = Clock()
    path = small_disk.path / "history.sqlite"
    recorder = HistoryRecorder(path, clock=clock, say=said.append)
    feed_seconds(recorder, clock, 0, 19)
    small_disk.fill()
    feed_seconds(recorder, clock, 20, 79)  # a write a second: each fails
    assert len(said) == 1, said
    assert said[0].startswith(f"cannot write the history {path} (database or disk is full; the filesystem at "
                              f"{small_disk.path} has ") and "free space there" in said[0], said[0]
    small_disk.free()
    feed_seconds(recorder, clock, 80, 99)
    assert len(said) == 2 and said[1].startswith(f"writing the history {path} again after "), said
    recorder.close()
    seconds = recorded_seconds(path)
    assert set(range(0, 19)) <= set(seconds) and set(range(81, 100)) <= set(seconds), seconds
    assert not [s for s in seconds if 22 <= s <= 79], "samples from the full disk's time are a gap, not data"


def test_a_history_closed_on_a_full_disk_says_so_and_raises_nothing(small_disk: SmallDisk):
    said: list[str] = []
    clock = Clock()
    recorder = HistoryRecorder(small_disk.path / "history.sqlite", clock=clock, say=said.append)
    feed_seconds(recorder, clock, 0, 4)
    small_disk.fill()
    feed_seconds(recorder, clock, 5, 9)
    recorder.close()  # SIGTERM's way out: no traceback
    assert len(said) == 1 and said[0].startswith("cannot write the history"), said


HOLD_JOB = """
[jobs.hold]
nodes = ["here"]
python = "{python}"
script = "hold.py"
max_restarts = 0
"""
# runs until the file named by its argument appears, so the test decides when each run ends
HOLD = """import os, sys, time
deadline = time.time() + 300
while not os.path.exists(sys.argv[1]) and time.time() < deadline:
    time.sleep(0.1)
"""


async def test_the_queue_on_a_full_disk_starts_nothing_it_cannot_record_and_records_ends_later(
        small_disk: SmallDisk, tmp_path: Path):
    code = tmp_path / "project"  # cluster.toml beside its script: the code a run ships
    code.mkdir()
    (code / "hold.py").write_text(HOLD)
    spec = load_cluster(local_cluster_toml(code, HOLD_JOB.format(python=sys.executable), name="fullq"))
    said: list[str] = []
    release_first, release_second = tmp_path / "first", tmp_path / "second"
    with QueueStore(small_disk.path / "queue.sqlite") as store:
        first = store.submit("hold", overrides=[f"args=[{str(release_first)!r}]"], user="root", now=T0)
        second = store.submit("hold", overrides=[f"args=[{str(release_second)!r}]"], after=[first.id], user="root",
                              now=T0)
        async with Cluster(spec) as cluster:
            await cluster.node("here").wait_online(60)
            small_disk.fill()  # before the first start: it cannot be recorded, so it is not launched
            runner = QueueRunner(cluster, store, tmp_path / "experiments", tick=0.2, say=said.append).start()
            try:
                await wait_until(lambda: runner.trouble.failures >= 5, 120, "five passes that could not write")
                assert len(said) == 1, "said once"
                assert said[0].startswith(f"cannot write the queue {store.path} (database or disk is full; "
                                          f"the filesystem at {small_disk.path} has "), said
                assert store.get(first.id).state is EntryState.WAITING, "never left starting"
                assert not list((tmp_path / "experiments").glob("*/logs/*.log")), "nothing launched"
                small_disk.free()
                await wait_until(lambda: store.get(first.id).state is EntryState.RUNNING, 120, "q-1 running")
                assert len(said) == 2 and said[1].startswith(f"writing the queue {store.path} again after"), said

                small_disk.fill()
                release_first.touch()  # q-1 ends while its end cannot be written
                await wait_until(lambda: runner.trouble.failures >= 5, 120, "five tries to record q-1's end")
                assert len(said) == 3 and said[2].startswith(f"cannot write the queue {store.path}"), said
                assert store.get(second.id).state is EntryState.WAITING  # q-1 still holds the node in the file
                small_disk.free()
                await wait_until(lambda: store.get(first.id).state is EntryState.SUCCEEDED, 120, "q-1's end recorded")
                await wait_until(lambda: store.get(second.id).state is EntryState.RUNNING, 120, "q-2 running")
                release_second.touch()
                await wait_until(lambda: store.get(second.id).state is EntryState.SUCCEEDED, 120, "q-2 succeeded")
                assert len(said) == 4 and said[3].startswith(f"writing the queue {store.path} again after"), said
            finally:
                release_first.touch()
                release_second.touch()
                await runner.close()


async def test_a_run_whose_running_was_never_recorded_ends_as_it_did_after_a_restart(tmp_path: Path):
    """A serve stopped between a launch and its "running" record (a full disk, then a restart) leaves the entry
    starting; the restarted queue finds the run ended and takes its end from the workers' exit statuses:
    succeeded, as it did, not failed as "stopped while starting"."""
    code = tmp_path / "project"
    code.mkdir()
    (code / "hold.py").write_text(HOLD)
    (tmp_path / "go").touch()  # the run ends at once
    spec = load_cluster(local_cluster_toml(code, HOLD_JOB.format(python=sys.executable), name="resume"))
    with QueueStore(tmp_path / "queue.sqlite") as store:
        entry = store.submit("hold", overrides=[f"args=[{str(tmp_path / 'go')!r}]"], user="root", now=T0)
        async with Cluster(spec) as cluster:
            await cluster.node("here").wait_online(60)
            run = JobRun(cluster, apply_overrides(spec, spec.jobs["hold"], entry.overrides), tmp_path / "experiments")
            await run.prepare()
            store.mark_starting(entry.id, run.run_id, T0)  # recorded; then the launch, and serve stopped
            await run.launch()
            assert (await run.watch()).state is JobState.SUCCEEDED
            await run.detach()
            runner = QueueRunner(cluster, store, tmp_path / "experiments", tick=0.2).start()  # serve again
            try:
                await wait_until(lambda: store.get(entry.id).state.finished, 120, "the entry's end")
            finally:
                await runner.close()
        ended = store.get(entry.id)
    assert (ended.state, ended.reason) == (EntryState.SUCCEEDED, "ended while serve was stopped"), ended

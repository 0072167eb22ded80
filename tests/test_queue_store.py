"""The queue's store (remote/queue/): real SQLite files in tmp_path, reopened as a restarted serve would.

Ids never reused, entries round-trip whole, the start recorded (with its run id) before a launch and only
once, cancel and finish, what a restarted serve does with entries left starting or running, and a damaged
file as one line naming it.
"""

from __future__ import annotations

import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from homegpu.remote.config import load_cluster
from homegpu.remote.history import history_path
from homegpu.remote.queue import (
    ATTACH, FAIL, EntryState, QueueDamaged, QueueError, QueueStore, Resume, entry_number, queue_path, resume_action,
)

T0 = 1_795_316_400.0


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "data" / "queue-home-0123abcd.sqlite"


def submit(store: QueueStore, job: str = "train", **kwargs) -> str:
    kwargs.setdefault("user", "alice")
    kwargs.setdefault("now", T0)
    return store.submit(job, **kwargs).id


def test_an_entry_round_trips_and_survives_reopen(path: Path) -> None:
    with QueueStore(path) as store:
        first = submit(store)
        entry = store.submit("train", overrides=("epochs=5", "env.WANDB_MODE=offline"), after=(first,), priority=3,
                             user="bob", now=T0 + 1)
    with QueueStore(path) as store:
        again = store.get(entry.id)
        assert again == entry
        assert (again.id, again.job, again.overrides, again.after, again.priority, again.user, again.state) == (
            "q-2", "train", ("epochs=5", "env.WANDB_MODE=offline"), ("q-1",), 3, "bob", EntryState.WAITING)
        assert (again.submitted, again.started, again.ended, again.run_id, again.reason) == (T0 + 1, None, None, "", "")
        assert [e.id for e in store.entries()] == ["q-1", "q-2"]
    assert oct(path.stat().st_mode & 0o777) == "0o600"


def test_ids_increase_and_are_never_reused(path: Path) -> None:
    with QueueStore(path) as store:
        ids = [submit(store) for _ in range(3)]
    db = sqlite3.connect(path)
    db.execute("DELETE FROM entries")  # a future pruning of old entries must not free their numbers
    db.commit()
    db.close()
    with QueueStore(path) as store:
        assert ids == ["q-1", "q-2", "q-3"]
        assert submit(store) == "q-4"
        assert submit(store) == "q-5"


def test_after_must_name_an_entry_and_is_kept_once(path: Path) -> None:
    with QueueStore(path) as store:
        submit(store)
        with pytest.raises(QueueError, match=r"^--after q-7: no such queue entry; `homegpu queue` lists them$"):
            submit(store, after=("q-7",))
        assert store.submit("train", after=("1", "q-1"), user="a", now=T0).after == ("q-1",)
        assert [e.id for e in store.entries()] == ["q-1", "q-2"]  # a refused submission is not kept
        with pytest.raises(QueueError, match="priority 2000000 is out of range"):
            submit(store, priority=2_000_000)


def test_start_is_recorded_first_and_only_once(path: Path) -> None:
    """A serve killed right after mark_starting finds the entry starting, not waiting: it never launches
    it a second time, and a second start of the same entry is refused."""
    with QueueStore(path) as store:
        id_ = submit(store)
        started = store.mark_starting(id_, "train-20260101-000000", T0 + 5)
        assert (started.state, started.run_id, started.started) == (
            EntryState.STARTING, "train-20260101-000000", T0 + 5)
        with pytest.raises(QueueError, match=r"^q-1 is starting, not waiting: it is not started again$"):
            store.mark_starting(id_, "train-other", T0 + 6)
    with QueueStore(path) as store:  # the restarted serve
        assert store.entries((EntryState.WAITING,)) == []
        assert [(e.id, e.run_id) for e in store.unfinished()] == [("q-1", "train-20260101-000000")]
        assert store.mark_running(id_).state is EntryState.RUNNING
        done = store.finish(id_, EntryState.SUCCEEDED, "", T0 + 60)
        assert (done.state, done.ended, done.run_id) == (EntryState.SUCCEEDED, T0 + 60, "train-20260101-000000")
        assert store.unfinished() == []
        with pytest.raises(QueueError, match="q-1 is succeeded: it cannot become failed"):
            store.finish(id_, EntryState.FAILED, "late", T0 + 61)


KILLED_MID_START = """
import os, signal, sys
from homegpu.remote.queue import QueueStore
store = QueueStore(sys.argv[1])
store.mark_starting("q-1", "train-r1", 1.0)
os.kill(os.getpid(), signal.SIGKILL)  # serve killed as its launch begins: nothing closed, nothing flushed
"""


def test_a_serve_killed_mid_start_leaves_the_start_recorded(path: Path) -> None:
    with QueueStore(path) as store:
        submit(store)
    killed = subprocess.run([sys.executable, "-c", KILLED_MID_START, str(path)], capture_output=True, text=True)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    with QueueStore(path) as store:
        entry = store.get("q-1")
        assert (entry.state, entry.run_id) == (EntryState.STARTING, "train-r1")
        assert [e.id for e in store.unfinished()] == ["q-1"]
        with pytest.raises(QueueError, match="not waiting"):
            store.mark_starting("q-1", "train-r2", 2.0)


def test_a_start_rolled_back_leaves_the_entry_waiting(path: Path) -> None:
    """The transaction: a failure inside it (here a run id SQLite refuses) changes nothing."""
    with QueueStore(path) as store:
        id_ = submit(store)
        with pytest.raises(sqlite3.Error):
            store.mark_starting(id_, object(), T0)  # type: ignore[arg-type]
        assert store.get(id_).state is EntryState.WAITING
        assert store.mark_starting(id_, "r1", T0).state is EntryState.STARTING


def test_cancel(path: Path) -> None:
    with QueueStore(path) as store:
        waiting, running = submit(store), submit(store)
        store.mark_starting(running, "r2", T0)
        cancelled = store.cancel(waiting, "cancelled by alice", T0 + 1)
        assert (cancelled.state, cancelled.reason, cancelled.ended) == (
            EntryState.CANCELLED, "cancelled by alice", T0 + 1)
        assert store.cancel(running, "cancelled by alice", T0 + 1).state is EntryState.STARTING  # the runner stops it
        assert store.finish(running, EntryState.CANCELLED, "cancelled by alice", T0 + 2).state is EntryState.CANCELLED
        with pytest.raises(QueueError, match=r"^q-1 has already been cancelled: there is nothing to cancel$"):
            store.cancel(waiting, "again", T0 + 3)
        with pytest.raises(QueueError, match=r"^no queue entry q-9: `homegpu queue` lists them$"):
            store.cancel("q-9", "x", T0)


def test_reasons_are_kept_for_waiting_entries_only(path: Path) -> None:
    with QueueStore(path) as store:
        a, b = submit(store), submit(store)
        store.mark_starting(b, "r", T0)
        store.note_reasons({a: "node closet offline", b: "ignored"})
    with QueueStore(path) as store:
        assert (store.get(a).reason, store.get(b).reason) == ("node closet offline", "")


def test_a_running_entry_keeps_what_became_of_its_run(path: Path) -> None:
    """A run that went on with fewer machines says so in `homegpu queue` (remote/jobs/fewer.py's line)."""
    line = "closet lost (offline 300 s): going on with desktop from epoch 3 (global batch 128 kept: 128 per worker)"
    with QueueStore(path) as store:
        a, b = submit(store), submit(store)
        store.mark_starting(a, "r", T0)
        store.mark_running(a)
        assert store.note_reasons({a: line, b: "ignored"}, EntryState.RUNNING) == 1
    with QueueStore(path) as store:
        assert (store.get(a).reason, store.get(b).reason) == (line, "")


def test_ids_as_people_write_them() -> None:
    assert entry_number("q-12") == entry_number("12") == 12
    for bad in ("q12", "q-0", "x", "", "q--1", "1" * 30):
        with pytest.raises(QueueError, match=r"is not a queue id: use an id like q-12"):
            entry_number(bad)


def test_a_restarted_serve_attaches_or_fails(path: Path) -> None:
    with QueueStore(path) as store:
        starting, running = submit(store), submit(store)
        store.mark_starting(starting, "train-a", T0)
        store.mark_starting(running, "train-b", T0)
        store.mark_running(running)
        a, b = store.get(starting), store.get(running)
    assert resume_action(a, workers_found=True).action == ATTACH
    assert resume_action(b, workers_found=True).action == ATTACH
    assert resume_action(a, workers_found=False) == Resume(
        FAIL, "serve stopped while starting run train-a and no worker of it is left; submit it again")
    assert resume_action(b, workers_found=False).reason == (
        "run train-b ended while serve was stopped; see experiments/train-b/")


@pytest.mark.parametrize("content, why", [
    (b"", "an empty file"),
    (b"not a database at all, just text" * 100, "file is not a database"),
])
def test_a_damaged_file_is_one_line_naming_it(path: Path, content: bytes, why: str) -> None:
    path.parent.mkdir(parents=True)
    path.write_bytes(content)
    with pytest.raises(QueueDamaged) as caught:
        QueueStore(path)
    message = str(caught.value)
    assert "\n" not in message and message.startswith(f"{path} is damaged ({why})")
    assert f"mv {path} {path}.damaged" in message
    assert path.read_bytes() == content  # left as it was


def test_another_sqlite_file_is_not_taken_for_a_queue(path: Path) -> None:
    path.parent.mkdir(parents=True)
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE entries (id INTEGER)")
    db.commit()
    db.close()
    with pytest.raises(QueueDamaged, match="not a homegpu queue file"):
        QueueStore(path)


def test_a_truncated_queue_is_damaged(path: Path) -> None:
    with QueueStore(path) as store:
        for _ in range(200):
            submit(store, overrides=("args=" + "x" * 200,))
    db = sqlite3.connect(path)
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    db.close()
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(QueueDamaged, match=rf"^{path} is damaged \("):
        QueueStore(path)


def test_the_queue_lives_beside_the_history(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path))
    (tmp_path / "cluster.toml").write_text('[cluster]\nname = "lab"\n[[nodes]]\nname = "a"\nhost = "localhost"\n')
    spec = load_cluster(tmp_path / "cluster.toml")
    history = history_path(spec)
    assert queue_path(spec) == history.with_name(history.name.replace("history-", "queue-"))
    assert queue_path(spec).name.startswith("queue-lab-")

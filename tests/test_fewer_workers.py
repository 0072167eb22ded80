"""A run that goes on with fewer machines, and one that takes a machine back (issue 37): the job on the nodes left,
its batch, the lines that say so (remote/jobs/fewer.py), and the chief's backup kept off the chief and put onto
every worker (remote/jobs/backup_copy.py, through the local node's real file transfer and sync). On the LAN:
tests/test_fewer_workers_lan.py and tests/test_fewer_workers_scripts_lan.py."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from homegpu.remote.config import JobSpec, embedded_default
from homegpu.remote.jobs import backup_copy
from homegpu.remote.jobs.backup_copy import BackupCopy, complete
from homegpu.remote.jobs.checkpoint_copy import CheckpointCopy
from homegpu.remote.jobs.fewer import (
    FewerWorkersRefused, batch_for, check_enough, going_on_line, job_with, job_without, rejoining_line,
)
from homegpu.remote.events import Metric, NodeState
from homegpu.remote.jobs.outputs import fetch_outputs
from homegpu.remote.jobs.resume_check import FirstEpochs
from homegpu.remote.jobs.run_backups import finished_here
from homegpu.remote.jobs.run_members import Members
from homegpu.remote.nodes import Cluster, TransportError

EVERY = ["desktop", "laptop", "closet"]


def test_the_job_on_the_nodes_left_keeps_their_order_and_takes_them_back_in_it() -> None:
    job = JobSpec(name="demo", nodes=tuple(EVERY), min_workers=2)
    left = job_without(job, EVERY, ["desktop"])
    assert left.nodes == ("laptop", "closet")  # laptop is the chief now
    assert job_with(left, EVERY, ["desktop"]).nodes == tuple(EVERY)  # desktop the chief again


def test_a_lost_node_is_taken_back_once_online_and_past_its_login() -> None:
    """A node whose login shell is stuck (a stale pyenv lock: NodeSession.waiting_on says so) is not taken back: the
    run would wait on it at the epoch's end. Plain stand-ins for the run and its nodes: only their states matter."""
    nodes = {"desktop": SimpleNamespace(state=NodeState.ONLINE, waiting_on=""),
             "laptop": SimpleNamespace(state=NodeState.ONLINE, waiting_on="its login shell had not run a command …"),
             "closet": SimpleNamespace(state=NodeState.ONLINE, waiting_on="")}
    lost = [SimpleNamespace(slot=SimpleNamespace(node=SimpleNamespace(name=name))) for name in ("laptop", "closet")]
    run = SimpleNamespace(lost_tracks=lost, every_node=EVERY, cluster=SimpleNamespace(node=nodes.__getitem__))
    members = Members(run, generations=None, backups=None)
    assert members.returned() == ["closet"]
    nodes["laptop"].waiting_on = ""  # its login ended
    nodes["closet"].state = NodeState.OFFLINE
    assert members.returned() == ["laptop"]


@pytest.mark.parametrize("policy, workers, expected", [
    ("keep-global-batch", 2, (96, "global batch 192 kept: 96 per worker")),
    ("keep-worker-batch", 2, (64, "global batch 128 of 192: 64 per worker; the learning rate may need to follow")),
    ("keep-global-batch", 3, (64, "global batch 192 as at the start: 64 per worker")),
])
def test_the_batch_follows_on_fewer_workers(policy, workers, expected) -> None:
    job = JobSpec(name="demo", batch_size=64, on_fewer_workers=policy)
    assert batch_for(job, 64, 3, workers) == expected


def test_a_global_batch_that_does_not_split_is_refused_with_the_fix() -> None:
    with pytest.raises(FewerWorkersRefused, match='the global batch 100 does not split evenly over 3 workers; set '
                                                 'batch_size so that it does, or on_fewer_workers = "keep-worker-batch"'):
        batch_for(JobSpec(name="demo", batch_size=25), 25, 4, 3)
    script = JobSpec(name="mine", script="train.py")
    assert batch_for(script, 64, 3, 2) == (64, "the script's own batch")


def test_too_few_left_or_no_min_workers_fails_with_why_the_node_is_gone() -> None:
    gone = "closet did not come back within 300 s (offline: no route to host)"
    with pytest.raises(FewerWorkersRefused) as refused:
        check_enough(JobSpec(name="demo"), 2, 3, gone)
    assert str(refused.value) == gone  # today's behaviour: the run fails on the node
    with pytest.raises(FewerWorkersRefused) as refused:
        check_enough(JobSpec(name="demo", min_workers=3), 2, 3, gone)
    assert str(refused.value) == f"{gone}; 2 of 3 workers left, fewer than the job's min_workers = 3"
    check_enough(JobSpec(name="demo", min_workers=2), 2, 3, gone)


def test_the_lines_say_who_left_who_goes_on_from_which_epoch_and_the_batch() -> None:
    assert going_on_line([("closet", "offline")], 300, ["desktop", "laptop"], 3,
                         "global batch 192 kept: 96 per worker") == (
        "closet lost (offline 300 s): going on with desktop, laptop from epoch 4 (global batch 192 kept: 96 per worker)")
    assert rejoining_line(["closet"], EVERY, None, "the script's own batch") == (
        "closet back: rejoining with desktop, laptop, closet from the script's own checkpoint if it keeps one, else "
        "from its start (the script's own batch)")


def write_checkpoint(folder, number: int, data: bool = True) -> None:
    """A TensorFlow checkpoint dir as BackupAndRestore leaves it (the file names tf.train.CheckpointManager uses)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "checkpoint").write_text(f'model_checkpoint_path: "ckpt-{number}"\n'
                                       f'all_model_checkpoint_paths: "ckpt-{number}"\n')
    (folder / f"ckpt-{number}.index").write_bytes(b"index")
    if data:
        (folder / f"ckpt-{number}.data-00000-of-00001").write_bytes(b"weights" * 100)


def test_a_copy_taken_mid_save_is_not_complete(tmp_path) -> None:
    write_checkpoint(tmp_path / "saved" / "chief", 3)
    assert complete(tmp_path / "saved")
    write_checkpoint(tmp_path / "mid-save" / "chief", 4, data=False)  # the index written, its data not yet
    assert not complete(tmp_path / "mid-save")


async def test_the_chiefs_backup_is_copied_off_it_and_put_onto_every_worker(tmp_path) -> None:
    chief, other = tmp_path / "node1" / "backup", tmp_path / "node2" / "backup"
    write_checkpoint(chief / "chief", 2)
    (chief / "last_epoch.json").write_text('{"epoch": 2}')
    write_checkpoint(other / "chief", 1)  # an older one, as a worker that missed a save has
    copy = BackupCopy(tmp_path / "experiments" / "run" / "chief-backup")
    async with Cluster(embedded_default(), stream_stats=False) as cluster:
        node = cluster.node("local")
        await node.wait_online(60)
        assert await copy.put([(node, str(other))]) == []  # no copy yet: nothing is put
        assert await copy.take(node, str(chief), 2) == "" and copy.epoch == 2
        assert await copy.take(node, str(tmp_path / "no-backup"), 3) == "" and copy.epoch == 2  # a script with none
        assert await copy.put([(node, str(other)), (node, str(tmp_path / "node3" / "backup"))]) == []
        small = BackupCopy(tmp_path / "small", cap=100)
        refused = await small.take(node, str(chief), 2)
    for worker in (other, tmp_path / "node3" / "backup"):
        assert sorted(p.relative_to(worker).as_posix() for p in worker.rglob("*") if p.is_file()) == [
            "chief/checkpoint", "chief/ckpt-2.data-00000-of-00001", "chief/ckpt-2.index", "last_epoch.json"]
    assert refused.startswith("the chief's backup is ") and ", past the 100 B homegpu copies off the chief" in refused
    assert small.epoch is None


async def test_a_save_that_lands_while_the_copy_is_sent_leaves_the_copy_whole(tmp_path) -> None:
    """On a busy machine sending the chief's backup can take longer than an epoch, and the chief's next save removes
    the files being sent (the tutorial test failed so: every copy broke until the chief's machine left). The copy is
    sent from a hard-linked snapshot made in moments, so it holds the save that was whole, and the snapshot goes."""
    chief = tmp_path / "node1" / "out" / "backup"
    write_checkpoint(chief / "chief", 2)
    copy = BackupCopy(tmp_path / "experiments" / "run" / "chief-backup")
    async with Cluster(embedded_default(), stream_stats=False) as cluster:
        node = cluster.node("local")
        await node.wait_online(60)

        class SavingWhileSent:  # the local node, where the chief's next save is half-way as the copy is sent
            name, transport, list_tree, run = node.name, node.transport, node.list_tree, node.run

            async def get_tree(self, remote_dir, local_dir) -> None:
                for old in (chief / "chief").glob("ckpt-2.*"):
                    old.unlink()
                (chief / "chief" / "ckpt-3.data-00000-of-00001").write_bytes(b"new weights")
                await node.get_tree(remote_dir, local_dir)

        assert await copy.take(SavingWhileSent(), str(chief), 2) == ""
    assert copy.epoch == 2 and complete(copy.folder)
    assert sorted(p.name for p in (copy.folder / "chief").iterdir()) == [
        "checkpoint", "ckpt-2.data-00000-of-00001", "ckpt-2.index"]
    assert sorted(p.name for p in chief.parent.iterdir()) == ["backup"]  # the snapshot is gone


async def test_the_chiefs_outputs_leave_its_backup_and_a_copys_snapshot_on_the_node(tmp_path) -> None:
    """A copy still in flight as the run ends has its snapshot beside the backup while the outputs come home."""
    chief = tmp_path / "out"
    write_checkpoint(chief / "backup" / "chief", 2)
    write_checkpoint(chief / backup_copy.SNAPSHOT / "chief", 2)
    (chief / "model.keras").write_bytes(b"model")
    async with Cluster(embedded_default(), stream_stats=False) as cluster:
        node = cluster.node("local")
        await node.wait_online(60)
        fetched = await fetch_outputs(node, str(chief), tmp_path / "home")
    assert fetched.fetched == ("model.keras",) and not fetched.error
    assert sorted(p.name for p in (tmp_path / "home").iterdir()) == ["model.keras"]


async def test_a_copy_that_caught_the_chief_saving_is_taken_again_at_once_not_an_epoch_later(monkeypatch) -> None:
    monkeypatch.setattr(backup_copy, "MID_SAVE_WAIT_S", 0)

    class SavingChief:  # the chief's first copy catches its save half-written, the next one finds it whole
        what, epoch, refused, tries = "backup", None, "", 0

        async def take(self, node, remote_dir, epoch) -> str:
            self.tries += 1
            if self.tries == 1:
                return backup_copy.MID_SAVE
            self.epoch = epoch
            return ""

    copy, said = SavingChief(), []
    keeper = backup_copy.BackupKeeper(copy, lambda: [(None, "backup", 2)], said.append)
    keeper.after_epoch()
    await keeper._copying
    assert (copy.epoch, copy.tries, said) == (2, 2, [])


async def test_copies_that_keep_failing_are_said_once_until_one_is_taken_again(monkeypatch) -> None:
    """A copy that catches the chief saving at every try, or whose transfer breaks with its node still there (a
    file the next save replaced as tar read it), is tried again at once; one still failing is said, once a streak:
    before, a copy that kept failing was silent until the chief's machine left and the run went on from epoch 1."""
    monkeypatch.setattr(backup_copy, "MID_SAVE_WAIT_S", 0)
    node1 = SimpleNamespace(name="node1", transport=object())
    assert backup_copy.gone_or_mid_save(node1) == backup_copy.MID_SAVE
    assert backup_copy.gone_or_mid_save(SimpleNamespace(name="node1", transport=None)) == ""  # gone: it says so

    class BusyChief:  # each epoch: how many tries catch the save before one copies it whole
        what, epoch, refused = "backup", None, ""
        caught = {1: 9, 2: 9, 3: 1, 4: 9}
        tries: list[int] = []

        async def take(self, node, remote_dir, epoch) -> str:
            self.tries.append(epoch)
            if self.tries.count(epoch) <= self.caught[epoch]:
                return backup_copy.MID_SAVE
            self.epoch = epoch
            return ""

    copy, said, chief_epoch = BusyChief(), [], [0]
    keeper = backup_copy.BackupKeeper(copy, lambda: [(node1, "backup", chief_epoch[0])], said.append)
    for epoch in (1, 2, 3, 4):
        chief_epoch[0] = epoch
        keeper.after_epoch()
        await keeper._copying
    tries = backup_copy.MID_SAVE_TRIES
    assert [copy.tries.count(epoch) for epoch in (1, 2, 3, 4)] == [tries, tries, 2, tries] and copy.epoch == 3
    assert said == [
        f"could not copy the chief's backup of epoch 1 off node1: the chief was saving it at each of {tries} tries "
        "(the copy holds none yet; the next epoch's copy tries again)",
        f"could not copy the chief's backup of epoch 4 off node1: the chief was saving it at each of {tries} tries "
        "(the copy holds epoch 3; the next epoch's copy tries again)"]


async def test_each_epoch_is_copied_once_even_where_the_chief_has_nothing_to_copy() -> None:
    """A script that keeps no checkpoint in its working dir, or a chief whose training ended and removed its backup,
    leaves nothing to copy: before, the keeper listed the chief's folder again at every check (a process on the
    chief's node each second) until the next epoch. Each epoch is tried once; a new generation's tried again."""

    class EmptyChief:
        what, epoch, refused = "checkpoint", None, ""
        takes: list[int] = []

        async def take(self, node, remote_dir, epoch) -> str:
            self.takes.append(epoch)
            return ""

    copy, chief_epoch = EmptyChief(), [0]
    keeper = backup_copy.BackupKeeper(copy, lambda: [(None, "out", chief_epoch[0])], print)
    for epoch in (0, 1, 1, 1, 2, 2):
        chief_epoch[0] = epoch
        keeper.after_epoch()
        if keeper._copying is not None:
            await keeper._copying
    assert copy.takes == [1, 2]
    await keeper.refresh()  # a generation ends: its chief's files are taken whatever was tried
    keeper.after_epoch()
    await keeper._copying
    assert copy.takes == [1, 2, 2, 2]


async def test_a_listing_that_failed_with_the_chiefs_node_there_is_tried_again_not_dropped(tmp_path) -> None:
    """`find` fails where a file vanishes as it walks the folder (a save replacing its temporary files): with the node
    still there that copy is tried again shortly, as one that caught the save half-written; a gone node's is not."""
    def chief(transport):
        async def list_tree(remote_dir, skip):
            raise TransportError("cannot list out/backup: find: 'out/backup/chief/ckpt-3_temp': No such file")
        return SimpleNamespace(name="node1", transport=transport, list_tree=list_tree)

    for copy in (BackupCopy(tmp_path / "backup"), CheckpointCopy(tmp_path / "checkpoint")):
        assert await copy.take(chief(object()), "out/backup", 3) == backup_copy.MID_SAVE
        assert await copy.take(chief(None), "out/backup", 3) == ""
        assert copy.epoch is None


def test_a_workers_epochs_count_for_its_backup_once_it_finished_one_in_this_generation() -> None:
    """A new generation's tracks still hold the last one's figures: the chief's epoch 3 there, where its backup was
    restored from a copy of epoch 2, must not label a copy of that backup as epoch 3."""
    track = SimpleNamespace(last_metric=SimpleNamespace(epoch=3), first_epochs=FirstEpochs())
    assert finished_here(track) == 0
    track.first_epochs.note(Metric({"event": "epoch", "epoch": 3}))
    assert finished_here(track) == 3

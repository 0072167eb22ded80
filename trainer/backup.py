"""BackupAndRestore for machines with their own disks: every worker backs up locally.

Stock tf-keras BackupAndRestore lets only the chief write the backup and makes every worker
restore from `<backup_dir>/chief`. That is right on a shared filesystem and wrong on home machines
with their own disks: a restarted non-chief worker finds no backup, starts at epoch 0 with fresh
weights while the chief resumes, and the workers' step counts and weights no longer match.

Saving a backup is collective under MultiWorkerMirroredStrategy anyway (every worker runs
`save()`, non-chief ones into a temporary directory that is then deleted), so all workers already
hold the same state at the same moment. NodeLocalBackup only keeps each worker's copy instead of
deleting it. Before restoring, the workers compare the epochs their backups hold: a worker
killed between two workers' saves, or a machine whose backup was lost, would otherwise restore
different states (and, with no backup on one side, different collective ops: an obscure error).

The backup outlives fit(): stock BackupAndRestore deletes it when training ends, before the final
model is saved, so a crash during that save (tens of seconds for a big model) retrained from epoch
0. Here it stays, and a `DONE` marker next to the model says the run is complete; the controller
removes backups once it has fetched the model. A restart finds one of three states on every worker:
no marker (resume from the backup, at the last completed epoch even when that was the last one),
a marker on every worker (nothing to do), or markers on some only (resume and save again).
"""

from __future__ import annotations

import json
import os
import sys
import time

import tensorflow as tf
import tf_keras as keras


SAVED_EPOCH_KEY = "ckpt_saved_epoch/.ATTRIBUTES/VARIABLE_VALUE"  # tf-keras WorkerTrainingState's
DONE_MARKER = "DONE"  # in a worker's output dir, next to the chief's model/


class BackupMismatchError(RuntimeError):
    """The workers' backups hold different epochs; they cannot resume together."""


class NodeLocalBackup(keras.callbacks.BackupAndRestore):
    """BackupAndRestore(backup_dir) where each worker keeps (and restores) its own backup.

    From `on_train_begin` on, `resume_epoch` is the number of epochs the restored backup had
    completed (0 when there was none), which is where fit() continues.

    Args:
        backup_dir: this worker's backup directory, on its own disk; the same path across restarts.
        multi_worker: whether other workers take part (then restored epochs are compared).
    """

    def __init__(self, backup_dir: str, *, multi_worker: bool) -> None:
        super().__init__(backup_dir, delete_checkpoint=False)  # kept until the model is safe
        self.multi_worker = multi_worker
        self.resume_epoch = 0

    def on_train_begin(self, logs=None):
        self.resume_epoch = backed_up_epochs(self.backup_dir)
        if self.multi_worker and not all_agree(self.model.distribute_strategy, self.resume_epoch):
            raise BackupMismatchError(
                f"the workers' backups hold different epochs (this worker's: {self.resume_epoch}), so "
                f"they cannot resume together; delete the backup directory on every machine "
                f"({self.backup_dir} here) to start over")
        super().on_train_begin(logs)  # builds the training state and restores the local backup
        state = self._training_state
        if state.write_checkpoint_manager is not state.read_checkpoint_manager:
            unused_temp = state.write_checkpoint_manager.directory
            state.write_checkpoint_manager = state.read_checkpoint_manager
            if tf.io.gfile.exists(unused_temp):
                tf.io.gfile.rmtree(unused_temp)
        if self.resume_epoch:
            print(f"homegpu.trainer: resumed at epoch {self.resume_epoch} from the backup in {self.backup_dir}",
                  file=sys.stderr, flush=True)


def backed_up_epochs(backup_dir: str) -> int:
    """How many epochs the backup in `backup_dir` completed (0: no backup): where fit() resumes."""
    path = tf.train.latest_checkpoint(os.path.join(backup_dir, "chief"))
    if path is None:
        return 0
    saved = int(tf.train.load_checkpoint(path).get_tensor(SAVED_EPOCH_KEY))
    return saved + 1 if saved >= 0 else 0


def all_agree(strategy: tf.distribute.Strategy, epoch: int) -> bool:
    """True when every replica passed the same number (a collective: all workers must call it).

    Sums epoch and epoch² over the n replicas: all equal exactly when n·Σe² == (Σe)², and every
    worker computes the same answer, so they all fail or all go on together.
    """
    value = tf.constant([float(epoch), float(epoch) ** 2])
    per_replica = strategy.run(tf.function(lambda: tf.identity(value)))
    total = strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None).numpy()
    n = strategy.num_replicas_in_sync
    return abs(n * float(total[1]) - float(total[0]) ** 2) < 0.5


def done_epochs(output_dir: str) -> int:
    """The epochs the `DONE` marker in `output_dir` records (0: no marker, or one unreadable)."""
    epochs = read_json(os.path.join(output_dir, DONE_MARKER)).get("epochs")
    return epochs if isinstance(epochs, int) else 0


def all_done(strategy: tf.distribute.Strategy, output_dir: str, epochs: int) -> bool:
    """True when every worker's marker says `epochs` or more were trained and saved (collective).

    A worker without one (killed between the chief's marker and its own) makes all of them train:
    they resume from their backups, fit() has nothing left to run, and the model is saved again.
    """
    done = done_epochs(output_dir) >= epochs
    return all_agree(strategy, int(done)) and done


def mark_done(output_dir: str, epochs: int, **fields) -> None:
    """Write the `DONE` marker, after the final save."""
    write_json(os.path.join(output_dir, DONE_MARKER), {"epochs": epochs, "time": round(time.time(), 3), **fields})


def write_json(path: str, data: dict) -> None:
    """Write `data` to `path` atomically: a reader (or a restart after a crash) finds the complete
    file or the previous one, never half of it."""
    partial = path + ".partial"
    with open(partial, "w", encoding="utf-8") as handle:
        json.dump(data, handle)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(partial, path)


def read_json(path: str) -> dict:
    """What write_json wrote ({} when there is no such file or it is not a JSON object)."""
    try:
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def clear_done(output_dir: str) -> None:
    """Remove a stale marker before saving again, so a half-written model is never marked done."""
    for name in (DONE_MARKER, DONE_MARKER + ".partial"):
        try:
            os.remove(os.path.join(output_dir, name))
        except FileNotFoundError:
            pass

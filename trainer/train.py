"""`python -m homegpu.trainer`: train under MultiWorkerMirroredStrategy from TF_CONFIG.

Each worker writes only to its own --output directory (nodes have their own disks): its backup
for BackupAndRestore, and, on the chief alone, TensorBoard logs and the final model. Other workers
write TensorBoard and the model to temporary directories they delete, as TF's multi-worker
tutorial shows. Progress goes to stdout as metric lines (PROTOCOL.md).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ["TF_USE_LEGACY_KERAS"] = "1"  # tf-keras: Keras 3 fails under MultiWorkerMirroredStrategy

from homegpu.trainer.cluster import ClusterConfigError, WorkerRole, worker_role  # noqa: E402
from homegpu.trainer.data import DataError  # noqa: E402
from homegpu.trainer.metrics import format_metric  # noqa: E402


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m homegpu.trainer",
        description="Train an image classifier with tf-keras under MultiWorkerMirroredStrategy. "
                    "The cluster comes from TF_CONFIG (none: one worker). Progress is printed as "
                    "HOMEGPU_METRIC lines (see PROTOCOL.md).")
    parser.add_argument("--data", default="synthetic",
                        help="synthetic (no download, the default), npz:PATH (mnist format) or dir:PATH "
                             "(one folder per class)")
    parser.add_argument("--model", default="cnn", choices=("cnn", "resnet"), help="default: cnn")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=64, help="per worker (default 64)")
    parser.add_argument("--steps-per-epoch", type=int, default=0, help="default: the whole set once")
    parser.add_argument("--output", default="homegpu-output",
                        help="backup, TensorBoard logs and (chief) the final model go here")
    parser.add_argument("--log-every", type=int, default=10, help="a step metric every N steps")
    parser.add_argument("--learning-rate", type=float, default=1e-3)
    parser.add_argument("--image-size", type=int, default=32, help="synthetic and dir: images are N×N")
    parser.add_argument("--samples", type=int, default=4096, help="synthetic: how many images")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    for name in ("epochs", "batch_size", "log_every", "image_size", "samples"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        role = worker_role(os.environ)
        return train(args, role)
    except (ClusterConfigError, DataError) as exc:
        print(f"homegpu.trainer: {exc}", file=sys.stderr)
        print(format_metric(event="error", message=str(exc)), flush=True)
        return 2


def train(args: argparse.Namespace, role: WorkerRole) -> int:
    import tensorflow as tf
    import tf_keras as keras

    from homegpu.trainer import data, models
    from homegpu.trainer.progress import MetricLines

    # One worker needs no collectives; MWMS would still want a cluster to talk to.
    strategy = tf.distribute.MultiWorkerMirroredStrategy() if role.multi_worker else tf.distribute.get_strategy()
    dataset = data.load(args.data, image_size=args.image_size, samples=args.samples, seed=args.seed)
    global_batch = args.batch_size * role.workers
    steps = args.steps_per_epoch or max(1, len(dataset.labels) // global_batch)

    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    train_data = (tf.data.Dataset.from_tensor_slices((dataset.images, dataset.labels))
                  .shuffle(min(len(dataset.labels), 10_000), seed=args.seed).repeat()
                  .batch(global_batch, drop_remainder=True).prefetch(tf.data.AUTOTUNE).with_options(options))

    with strategy.scope():
        model = models.build(args.model, dataset.input_shape, dataset.num_classes)
        model.compile(optimizer=keras.optimizers.Adam(args.learning_rate),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      metrics=["accuracy"])

    output = os.path.abspath(os.path.expanduser(args.output))
    os.makedirs(output, exist_ok=True)
    scratch = tempfile.mkdtemp(prefix="homegpu-worker-")
    try:
        progress = MetricLines(role, args.epochs, args.batch_size, args.log_every, dataset.description)
        callbacks = [
            _own_backup_class()(os.path.join(output, "backup")),
            keras.callbacks.TensorBoard(os.path.join(output if role.is_chief else scratch, "tensorboard")),
            progress,
        ]
        model.fit(train_data, epochs=args.epochs, steps_per_epoch=steps, callbacks=callbacks, verbose=0)
        model.save(os.path.join(output if role.is_chief else scratch, "model"))
        progress.finish()
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return 0


def _own_backup_class():
    """Built on first use: importing tf_keras at module import would cost seconds for --help."""
    import tf_keras as keras

    class OwnBackup(keras.callbacks.BackupAndRestore):
        """BackupAndRestore where every worker keeps its backup on its own disk.

        Stock BackupAndRestore lets only the chief write the backup and has every worker read the
        chief's: right on a shared filesystem, wrong on home machines with their own disks, where
        a non-chief worker would find no backup, start at epoch 0 while the chief resumes, and the
        collectives would never line up. Saving is collective either way, so all workers hold
        the same epoch's state.
        """

        def on_train_begin(self, logs=None):
            super().on_train_begin(logs)
            state = self._training_state
            state.write_checkpoint_manager = state.read_checkpoint_manager

    return OwnBackup

"""One training run under MultiWorkerMirroredStrategy, from parsed options (cli.py).

The strategy is MWMS even for one worker without TF_CONFIG: it then mirrors over all of this
machine's GPUs (the default strategy would use only the first), and one worker runs exactly the
code path that several do.

Outputs, each under this worker's --output (nodes have their own disks):
- backup/: this worker's BackupAndRestore state (backup.py), kept after the run: a crash while
  the model is saved resumes at the last epoch instead of epoch 0; the controller removes it;
- DONE: written once the final save succeeded (backup.py); a restart that finds it on every
  worker trains nothing;
- chief only: checkpoints/last.weights.h5 after every epoch, tensorboard/, and the final model/
  (a SavedModel). The other workers must take part in writing these (saving is collective), so
  they write into a scratch directory that is deleted at the end, the pattern TF's multi-worker
  tutorial shows. It is `.scratch-worker<rank>` under --output rather than in /tmp, so that the
  leftovers of a killed worker are cleared when it restarts.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import signal
import sys

import tensorflow as tf
import tf_keras as keras

from homegpu.trainer import balance_tf, data, models, shares
from homegpu.trainer.backup import NodeLocalBackup, all_done, clear_done, mark_done, read_json, write_json
from homegpu.trainer.cluster import WorkerRole
from homegpu.trainer.coordination import peer_timeout, tolerate_quiet_peers
from homegpu.trainer.link_patience import keep_links_through_drops
from homegpu.trainer.progress import MetricLines, emit

LAST_EPOCH_FILE = "last_epoch.json"  # in backup/


def run(args: argparse.Namespace, role: WorkerRole) -> None:
    """Train, back up every epoch, save the model. Raises on any failure (cli.py turns it into
    an error line and exit status)."""
    # Before any other TF op, as MWMS needs. A Wi-Fi drop as long as the peer timeout then ends
    # neither the coordination service's patience nor gRPC's connections (link_patience.py).
    if role.multi_worker:
        tolerate_quiet_peers(peer_timeout())
        keep_links_through_drops(peer_timeout())
    strategy = tf.distribute.MultiWorkerMirroredStrategy(communication_options=communication_options(args.collective))
    _exit_on_sigterm()
    keras.utils.set_random_seed(args.seed)
    if os.environ.get("TF_CPP_MIN_LOG_LEVEL", "").strip() in ("2", "3"):
        tf.get_logger().setLevel("ERROR")  # the Python side, to match the C++ log level
    output = os.path.abspath(args.output)
    os.makedirs(output, exist_ok=True)
    if all_done(strategy, output, args.epochs):
        _report_already_done(role, output, args.epochs)
        return
    clear_done(output)

    global_batch = args.batch_size * role.workers
    sets = data.load(args.data.kind, args.data.path, global_batch=global_batch, seed=args.seed,
                     image_size=args.image_size, samples=args.samples)
    steps = args.steps_per_epoch or max(1, sets.train_examples // global_batch)
    validation_steps = sets.validation_examples // global_batch if sets.validation is not None else 0
    # each replica's share of a step follows its speed (balance_tf.py), wherever the trainer runs
    balancer = balance_tf.Balancer(strategy, global_batch, seed=args.seed, shuffle_buffer=data.SHUFFLE_BUFFER,
                                   by_hand_too=True)

    with strategy.scope():
        model = balancer.model(models.build(args.model, sets.input_shape, sets.num_classes))
        model.compile(optimizer=keras.optimizers.Adam(args.learning_rate),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      metrics=["accuracy"])
        model.distribute_reduction_method = "first"  # the batch logs unsummed: no collective a step for them

    scratch = None if role.is_chief else os.path.join(output, f".scratch-worker{role.rank}")
    if scratch:
        shutil.rmtree(scratch, ignore_errors=True)
    chief_dir = output if role.is_chief else scratch  # where chief-only files go on this worker
    tensorboard = not args.no_tensorboard and importlib.util.find_spec("tensorboard") is not None

    backup = NodeLocalBackup(os.path.join(output, "backup"), multi_worker=role.multi_worker)
    progress = MetricLines(
        role, epochs=args.epochs, local_batch=args.batch_size, log_every=args.log_every,
        resume_epoch=lambda: backup.resume_epoch,
        start_fields=dict(data=str(args.data), model=args.model, params=model.count_params(),
                          steps_per_epoch=steps, collective=strategy_collective(strategy, args.collective),
                          replicas=strategy.num_replicas_in_sync,
                          batch_size=args.batch_size, global_batch_size=global_batch,
                          train_examples=sets.train_examples, validation_steps=validation_steps,
                          tensorboard=tensorboard, **({"shares": balancer.schedule.current} if balancer.on else {})))
    if balancer.on:
        _tell_shares(balancer, role, progress)
    callbacks = [
        backup,  # first: MetricLines reads what it restored, and an epoch line follows its backup
        balancer.callback,  # before the epoch line, which tells its shares
        keras.callbacks.ModelCheckpoint(os.path.join(chief_dir, "checkpoints", "last.weights.h5"),
                                        save_weights_only=True),
    ]
    if tensorboard:
        callbacks.append(keras.callbacks.TensorBoard(os.path.join(chief_dir, "tensorboard"), profile_batch=0))
    callbacks += [progress, _KeepLastEpoch(progress, os.path.join(backup.backup_dir, LAST_EPOCH_FILE))]

    try:
        train = balancer.dataset(sets.examples, data.to_float, sets.decode) if balancer.on else sets.train
        model.fit(train, epochs=args.epochs, steps_per_epoch=steps,
                  callbacks=callbacks, verbose=0,
                  validation_data=sets.validation if validation_steps else None,
                  validation_steps=validation_steps or None)
        model_dir = os.path.join(chief_dir, "model")
        _save(model, model_dir, role, args.epochs)
        mark_done(output, args.epochs, **({"model_dir": model_dir} if role.is_chief else {}))
        if not progress.last:  # resumed at the last epoch: its figures come from before the crash
            kept = read_json(os.path.join(backup.backup_dir, LAST_EPOCH_FILE))
            progress.last = kept if kept.get("epoch") == backup.resume_epoch else \
                {"epoch": backup.resume_epoch, "epochs": args.epochs}
        progress.finish(**({"model_dir": model_dir} if role.is_chief else {}))
    finally:
        if scratch:
            shutil.rmtree(scratch, ignore_errors=True)


def _tell_shares(balancer: balance_tf.Balancer, role: WorkerRole, progress: MetricLines) -> None:
    """`progress` told this worker's share of a step as it changes (its examples/s), and each epoch line the
    shares, this worker's compute speed, and its step in parts (compute, overhead, wait)."""
    local = balancer.schedule.replicas // role.workers
    mine = slice(role.rank * local, (role.rank + 1) * local)

    def share(new: list[int]) -> None:
        progress.local_batch = sum(new[mine])
    share(balancer.schedule.current)
    balancer.heard.append(share)
    rebalance = balancer.callback
    progress.epoch_fields = lambda: {
        "shares": balancer.schedule.current,
        **shares.step_parts(max(balancer.schedule.current[mine]), rebalance.speeds[role.rank],
                            rebalance.overheads[role.rank], rebalance.step_seconds)}


class _KeepLastEpoch(keras.callbacks.Callback):
    """Keeps the last epoch line's figures next to the backup, so that a run resumed at its last
    epoch (nothing left to train, only the save) still ends with its loss and accuracy."""

    def __init__(self, progress: MetricLines, path: str) -> None:
        super().__init__()
        self.progress, self.path = progress, path

    def on_epoch_end(self, epoch, logs=None):
        write_json(self.path, self.progress.last)


def _save(model: keras.Model, model_dir: str, role: WorkerRole, epochs: int) -> None:
    """Save the final model (collective: every worker writes, the chief into `model_dir`), saying so
    first: it can take longer than an epoch, and a crash meanwhile resumes from the backup."""
    emit(role, event="saving", epochs=epochs, **({"model_dir": model_dir} if role.is_chief else {}))
    print(f"homegpu.trainer: saving the model to {model_dir}", file=sys.stderr, flush=True)
    shutil.rmtree(model_dir, ignore_errors=True)  # what a crashed save left
    model.save(model_dir)


def _report_already_done(role: WorkerRole, output: str, epochs: int) -> None:
    """Every worker's DONE marker is there: the run finished before; say so and train nothing."""
    print(f"homegpu.trainer: already done: all {epochs} epochs were trained and the model saved "
          f"(found {os.path.join(output, 'DONE')}); nothing to train", file=sys.stderr, flush=True)
    model_dir = os.path.join(output, "model")
    emit(role, event="end", epoch=epochs, epochs=epochs, initial_epoch=epochs, already_done=True,
         **({"model_dir": model_dir} if role.is_chief else {}))


def communication_options(collective: str) -> tf.distribute.experimental.CommunicationOptions:
    """The strategy's options for ``collective`` (AUTO, RING or NCCL; see cli.parse_collective).

    NCCL moves tensors between GPUs only; RING (gRPC) works on CPU workers too, so a job with any
    CPU worker needs it, and homegpu's device plan says which through $HOMEGPU_COLLECTIVE.
    """
    implementation = getattr(tf.distribute.experimental.CommunicationImplementation, collective)
    return tf.distribute.experimental.CommunicationOptions(implementation=implementation)


def strategy_collective(strategy: tf.distribute.Strategy, requested: str) -> str:
    """The collective the strategy was built with, read back from it for the start line.

    ``_communication_options`` is private to TensorFlow (2.21 has it); where it is gone, the
    requested value is what we know.
    """
    options = getattr(strategy.extended, "_communication_options", None)
    implementation = getattr(options, "implementation", None)
    return getattr(implementation, "name", requested)


def _exit_on_sigterm() -> None:
    """Make SIGTERM end this worker again.

    In multi-worker mode TensorFlow's coordination service installs a SIGTERM handler that only
    records a preemption and lets training go on, so a worker asked to stop (homegpu stop, a
    restart after a peer failed) would keep training until killed. Stopping must stop it; the
    backup of the last finished epoch is what the next generation resumes from.
    """
    def stop(signum, frame):
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, stop)

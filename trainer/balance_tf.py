"""Unlike machines add up under MultiWorkerMirroredStrategy: each replica's share of every step follows its
measured speed (trainer/shares.py), for the built-in trainer.

Four parts, each the same on every worker:
- `ShareSchedule`: the shares in force, as variables the input pipeline reads per global batch. A change takes
  effect at a step every worker names alike (`switch_at`, a margin past the step it was decided at, beyond what
  the pipeline has made ahead), so every global batch is cut the same way on every worker: each example in one
  replica, an epoch covering the data once.
- `balanced_train`: the per-worker input pipeline: the seeded order of the examples, in global batches, each
  cut into this worker's replicas' slices.
- `BalancedModel.train_step`: each replica's loss is its examples' SUM over the GLOBAL batch (the collective then
  sums the gradients into the global batch's mean, as one machine would compute it). Its forward and backward
  pass is timed in the graph (`tf.timestamp`) before the collective, so a worker's speed leaves out its wait, and
  so is its overhead, from one step's all-reduce to the next step's compute.
- `Rebalance`: after the first steps and at each epoch's end, the workers trade their speeds and overheads, and
  the examples a step their GPUs' memory holds (`gpu_memory`, trainer/memory_cap.py), in a collective, and re-split
  when that shortens a step by more than 5 %; a run given shares by $HOMEGPU_SHARES starts with them.
`Balancer` puts them together, for the built-in trainer and for a script of one's own (docs/your-script.md,
"Unlike machines").
"""

from __future__ import annotations

import os
import sys
import time
from typing import Callable

import tensorflow as tf
import tf_keras as keras

from homegpu.trainer import gpu_budget, memory_cap, shares
from homegpu.trainer.cluster import worker_role
from homegpu.trainer.report import IN_A_RUN

MARGIN_STEPS = 8  # past the step a change is decided at: more than the pipeline prefetches
WARMUP_STEPS = 5
GPU = "GPU:0"  # a worker's first GPU, read for its memory: its replicas' GPUs are alike (the plan's equal replicas)


class ShareSchedule:
    """Each replica's examples of a global batch: `before` until step `switch_at`, `after` from it."""

    def __init__(self, global_batch: int, replicas: int, first: list[int] | None = None) -> None:
        self.global_batch, self.replicas = global_batch, replicas
        start = first or shares.even(global_batch, replicas)
        self.current = list(start)
        # plain variables of this worker (made outside the strategy's scope), read by its input pipeline
        self.before = tf.Variable(start, dtype=tf.int64, trainable=False, name="shares_before")
        self.after = tf.Variable(start, dtype=tf.int64, trainable=False, name="shares_after")
        self.switch_at = tf.Variable(0, dtype=tf.int64, trainable=False, name="shares_switch_at")
        self.switch_step = 0  # switch_at's value, read between steps without a tensor

    def at(self, step: tf.Tensor) -> tf.Tensor:
        return tf.where(step >= self.switch_at, self.after, self.before)

    def settled(self, step: int) -> bool:
        """Whether the last change is in force by `step` (a new one may be scheduled)."""
        return step >= self.switch_step

    def in_force(self, step: int) -> list[int]:
        """The shares the steps run at `step`."""
        return self.current if self.settled(step) else [int(share) for share in self.before.numpy()]

    def change(self, new: list[int], step: int) -> None:
        self.before.assign(self.after.numpy())
        self.after.assign(new)
        self.switch_step = step + MARGIN_STEPS
        self.switch_at.assign(self.switch_step)
        self.current = list(new)


def balanced_train(strategy: tf.distribute.Strategy, examples: tf.data.Dataset, schedule: ShareSchedule, seed: int,
                   to_float, shuffle_buffer: int, decode=None):
    """The distributed training input: each worker's `worker_pipeline`."""
    return strategy.distribute_datasets_from_function(
        lambda context: worker_pipeline(context, examples, schedule, seed, to_float, shuffle_buffer, decode))


def worker_pipeline(context: tf.distribute.InputContext, examples: tf.data.Dataset, schedule: ShareSchedule,
                    seed: int, to_float, shuffle_buffer: int, decode=None) -> tf.data.Dataset:
    """On every worker the same seeded order of `examples` (image, label pairs, or what `decode` makes them), in
    global batches, each cut into this worker's replicas' slices (one element per local replica) by `schedule`."""
    local = context.num_replicas_in_sync // context.num_input_pipelines
    first = context.input_pipeline_id * local
    ds = examples.shuffle(shuffle_buffer, seed=seed, reshuffle_each_iteration=True).repeat()
    if decode is not None:  # after the shuffle: its buffer holds file names, not images
        ds = ds.map(decode, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    ds = ds.batch(schedule.global_batch, drop_remainder=True).enumerate()

    def slices(step, batch):
        images, labels = batch
        split = schedule.at(step)
        starts = tf.cumsum(split, exclusive=True)

        def cut(k):
            replica = first + k
            begin, size = starts[replica], split[replica]
            return to_float(images[begin:begin + size]), labels[begin:begin + size]
        return tf.data.Dataset.range(local).map(cut)
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    options.deterministic = True
    # repeat(): the input is endless already, but flat_map hides it, and MWMS then agrees every step with a
    # collective that every worker still has a batch
    return ds.flat_map(slices).repeat().with_options(options).prefetch(2)


class ComputeClock:
    """This worker's time since the last look, added to by the training step in the graph: its compute (forward
    and backward) and examples, and its overhead: the time from one step's all-reduce to the next step's compute
    (the optimizer's update, the input, Keras and the callbacks between steps), which every step costs whatever
    its share. Plain variables of its own (made outside the strategy's scope, so neither mirrored nor saved with
    the model)."""

    def __init__(self) -> None:
        self.seconds = tf.Variable(0.0, dtype=tf.float64, trainable=False, name="compute_seconds")
        self.examples = tf.Variable(0, dtype=tf.int64, trainable=False, name="computed_examples")
        self.overhead = tf.Variable(0.0, dtype=tf.float64, trainable=False, name="overhead_seconds")
        self.gaps = tf.Variable(0, dtype=tf.int64, trainable=False, name="overhead_gaps")
        self.reduced_at = tf.Variable(0.0, dtype=tf.float64, trainable=False, name="reduced_at")

    def record(self, began: tf.Tensor, ended: tf.Tensor, reduced: tf.Tensor, examples: tf.Tensor) -> None:
        """In the graph: a step computed `examples` from `began` to `ended`, its all-reduce done at `reduced`."""
        after_a_step = self.reduced_at > 0
        self.overhead.assign_add(tf.where(after_a_step, began - self.reduced_at, 0.0))
        self.gaps.assign_add(tf.cast(after_a_step, tf.int64))
        self.reduced_at.assign(reduced)
        self.seconds.assign_add(ended - began)
        self.examples.assign_add(tf.cast(examples, tf.int64))

    def new_stretch(self) -> None:
        """The next step follows no step of its own (an epoch's end, a collective between steps): its gap is
        no step's overhead."""
        self.reduced_at.assign(0.0)

    def take(self) -> tuple[float | None, float | None]:
        """(examples per second of compute per replica, seconds of overhead a step) since the last call, None
        where there was none yet; then start again."""
        seconds, examples = float(self.seconds.numpy()), int(self.examples.numpy())
        overhead, gaps = float(self.overhead.numpy()), int(self.gaps.numpy())
        for variable in (self.seconds, self.examples, self.overhead, self.gaps):
            variable.assign(tf.zeros_like(variable))
        self.new_stretch()
        return (examples / seconds if seconds > 0 and examples else None), (overhead / gaps if gaps else None)


class BalancedModel(keras.Model):
    """A functional model whose training step weighs each replica's loss by the global batch and times its own
    forward and backward pass. compile() takes the loss as usual (a Loss, its name, or a function) and uses it
    per example."""

    def configure_balance(self, global_batch: int, clock: ComputeClock) -> None:
        """Call inside the strategy's scope (the loss tracker is a synced metric), before compile()."""
        self.global_batch, self.clock = global_batch, clock
        self.distribute_reduction_method = "first"  # the batch logs unsummed: no collective a step for them
        self.loss_tracker = keras.metrics.Mean(name="loss")

    def compile(self, optimizer="rmsprop", loss=None, metrics=None, **kwargs):
        if loss is None:
            raise ValueError("a balanced model needs its loss in compile(loss=...)")
        self.per_example_loss = per_example(loss)
        super().compile(optimizer=optimizer, metrics=metrics, **kwargs)

    @property
    def metrics(self):
        return [self.loss_tracker, *self.compiled_metrics.metrics] if self.compiled_metrics else [self.loss_tracker]

    def train_step(self, data):
        images, labels = data
        # the clock starts once the input is here (fetching it waits for the other workers: MWMS agrees a batch is
        # there on every worker with a collective), and the forward pass starts after it
        with tf.control_dependencies(tf.nest.flatten(data)):
            began = tf.timestamp()
        with tf.control_dependencies([began]):
            images = tf.identity(images)
        with tf.GradientTape() as tape:
            predictions = self(images, training=True)
            per_example = self.per_example_loss(labels, predictions)
            loss = tf.reduce_sum(per_example) / self.global_batch  # the collective SUMS the replicas' gradients
            if self.losses:
                loss += tf.add_n(self.losses) / self.distribute_strategy.num_replicas_in_sync
        pairs = [(gradient, variable) for gradient, variable in
                 zip(tape.gradient(loss, self.trainable_variables), self.trainable_variables) if gradient is not None]
        gradients = [gradient for gradient, _ in pairs]
        with tf.control_dependencies(gradients):
            ended = tf.timestamp()
        # the all-reduce here rather than in the optimizer: the time after it is this worker's own again
        summed = tf.distribute.get_replica_context().all_reduce(tf.distribute.ReduceOp.SUM, gradients)
        with tf.control_dependencies(summed):
            reduced = tf.timestamp()
        self.clock.record(began, ended, reduced, tf.shape(per_example)[0])
        self.optimizer.apply_gradients(zip(summed, [variable for _, variable in pairs]),
                                       experimental_aggregate_gradients=False)
        return self._track(per_example, labels, predictions)

    def test_step(self, data):
        images, labels = data[0], data[1]
        predictions = self(images, training=False)
        return self._track(self.per_example_loss(labels, predictions), labels, predictions)

    def _track(self, per_example, labels, predictions):
        examples = tf.cast(tf.shape(per_example)[0], tf.float32)
        self.loss_tracker.update_state(tf.reduce_mean(per_example), sample_weight=examples)
        self.compiled_metrics.update_state(labels, predictions)
        return {metric.name: metric.result() for metric in self.metrics}


def per_example(loss):
    """`loss` (a Loss, its name, or a function of labels and predictions) as one value per example."""
    if isinstance(loss, str):
        loss = keras.losses.get(loss)
    if isinstance(loss, keras.losses.Loss):
        return type(loss).from_config({**loss.get_config(), "reduction": keras.losses.Reduction.NONE})
    return loss  # Keras's loss functions give one value per example


def balanced(model: keras.Model, global_batch: int, clock: ComputeClock) -> BalancedModel:
    """`model` (functional) as a BalancedModel over the same layers; inside the strategy's scope."""
    wrapped = BalancedModel(inputs=model.inputs, outputs=model.outputs, name=model.name)
    wrapped.configure_balance(global_batch, clock)
    return wrapped


class Rebalance(keras.callbacks.Callback):
    """Trades the workers' speeds after the first steps and at each epoch's end (a collective on every worker at
    the same step) and schedules new shares when they would move, from speeds measured at the shares in force (a
    change lands steps after it is decided: the time before it is dropped, and a stretch timed wholly before it
    moves nothing). It also times the steps: where a step waits longer for the collective than its slowest share
    takes to compute, the link sets the pace, not the machines, and `say_link` is told so once, with both figures. With this worker's GPU `memory`, its cap is traded too, and
    `say_cap` is told its reading as the cap starts to hold its share down, and with each new split while it does.
    """

    def __init__(self, schedule: ShareSchedule, rank: int, workers: int, say, warmup_steps: int = WARMUP_STEPS,
                 warm: bool = False, say_link=None, memory: memory_cap.GpuMemory | None = None,
                 say_cap=None) -> None:
        super().__init__()
        self.schedule, self.rank, self.workers, self.say, self.say_link = schedule, rank, workers, say, say_link
        self.memory, self.say_cap, self._cap_watch = memory, say_cap, memory_cap.CapWatch()
        self.warmup_steps = 0 if warm else warmup_steps
        self.step = 0
        self.speeds: list[float | None] = [None] * workers
        self.overheads: list[float | None] = [None] * workers
        self.caps: list[int | None] = [None] * workers
        self.step_seconds: float | None = None  # a step's wall time, and its slowest worker's own part of it
        self.own_seconds: float | None = None
        self._began = self._wall = 0.0
        self._timed = 0
        self._link_said = False
        self._stretch_began = 0  # the step this stretch of timing began at
        self.last_move: shares.Move | None = None  # the last re-split's, if it moved the shares

    def on_train_batch_begin(self, batch, logs=None):
        if self.step == self.schedule.switch_step and self.step > self._stretch_began:
            self.model.clock.take()  # the shares change at this step: what was timed before it ran the old ones
            self._new_stretch()
        self._began = time.perf_counter()

    def on_train_batch_end(self, batch, logs=None):
        self._wall += time.perf_counter() - self._began
        self._timed += 1
        self.step += 1
        if self.warmup_steps and self.step == self.warmup_steps:
            self.warmup_steps = 0
            self._resplit(timed=False)  # the first steps trace the graph: their wall time says nothing of the link

    def on_epoch_end(self, epoch, logs=None):
        self._resplit()

    def _resplit(self, timed: bool = True) -> None:
        reading = self._read_memory()
        speed, overhead = self.model.clock.take()
        self.speeds, self.overheads, self.caps = all_paces(self.model.distribute_strategy, speed, overhead, self.rank,
                                                           self.workers, reading.cap if reading else None)
        local = self.schedule.replicas // self.workers
        speeds, overheads, caps = ([value for value in values for _ in range(local)]
                                   for values in (self.speeds, self.overheads, self.caps))
        if timed:
            self._time_steps(speeds, overheads)
        timed_in_force = self.schedule.settled(self._stretch_began)  # else the figures are the old shares'
        self._new_stretch()
        if timed_in_force:
            self._split(speeds, overheads, caps, reading)

    def _new_stretch(self) -> None:
        """The steps' wall time is timed again from here (the compute clock has just been read)."""
        self._wall, self._timed, self._stretch_began = 0.0, 0, self.step

    def _replicas(self) -> range:
        """This worker's replicas, in the schedule's order."""
        local = self.schedule.replicas // self.workers
        return range(self.rank * local, (self.rank + 1) * local)

    def _read_memory(self) -> memory_cap.Reading | None:
        """This worker's GPU memory since the last re-split, at the largest share of its replicas in force."""
        if not self.memory:
            return None
        return self.memory.read(max(self.schedule.in_force(self.step)[replica] for replica in self._replicas()))

    def _split(self, speeds: list[float | None], overheads: list[float | None], caps: list[int | None],
               reading: memory_cap.Reading | None) -> None:
        move, held = shares.resplit(self.schedule.current, self.schedule.global_batch, speeds, overheads, caps,
                                    self.last_move)
        self.last_move = move
        if move is not None:
            self.schedule.change(list(move.after), self.step)
            self.say(move, self.speeds, self.overheads)
        holds = bool(set(self._replicas()) & set(held))
        if self._cap_watch.due(holds, move is not None) and reading and self.say_cap:
            self.say_cap(reading)

    def _time_steps(self, speeds: list[float | None], overheads: list[float | None]) -> None:
        if self._timed and all(speeds):
            self.step_seconds = self._wall / self._timed
            self.own_seconds = shares.step_seconds(self.schedule.current, speeds, overheads)
            if self.say_link and not self._link_said and self.step_seconds > 2 * self.own_seconds:
                self._link_said = True
                self.say_link(self.step_seconds, self.own_seconds)


def all_paces(strategy: tf.distribute.Strategy, speed: float | None, overhead: float | None, rank: int,
              workers: int, cap: int | None = None) -> tuple[list[float | None], list[float | None], list[int | None]]:
    """Every worker's speed, overhead and cap in rank order (None where one has none: not yet, or no GPU): a
    collective, as backup.all_agree."""
    mine = [0.0] * (3 * workers)
    mine[rank], mine[workers + rank], mine[2 * workers + rank] = speed or 0.0, overhead or 0.0, cap or 0.0
    value = tf.constant(mine, dtype=tf.float64)
    per_replica = strategy.run(tf.function(lambda: tf.identity(value)))
    total = strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None).numpy()
    local = strategy.num_replicas_in_sync // workers  # each of a worker's replicas gave its figures
    everyone = [float(value) / local or None for value in total]
    caps = [round(cap) if cap else None for cap in everyone[2 * workers:]]
    return everyone[:workers], everyone[workers:2 * workers], caps


def gpu_memory(config=None, usable: int | None = None) -> memory_cap.GpuMemory | None:
    """This worker's first GPU's memory as TensorFlow reports it: `config` is tf.config.experimental (a test's fake
    stands in: these machines have no GPU), whose get_memory_info gives {"current", "peak"} in bytes and
    reset_memory_stats starts the peak again. It may hold `usable` bytes, by default the job's gpu_memory, else the
    card's total (NVML, else nvidia-smi). None on a CPU worker, or where that total is not known: no cap."""
    config = config or tf.config.experimental
    try:
        config.get_memory_info(GPU)
    except ValueError:  # no such device
        return None
    usable = usable or memory_cap.usable(lambda: gpu_budget.card_total(gpu_budget.first_visible()))
    if not usable:
        return None
    return memory_cap.GpuMemory(lambda: config.get_memory_info(GPU)["peak"], lambda: config.reset_memory_stats(GPU),
                                usable)


def link_line(step_seconds: float, own_seconds: float) -> str:
    return (f"homegpu.trainer: the machines do not set the pace: a step takes {step_seconds:.3g} s, of which the "
            f"slowest worker's own part (its compute and its update) takes {own_seconds:.3g} s; the rest waits for "
            "the all-reduce over the link, which balancing cannot shorten: a faster network, or a larger "
            "batch_size, helps")


def print_line(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


class Balancer:
    """homegpu's balancing under MultiWorkerMirroredStrategy, put together: the built-in trainer's, and a Keras
    script's in five lines:

        balancer = Balancer(strategy, global_batch_size)
        dataset = balancer.dataset(tf.data.Dataset.from_tensor_slices((x_train, y_train)))  # not yet batched
        with strategy.scope():
            model = balancer.model(build_and_compile_model())      # compiled or not
        model.fit(dataset, epochs=3, steps_per_epoch=70, callbacks=[balancer.callback])

    On one worker, with the job's `balance = "even"`, or outside a homegpu run (unless `by_hand_too`: the
    built-in trainer balances wherever it runs), it changes nothing: the dataset is shuffled, repeated and
    batched globally as the tutorials do, the model is the script's own, the callback does nothing. The chief
    says each new split and a pace its compute does not set, a worker whose GPU's memory caps its share says so;
    `heard` functions are told each new split.
    """

    def __init__(self, strategy: tf.distribute.Strategy, global_batch_size: int, *, seed: int = 0,
                 shuffle_buffer: int = 10_000, by_hand_too: bool = False) -> None:
        self.role = worker_role(os.environ)
        self.strategy, self.global_batch, self.seed, self.shuffle_buffer = (strategy, global_batch_size, seed,
                                                                            shuffle_buffer)
        self.on = (self.role.workers > 1 and not shares.even_asked(os.environ)
                   and (by_hand_too or IN_A_RUN in os.environ))
        self.heard: list[Callable[[list[int]], None]] = []
        self.callback: keras.callbacks.Callback = keras.callbacks.Callback()
        if self.on:
            replicas = strategy.num_replicas_in_sync
            given = shares.given(os.environ, global_batch_size, replicas)
            self.schedule = ShareSchedule(global_batch_size, replicas, given)
            self.clock = ComputeClock()
            self.callback = Rebalance(self.schedule, self.role.rank, self.role.workers, self._said,
                                      warm=given is not None, say_link=self._link, memory=gpu_memory(),
                                      say_cap=self._capped)

    def _said(self, move: shares.Move, speeds: list[float | None], overheads: list[float | None]) -> None:
        for hears in self.heard:
            hears(list(move.after))
        if self.role.is_chief:
            print_line("homegpu.trainer: " + shares.moved_line("replica", move.after, self.global_batch, speeds,
                                                               overheads, move.between))

    def _capped(self, reading: memory_cap.Reading) -> None:
        print_line("homegpu.trainer: " + reading.line("this worker's GPU"))

    def _link(self, step_seconds: float, own_seconds: float) -> None:
        if self.role.is_chief:
            print_line(link_line(step_seconds, own_seconds))

    def dataset(self, examples: tf.data.Dataset, to_float=lambda t: t, decode=None):
        """The training input from `examples`, one (features, label) pair each (or what `decode` makes one into),
        not yet batched; `to_float` is applied to each replica's features."""
        if not self.on:
            return (examples.shuffle(self.shuffle_buffer, seed=self.seed, reshuffle_each_iteration=True).repeat()
                    .batch(self.global_batch))
        return balanced_train(self.strategy, examples, self.schedule, self.seed, to_float, self.shuffle_buffer,
                              decode)

    def model(self, model: keras.Model) -> keras.Model:
        """`model` (functional or Sequential) balanced; compiled again as it was when it was compiled. Call it
        inside the strategy's scope."""
        if not self.on:
            return model
        wrapped = balanced(model, self.global_batch, self.clock)
        if model.optimizer is not None and getattr(model, "compiled_loss", None) is not None:
            wrapped.compile(optimizer=model.optimizer, loss=model.loss,
                            metrics=getattr(model.compiled_metrics, "_user_metrics", None))
        return wrapped

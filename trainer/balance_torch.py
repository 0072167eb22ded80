"""Unlike machines add up under PyTorch DDP: each process's share of every step follows its measured speed.

DistributedSampler gives every process the same number of examples a step, so a step waits for the slowest.
`BalancedBatches` replaces it as a DataLoader's `batch_sampler`: every process draws the same seeded order of
the data, cuts it into global batches (batch_size × processes: the job's global batch does not change) and
takes its own slice of each, in proportion to its speed (trainer/shares.py). An epoch still covers the data
once, each example in one process. DDP averages the processes' gradients, so each process's mean loss is
multiplied by its weight (share × processes / global batch), which makes the average the gradient over the
global batch, as one machine would compute it. A tutorial-shaped script changes three lines:

    batches = BalancedBatches(dataset, batch_size)              # was: DistributedSampler(dataset)
    loader = DataLoader(dataset, batch_sampler=batches)         # was: batch_size=..., sampler=...
    with batches.forward(len(targets)) as weight:               # around the forward pass and the loss
        loss = F.cross_entropy(model(source), targets) * weight

Speed is examples per second of a process's own compute: from the forward pass to the end of its backward pass,
before DDP waits for the other processes' gradients. Overhead is the time a process spends on each step whatever
its share: from the end of DDP's wait to the next forward pass (the optimizer's step, the next batch). Shares
start even, or as $HOMEGPU_SHARES says (a previous run's); after the first `WARMUP_STEPS` steps and at each
epoch's start (`set_epoch`, as with DistributedSampler) the processes trade their speeds and overheads over a
gloo group of their own and re-split. A process on a GPU trades the examples a step its memory holds too
(`gpu_memory`, trainer/memory_cap.py), which its share then never passes, and says so when that holds it down.
Outside a homegpu run, or with $HOMEGPU_BALANCE=even, the split stays even (then it is DistributedSampler's,
without padding). Standard library and torch only.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from typing import Iterator, Sequence

from homegpu.trainer import memory_cap, shares
from homegpu.trainer.report import IN_A_RUN

WARMUP_STEPS = 5  # steps timed before the first re-split of a run that starts even


class BalancedBatches:
    """A DataLoader `batch_sampler`: this process's slice of each global batch, sized by the processes' speeds.

    Args:
        dataset: anything with a length.
        batch_size: the even share per process (as the script passed to its DataLoader).
        seed: the shuffle's seed, the same on every process.
        shuffle: shuffle each epoch (seed + epoch), as DistributedSampler does.
        warmup_steps: steps timed before the first re-split of a run that starts even.
        memory: this process's GPU memory (by default `gpu_memory()`, looked up at each re-split until the process
            uses its GPU).
    """

    def __init__(self, dataset, batch_size: int, *, seed: int = 0, shuffle: bool = True,
                 warmup_steps: int = WARMUP_STEPS, memory: memory_cap.GpuMemory | None = None) -> None:
        import torch.distributed as dist

        self.size, self.seed, self.shuffle, self.warmup_steps = len(dataset), seed, shuffle, warmup_steps
        self.distributed = dist.is_available() and dist.is_initialized()
        self.rank = dist.get_rank() if self.distributed else 0
        self.processes = dist.get_world_size() if self.distributed else 1
        self.global_batch = batch_size * self.processes
        self.balancing = self.processes > 1 and IN_A_RUN in os.environ and not shares.even_asked(os.environ)
        given = shares.given(os.environ, self.global_batch, self.processes) if self.balancing else None
        self.shares = given or shares.even(self.global_batch, self.processes)
        self.changes = 0  # how many times the shares moved
        self.last_move: shares.Move | None = None  # the last re-split's, if it moved the shares
        self.epoch = 0
        self._group = dist.new_group(backend="gloo") if self.balancing else None
        self._examples, self._seconds = 0, 0.0  # compute since the last re-split
        self._overhead, self._gaps = 0.0, 0  # and the time from each step's all-reduce to the next's forward
        self._reduced_at: float | None = None
        self.speeds: Sequence[float | None] = [None] * self.processes  # every process's, at the last re-split
        self.overheads: Sequence[float | None] = [None] * self.processes
        self.caps: Sequence[int | None] = [None] * self.processes
        self._memory, self._cap_watch = memory, memory_cap.CapWatch()
        self._steps_left_to_warm = 0 if given else warmup_steps

    @property
    def share(self) -> int:
        """This process's examples a step now."""
        return self.shares[self.rank]

    def weight(self, examples: int) -> float:
        """The loss weight of a batch of `examples` (its share × processes / global batch)."""
        return shares.loss_weight(examples, self.global_batch, self.processes)

    def __len__(self) -> int:
        return self.size // self.global_batch  # whole global batches: every process takes as many steps

    def set_epoch(self, epoch: int) -> None:
        """The next epoch's order, and shares re-split from the speeds measured so far (collective: every
        process calls it, as it would DistributedSampler's)."""
        self.epoch = epoch
        self._resplit()

    def __iter__(self) -> Iterator[list[int]]:
        import torch

        if self.shuffle:
            generator = torch.Generator().manual_seed(self.seed + self.epoch)
            order = torch.randperm(self.size, generator=generator).tolist()
        else:
            order = list(range(self.size))
        for step in range(len(self)):
            if self._steps_left_to_warm and step == self._steps_left_to_warm:
                self._steps_left_to_warm = 0
                self._resplit()
            begin = step * self.global_batch + shares.offsets(self.shares)[self.rank]
            yield order[begin:begin + self.share]

    @contextlib.contextmanager
    def forward(self, examples: int) -> Iterator[float]:
        """Gives the loss weight of a batch of `examples` and times its compute: from here to the end of the
        backward pass that the weighted loss starts (not the wait for the other processes' gradients, which DDP
        does after it). Balancing, the weight is a 0-dim tensor whose gradient, the first of that backward pass,
        queues the clock's stop at its end, ahead of DDP's own wait; otherwise it is a plain number."""
        if not self.balancing:
            yield self.weight(examples)
            return
        import torch

        began = time.perf_counter()
        if self._reduced_at is not None:  # the last step's update, this step's input: overhead
            self._overhead += began - self._reduced_at
            self._gaps += 1
        weight = torch.tensor(self.weight(examples), requires_grad=True)
        engine = torch.autograd.Variable._execution_engine  # what DDP queues its own wait on

        def computed():
            _synchronize()
            self._seconds += time.perf_counter() - began
            self._examples += examples
            engine.queue_callback(self._reduced)  # runs after DDP's wait, queued after this one

        weight.register_hook(lambda _grad: engine.queue_callback(computed))
        yield weight

    def _reduced(self) -> None:
        _synchronize()
        self._reduced_at = time.perf_counter()

    def pace(self) -> tuple[float | None, float | None]:
        """This process's examples per second of compute and seconds of overhead a step since the last re-split,
        or None. All the time counts (not a median step's): a machine held back in bursts (a CPU quota, thermal
        throttling) is slow on average while most of its steps look fast."""
        speed = self._examples / self._seconds if self._seconds > 0 and self._examples else None
        return speed, (self._overhead / self._gaps if self._gaps else None)

    def _resplit(self) -> None:
        if not self.balancing:
            return
        reading = self._read_memory()
        self.speeds, self.overheads, self.caps = _gather((*self.pace(), reading.cap if reading else None),
                                                         self.processes, self._group)
        self._examples, self._seconds, self._overhead, self._gaps = 0, 0.0, 0.0, 0
        self._reduced_at = None  # the next step follows an epoch's end or this collective, not a step
        self._split(reading)

    def _split(self, reading: memory_cap.Reading | None) -> None:
        move, held = shares.resplit(self.shares, self.global_batch, self.speeds, self.overheads, self.caps,
                                    self.last_move)
        self.last_move = move
        if move is not None:
            self.shares = list(move.after)
            self.changes += 1
        if self._cap_watch.due(self.rank in held, move is not None) and reading:
            print("homegpu: " + reading.line("this process's GPU"), file=sys.stderr, flush=True)

    def _read_memory(self) -> memory_cap.Reading | None:
        """This process's GPU memory since the last re-split, at its share."""
        self._memory = self._memory or gpu_memory()
        return self._memory.read(self.share) if self._memory else None


def gpu_memory(cuda=None, usable: int | None = None) -> memory_cap.GpuMemory | None:
    """This process's GPU's memory as PyTorch reports it: `cuda` is torch.cuda (a test's fake stands in: these
    machines have no GPU), whose max_memory_allocated() gives the peak in bytes on the current device and
    reset_peak_memory_stats() starts it again. It may hold `usable` bytes, by default the job's gpu_memory, else the
    card's total (mem_get_info()'s second). None where the process uses no GPU: no cap."""
    if cuda is None:
        import torch

        cuda = torch.cuda
    if not (cuda.is_available() and cuda.is_initialized()):
        return None
    usable = usable or memory_cap.usable(lambda: cuda.mem_get_info()[1])
    return memory_cap.GpuMemory(cuda.max_memory_allocated, cuda.reset_peak_memory_stats, usable) if usable else None


def _gather(mine: tuple[float | None, float | None, int | None], processes: int,
            group) -> tuple[list[float | None], list[float | None], list[int | None]]:
    """Every process's speed, overhead and cap (None where one has none: not yet, or no GPU), in rank order."""
    import torch
    import torch.distributed as dist

    figures = torch.tensor([value if value is not None else 0.0 for value in mine], dtype=torch.float64)
    everyone = [torch.zeros(len(mine), dtype=torch.float64) for _ in range(processes)]
    dist.all_gather(everyone, figures, group=group)
    speeds, overheads, caps = ([float(value[at]) or None for value in everyone] for at in range(len(mine)))
    return speeds, overheads, [round(cap) if cap else None for cap in caps]


def _synchronize() -> None:
    """Waits for the compute stream's queued work, so the time is the compute's own and not its launch (the
    collectives run on streams of their own, and are not waited for)."""
    import torch

    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.current_stream().synchronize()

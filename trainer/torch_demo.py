"""homegpu's built-in PyTorch demo: DistributedDataParallel on synthetic data, started by torchrun on each node.

`homegpu init --framework pytorch` writes a job that runs it, so a PyTorch user's first `homegpu run` trains across
their machines at once, with no download: an MLP learns to tell ten Gaussian clusters apart (loss falls from about
2.3 within an epoch or two). The job's `model = "cnn"` trains a small CNN on 28x28 images of the same kind instead:
its steps compute long enough that the all-reduce does not set the pace on a home LAN. Each process trains on its
own slice of every step; gloo on a CPU, nccl when every process has a GPU (homegpu's plan says which). Each
process's share of a step follows its measured speed (balance_torch.py), so unlike machines add up; the job's
`balance = "even"` keeps it even. Progress goes out as the metric line protocol (trainer/PROTOCOL.md) from each
node's first process, as its node's worker (`GROUP_RANK`).

State survives a restart: after each epoch the node's first process writes `backup/snapshot.pt` in its
output dir, and a restarted job resumes from the epoch every node finished (`DONE` once all are trained).

Needs only torch and the standard library: `python -m torch.distributed.run ... -m homegpu.trainer.torch_demo
--epochs 5 --output OUT`.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from homegpu.trainer import TORCH_DEMO_MODELS, shares
from homegpu.trainer.demo_args import parse_demo_args
from homegpu.trainer.gpu_budget import hold_to_budget
from homegpu.trainer.metrics import format_metric

CLASSES = 10
FEATURES = 32
IMAGE = (1, 28, 28)  # the CNN's examples: one channel, as MNIST's
EXAMPLES = 8192


def synthetic_set(torch, shape: tuple[int, ...] = (FEATURES,)):
    """Ten Gaussian clusters of examples of `shape`, the same on every process (a fixed seed)."""
    generator = torch.Generator().manual_seed(0)
    centers = torch.randn(CLASSES, *shape, generator=generator) * 0.6
    labels = torch.randint(0, CLASSES, (EXAMPLES,), generator=generator)
    inputs = centers[labels] + torch.randn(EXAMPLES, *shape, generator=generator)
    return torch.utils.data.TensorDataset(inputs, labels)


def build_model(torch, name: str):
    """The demo's model and the shape of its examples: "mlp" (32 -> 64 -> 10), or "cnn", a convolution and a dense
    head of 520,554 parameters, about the TensorFlow trainer's 545,098."""
    nn = torch.nn
    if name == "cnn":
        return nn.Sequential(nn.Conv2d(1, 32, 3), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                             nn.Linear(32 * 13 * 13, 96), nn.ReLU(), nn.Linear(96, CLASSES)), IMAGE
    return nn.Sequential(nn.Linear(FEATURES, 64), nn.ReLU(), nn.Linear(64, CLASSES)), (FEATURES,)


def main(argv: list[str] | None = None) -> int:
    args = parse_demo_args("homegpu.trainer.torch_demo", "homegpu's PyTorch demo: DDP on synthetic data", argv,
                           models=TORCH_DEMO_MODELS)
    hold_to_budget()  # before the framework's import: it holds it once loaded
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel
    from torch.utils.data import DataLoader

    from homegpu.trainer.balance_torch import BalancedBatches

    cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if cuda else "gloo")
    local_rank, node, nodes = (int(os.environ[key]) for key in ("LOCAL_RANK", "GROUP_RANK", "GROUP_WORLD_SIZE"))
    device = torch.device(f"cuda:{local_rank}" if cuda else "cpu")
    if cuda:
        torch.cuda.set_device(device)
    reporting = local_rank == 0

    def say(**fields) -> None:
        if reporting:
            print(format_metric(worker=node, workers=nodes, time=time.time(), **fields), flush=True)

    output = Path(args.output)
    snapshot = output / "backup" / "snapshot.pt"
    model, shape = build_model(torch, args.model)
    done = 0
    if snapshot.exists():
        state = torch.load(snapshot, map_location="cpu")
        model.load_state_dict(state["model"])
        done = state["epochs"]
    # every node resumes from the same epoch: the fewest any node finished
    agreed = torch.tensor([done], device=device)
    dist.all_reduce(agreed, op=dist.ReduceOp.MIN)
    initial = int(agreed.item())
    model = DistributedDataParallel(model.to(device), device_ids=[local_rank] if cuda else None)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    data = synthetic_set(torch, shape)
    batches = BalancedBatches(data, args.batch_size)  # each process's share of a step follows its speed
    loader = DataLoader(data, batch_sampler=batches)
    steps = min(len(loader), args.steps_per_epoch) if args.steps_per_epoch else len(loader)
    say(event="start", initial_epoch=initial, resumed=initial > 0, epochs=args.epochs, data="synthetic",
        model=args.model, steps_per_epoch=steps, collective="nccl" if cuda else "gloo",
        replicas=dist.get_world_size(), batch_size=args.batch_size, global_batch_size=batches.global_batch,
        shares=batches.shares)
    started = time.time()
    loss_sum = correct = seen = 0.0
    for epoch in range(initial, args.epochs):
        changes = batches.changes
        batches.set_epoch(epoch)
        if reporting and batches.changes != changes:
            print("homegpu: " + shares.moved_line("process", batches.shares, batches.global_batch, batches.speeds,
                                                  batches.overheads, batches.last_move.between), flush=True)
        began = time.time()
        totals = torch.zeros(3, device=device)  # loss sum, correct, examples
        for step, (inputs, labels) in enumerate(loader):
            if step == steps:
                break
            inputs, labels = inputs.to(device), labels.to(device)
            optimizer.zero_grad()
            with batches.forward(len(labels)) as weight:
                logits = model(inputs)
                loss = torch.nn.functional.cross_entropy(logits, labels)
            (loss * weight).backward()  # DDP's mean of the weighted losses is the global batch's mean
            optimizer.step()
            totals += torch.stack([loss.detach() * len(labels), (logits.argmax(1) == labels).sum(),
                                   torch.tensor(len(labels), device=device)]).float()
        seconds = time.time() - began
        local_examples = float(totals[2])
        dist.all_reduce(totals)
        loss_sum, correct, seen = (float(value) for value in totals)
        if reporting:  # the node's first process keeps the node's state
            snapshot.parent.mkdir(parents=True, exist_ok=True)
            torch.save({"model": model.module.state_dict(), "epochs": epoch + 1}, snapshot)
        parts = shares.step_parts(batches.share, *batches.pace(), seconds / steps) if batches.balancing else {}
        say(event="epoch", epoch=epoch + 1, epochs=args.epochs, loss=loss_sum / seen, accuracy=correct / seen,
            examples_per_sec=local_examples / seconds if seconds > 0 else None, seconds=seconds,
            share=batches.share, shares=batches.shares, **parts)
    if reporting:
        (output / "DONE").write_text(json.dumps({"epochs": args.epochs, "time": time.time()}))
        if node == 0:
            torch.save(model.module.state_dict(), output / "model.pt")
    say(event="end", epoch=args.epochs, epochs=args.epochs, initial_epoch=initial,
        loss=loss_sum / seen if seen else None, accuracy=correct / seen if seen else None,
        seconds=time.time() - started)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

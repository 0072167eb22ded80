"""The command line the PyTorch and JAX demos share: the job's schedule and the worker's output dir, as
launch_plan.py writes it for both (`--epochs N --batch-size B [--steps-per-epoch S] --output DIR`). Standard
library only."""

from __future__ import annotations

import argparse


def parse_demo_args(prog: str, description: str, argv: list[str] | None = None,
                    models: tuple[str, ...] = ()) -> argparse.Namespace:
    """`models`: the demo's own (`--model`, the first by default); none: it has one."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    if models:
        parser.add_argument("--model", choices=models, default=models[0])
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=64, help="per process")
    parser.add_argument("--steps-per-epoch", type=int, default=0, help="0: the whole (sampled) set")
    parser.add_argument("--output", default=".", help="this process's output dir")
    return parser.parse_args(argv)

"""Unlike machines add up: two nodes of the simulated LAN whose CPUs are held by cgroup quotas (one core and a
quarter of one), the built-in trainer's job alone on each, then on both with an even split and balanced by
speed (trainer/shares.py). Prints each run's training speed (examples/s, the median epoch after the first, all
workers together), its last accuracy, and together / the sum of the two alone. Asserts nothing.

Run as root (it starts sshd servers and cgroups):
    .venv/bin/python tests/benchmarks/bench_balance.py [--framework tensorflow|pytorch] [--model cnn|mlp] [--epochs N]
(default: tensorflow, 4 epochs). pytorch runs homegpu's PyTorch demo instead of the TensorFlow trainer, with its CNN
(256 examples per worker a step, as the trainer's) or its MLP (64: a step of it is over before its all-reduce).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(TESTS))

from helpers import homegpu_argv, job_table, read_metrics  # noqa: E402
from simcluster import SimCluster  # noqa: E402
from simcpu import cpu_share  # noqa: E402

QUOTAS = {"node1": 100, "node2": 25}  # % of one core: a desktop and an old laptop
CORES = {"node1": "0", "node2": "1"}  # --own-cores: each a machine of one core of its own
BATCH = 256  # per worker, as in the measurement
STEPS = 8  # per epoch, alone and together: every run trains the same steps of its global batch


RUNS = ("node1-alone", "node2-alone", "both-even", "both-balanced")


def runs(framework: str, epochs: int, model: str) -> dict[str, dict]:
    schedule = {"epochs": epochs, "batch_size": BATCH, "steps_per_epoch": STEPS}
    if framework == "pytorch":
        schedule |= {"framework": "pytorch", "model": model, "batch_size": BATCH if model == "cnn" else 64}
    return {"node1 alone": {"nodes": ["node1"], **schedule},
            "node2 alone": {"nodes": ["node2"], **schedule},
            "both, even": {"nodes": ["node1", "node2"], "balance": "even", **schedule},
            "both, balanced": {"nodes": ["node1", "node2"], "balance": "speed", **schedule}}


def speed_of(run_dir: Path) -> tuple[float, float | None, list]:
    """(examples/s of all workers together: the median over epochs after the first of the sum of each worker's
    own rate, the last accuracy, the last shares)"""
    epochs: dict[int, dict[str, dict]] = {}
    for line in read_metrics(run_dir):
        if line.get("event") == "epoch":
            epochs.setdefault(line["epoch"], {})[line["worker_label"]] = line
    rates = [sum(line["examples_per_sec"] for line in workers.values())
             for epoch, workers in sorted(epochs.items()) if epoch > 1]
    last = epochs[max(epochs)]
    accuracy = next(iter(last.values())).get("accuracy")
    shares = next(iter(last.values())).get("shares", [])
    return statistics.median(rates), accuracy, shares


def run(config: Path, cwd: Path, job: str) -> Path:
    before = set((cwd / "experiments").glob("*")) if (cwd / "experiments").exists() else set()
    began = time.monotonic()
    done = subprocess.run(homegpu_argv("--config", str(config), "run", job, "--no-tui"), cwd=cwd, text=True,
                          capture_output=True, timeout=1800)
    if done.returncode != 0:
        raise SystemExit(f"{job} failed ({done.returncode}):\n{done.stdout[-3000:]}")
    (run_dir,) = set((cwd / "experiments").glob("*")) - before
    print(f"  ({job}: {time.monotonic() - began:.0f} s in all)", file=sys.stderr)
    return run_dir


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--framework", choices=("tensorflow", "pytorch"), default="tensorflow")
    parser.add_argument("--model", choices=("cnn", "mlp"), default="cnn", help="the PyTorch demo's (pytorch only)")
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--only", action="append", choices=RUNS, metavar="RUN",
                        help=f"run only this one (repeatable): {', '.join(RUNS)}")
    parser.add_argument("--epochs-shown", action="store_true", help="print each worker's epoch lines too")
    parser.add_argument("--period-ms", type=float, default=100.0,
                        help="the quotas' period (cgroup cfs_period): in 100 ms a quarter core runs 25 ms and then "
                             "stops for 75, which a slow laptop never does; in 10 ms it stops for 7.5 ms at most")
    parser.add_argument("--own-cores", action="store_true",
                        help="pin each node to a core of its own (node1 0, node2 1), a machine of one core: without it "
                             "both run on all this machine's cores, their frameworks a thread per core each, spending "
                             "a period's quota in a burst across them and meeting each other there")
    args = parser.parse_args()
    print(f"homegpu balance benchmark, {platform.node()}, {os.cpu_count()} cores, {time.strftime('%Y-%m-%d')}: "
          f"{args.framework}{f' ({args.model})' if args.framework == 'pytorch' else ''}, node1 held to "
          f"{QUOTAS['node1']} % of a core, node2 to {QUOTAS['node2']} %, "
          f"{args.epochs} epochs of {STEPS} steps, quotas in {args.period_ms:g} ms periods, "
          f"{'each on a core of its own' if args.own_cores else 'both on all cores'}\n")
    root = Path(tempfile.mkdtemp(prefix="homegpu-bench-balance-"))
    jobs = {slug(name): job_table(**table, stall_timeout=900.0)
            for name, table in runs(args.framework, args.epochs, args.model).items()}
    with SimCluster(2, first_host=180, name="balance") as sim, ExitStack() as quotas:
        for node, percent in QUOTAS.items():
            quotas.enter_context(cpu_share(sim.node(node), percent, period_us=int(args.period_ms * 1000),
                                           cores=CORES[node] if args.own_cores else None))
        config = sim.write_cluster_toml(root / "cluster.toml", jobs=jobs)
        figures = {}
        for name in runs(args.framework, args.epochs, args.model):
            if not args.only or slug(name) in args.only:
                run_dir = run(config, root, slug(name))
                figures[name] = speed_of(run_dir)
                if args.epochs_shown:
                    show_epochs(run_dir)
    alone = sum(figures[name][0] for name in ("node1 alone", "node2 alone") if name in figures)
    print(f"{'run':<16} {'examples/s':>10} {'/ sum alone':>11} {'accuracy':>9}  shares")
    for name, (speed, accuracy, shares) in figures.items():
        shown = f"{accuracy:.3f}" if accuracy is not None else "-"
        ratio = f"{speed / alone:10.2f}x" if alone and len(figures) == len(RUNS) else f"{'-':>11}"
        print(f"{name:<16} {speed:10.1f} {ratio} {shown:>9}  {json.dumps(shares)}")


def slug(name: str) -> str:
    return name.replace(" ", "-").replace(",", "")


def show_epochs(run_dir: Path) -> None:
    """Each epoch line of each worker: where a run's time went."""
    keys = ("examples_per_sec", "seconds", "shares", "compute_examples_per_sec", "compute_seconds", "overhead_seconds",
            "wait_seconds", "step_seconds")
    for line in read_metrics(run_dir):
        if line.get("event") == "epoch":
            shown = "  ".join(f"{key} {json.dumps(line[key])}" for key in keys if key in line)
            print(f"    epoch {line['epoch']} {line['worker_label']}: {shown}")

if __name__ == "__main__":
    main()

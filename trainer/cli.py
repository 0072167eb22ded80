"""Command line of `python -m homegpu.trainer`: options, TF environment defaults, exit codes.

Parsing needs no TensorFlow (so --help and usage errors are instant); TensorFlow is imported only
once the options are good, after the environment below is set.

Exit status: 0 trained and saved; 1 training failed; 2 bad options, TF_CONFIG or data; 3 the
workers' backups hold different epochs, so restarting as-is cannot help (see backup.py).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import traceback
from dataclasses import dataclass

from homegpu.trainer import MODELS
from homegpu.trainer.cluster import ClusterConfigError, WorkerRole, worker_role
from homegpu.trainer.gpu_budget import hold_to_budget, say_if_over_budget
from homegpu.trainer.metrics import format_metric

COLLECTIVES = ("AUTO", "RING", "NCCL")
COLLECTIVE_ENV = "HOMEGPU_COLLECTIVE"  # homegpu sets it from the job's device plan


@dataclass(frozen=True)
class DataSpec:
    """`--data`: kind is synthetic, npz or dir; path is empty for synthetic."""

    kind: str
    path: str = ""

    def __str__(self) -> str:
        return f"{self.kind}:{self.path}" if self.path else self.kind


def parse_data_spec(text: str) -> DataSpec:
    """`synthetic`, `npz:PATH` or `dir:PATH`. Raises argparse.ArgumentTypeError otherwise."""
    if text == "synthetic":
        return DataSpec("synthetic")
    kind, sep, path = text.partition(":")
    if sep and kind in ("npz", "dir") and path:
        return DataSpec(kind, os.path.expanduser(path))
    raise argparse.ArgumentTypeError(f"{text!r}: use synthetic, npz:PATH or dir:PATH")


def parse_collective(text: str) -> str:
    """NCCL, RING or AUTO, in any case. Raises argparse.ArgumentTypeError otherwise."""
    value = text.strip().upper()
    if value in COLLECTIVES:
        return value
    raise argparse.ArgumentTypeError(f"{text!r}: use {', '.join(COLLECTIVES)} (--collective or ${COLLECTIVE_ENV})")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m homegpu.trainer",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        description="Train an image classifier with tf-keras under MultiWorkerMirroredStrategy. "
                    "The cluster comes from TF_CONFIG (unset: one worker using all of this machine's "
                    "GPUs). Progress goes to stdout as HOMEGPU_METRIC lines (trainer/PROTOCOL.md).",
        epilog="Restart every worker with the same TF_CONFIG and --output after a failure: training "
               "resumes at the last completed epoch, even after a crash while saving the model; once "
               "OUTPUT/DONE is on every worker, a restart trains nothing. Exit status: 0 done, 1 training failed, "
               "2 bad options, TF_CONFIG or data, 3 the workers' backups disagree (delete them).")
    parser.add_argument("--data", type=parse_data_spec, default=DataSpec("synthetic"), metavar="SOURCE",
                        help="synthetic (generated, no download), npz:PATH (keras.datasets.mnist "
                             "format: x_train, y_train[, x_test, y_test]) or dir:PATH (one folder of "
                             "PNG/JPEG images per class)")
    parser.add_argument("--model", choices=MODELS, default="cnn",
                        help="cnn: small and fast on a CPU; resnet: ResNet-50 from scratch, for GPUs")
    parser.add_argument("--epochs", type=int, default=2, metavar="N", help="epochs in all, resumed ones included")
    parser.add_argument("--batch-size", type=int, default=64, metavar="N",
                        help="per worker; the global batch is this times the number of workers")
    parser.add_argument("--steps-per-epoch", type=int, default=0, metavar="N",
                        help="0: one pass over the training set per epoch")
    parser.add_argument("--output", default=os.environ.get("HOMEGPU_OUTPUT_DIR") or "homegpu-output",
                        metavar="DIR",
                        help="this worker's directory: its backup for resuming (kept after the run: "
                             "delete it once the model is safe), DONE when finished, and on the chief "
                             "checkpoints/, tensorboard/ and the final model/; $HOMEGPU_OUTPUT_DIR "
                             "when set. Workers sharing a disk need different directories")
    parser.add_argument("--log-every", type=int, default=20, metavar="N",
                        help="print a step metric line every N steps (0: epoch lines only)")
    parser.add_argument("--seed", type=int, default=0, help="synthetic data, shuffling and weights")
    parser.add_argument("--learning-rate", type=float, default=1e-3, metavar="LR", help="Adam's")
    parser.add_argument("--image-size", type=int, default=32, metavar="PX",
                        help="synthetic and dir: images are PX×PX (npz keeps its own size)")
    parser.add_argument("--samples", type=int, default=6144, metavar="N",
                        help="synthetic: training images (plus an eighth as many for validation)")
    parser.add_argument("--collective", type=parse_collective,
                        default=os.environ.get(COLLECTIVE_ENV, "").strip() or "AUTO",
                        metavar="|".join(COLLECTIVES),
                        help="how workers all-reduce gradients: NCCL between GPUs only, RING also on "
                             f"CPUs, AUTO lets TensorFlow pick; ${COLLECTIVE_ENV} when set (homegpu "
                             "sets it: NCCL when every worker has a GPU, else RING)")
    parser.add_argument("--no-tensorboard", action="store_true",
                        help="skip TensorBoard logs (they are skipped anyway when the tensorboard "
                             "package is not installed: TensorFlow 2.21 no longer depends on it)")
    return parser


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parse and check the options; exits 2 with a usage message on a bad one."""
    parser = build_parser()
    args = parser.parse_args(argv)
    minimum = {"epochs": 1, "batch_size": 1, "steps_per_epoch": 0, "log_every": 0, "image_size": 8,
               "samples": 10}
    for name, least in minimum.items():
        if getattr(args, name) < least:
            parser.error(f"--{name.replace('_', '-')} must be at least {least}")
    if not args.learning_rate > 0:
        parser.error("--learning-rate must be positive")
    return args


def quiet_tensorflow(env: dict | os._Environ = os.environ) -> None:
    """Environment TensorFlow reads at import: tf-keras, and C++ logs from errors up by default."""
    env["TF_USE_LEGACY_KERAS"] = "1"  # Keras 3's fit() fails under MWMS on TF 2.21; tf-keras works
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    env.setdefault("GRPC_VERBOSITY", "ERROR")


def leave_jax_out(modules: dict = sys.modules) -> None:
    """TensorFlow's import tries jax (tensorflow.lite's converter) wherever JAX is installed beside it, about 0.7 s
    of CPU a worker start that the trainer never uses: marked absent, it is not imported (as where it is not there)."""
    modules.setdefault("jax", None)


def main(argv: list[str] | None = None) -> int:
    """Run the trainer; returns the exit status."""
    args = parse_args(argv)
    try:
        role = worker_role(os.environ)
    except ClusterConfigError as exc:
        return _fail(None, exc, 2)
    quiet_tensorflow()
    leave_jax_out()
    hold_to_budget()
    from homegpu.trainer import train  # TensorFlow loads here, after the environment is set
    from homegpu.trainer.backup import BackupMismatchError
    from homegpu.trainer.data import DataError

    try:
        train.run(args, role)
    except DataError as exc:
        return _fail(role, exc, 2)
    except BackupMismatchError as exc:
        return _fail(role, exc, 3)
    except KeyboardInterrupt:
        return _fail(role, "interrupted", 130)
    except Exception as exc:  # noqa: BLE001 - any failure must become a metric line and status 1
        traceback.print_exc()
        say_if_over_budget(exc)
        return _fail(role, exc, 1)
    return 0


def _fail(role: WorkerRole | None, problem: object, status: int) -> int:
    message = str(problem) or type(problem).__name__
    print(f"homegpu.trainer: {message}", file=sys.stderr, flush=True)
    fields = {"worker": role.rank, "workers": role.workers} if role else {}
    print(format_metric(event="error", message=message, status=status, **fields,
                        time=round(time.time(), 3)), flush=True)
    return status

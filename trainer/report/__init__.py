"""Progress from any script in one line: `from homegpu.report import epoch_done`, then
`epoch_done(epoch, epochs, loss=loss, accuracy=acc)` after each epoch (homegpu.trainer.report is the same).

It prints the metric line homegpu reads (PROTOCOL.md) so the run's live view, `metrics.jsonl`, the report
and serve's /metrics show the epoch and its figures. Outside a homegpu run (no HOMEGPU_OUTPUT_DIR) it does
nothing, so the script runs as before on its own. A JAX process is the worker of its process id; under
torchrun only each node's first process prints (its node is the worker homegpu shows). The figures you pass
are yours: pass the loss all processes agree on (an all_reduce'd mean) to see one curve. Standard library only;
homegpu ships it with every run.
Not the run's HTML report (report.html, `homegpu report`): remote/record/html_report.py writes that.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

from homegpu.trainer.jax_cluster import PROCESS_COUNT_ENV as JAX_PROCESS_COUNT
from homegpu.trainer.jax_cluster import PROCESS_ID_ENV as JAX_PROCESS_ID
from homegpu.trainer.metrics import format_metric

IN_A_RUN = "HOMEGPU_OUTPUT_DIR"  # set by homegpu for every worker


def epoch_done(epoch: int, epochs: int | None = None, **figures: Any) -> None:
    """Say that `epoch` (1-based: the epoch just completed) of `epochs` is done, with its figures
    (loss, accuracy, val_loss, examples_per_sec, ...: numbers; a NaN is sent as null)."""
    if IN_A_RUN not in os.environ:
        return
    place = _worker()
    if place is None:
        return  # another process of this node: its node's first process speaks for it
    worker, workers = place
    print(format_metric(event="epoch", epoch=epoch, epochs=epochs, worker=worker, workers=workers, time=time.time(),
                        **figures), flush=True)


def _worker() -> tuple[int, int] | None:
    """(this worker's index, how many): torchrun's node rank and node count, a JAX process's id and count, or
    TF_CONFIG's; None for a process under torchrun that is not its node's first."""
    if JAX_PROCESS_ID in os.environ:
        return int(os.environ[JAX_PROCESS_ID]), int(os.environ.get(JAX_PROCESS_COUNT, "1"))
    if "GROUP_RANK" in os.environ:
        if os.environ.get("LOCAL_RANK", "0") != "0":
            return None
        return int(os.environ["GROUP_RANK"]), int(os.environ.get("GROUP_WORLD_SIZE", "1"))
    try:
        config = json.loads(os.environ.get("TF_CONFIG", ""))
        return int(config["task"]["index"]), len(config["cluster"]["worker"])
    except (ValueError, KeyError, TypeError):
        return 0, 1

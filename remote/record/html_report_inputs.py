"""What the run report reads from a run's folder: run.json, metrics.jsonl, the bandwidth matrix and the
logs' last lines (the timeline has its own reader, timeline_schema.read_timeline)."""

from __future__ import annotations

import collections
import json
from pathlib import Path

from homegpu.remote.events import BandwidthMatrix
from homegpu.remote.logs import TracebackFold
from homegpu.remote.net import bandwidth_store
from homegpu.remote.record.run_folder import RunFolder
from homegpu.remote.record.timeline_schema import Series, WorkerTimeline

LOG_TAIL_LINES = 40  # of each log as shown (tracebacks folded): a whole bounded traceback fits


class ReportError(Exception):
    """The folder cannot make a report; the message names the file and what to do."""


def read_manifest(run_dir: Path) -> dict:
    """run.json as a dict ({} when there is none), its shape checked; its "bandwidth" is None or a
    BandwidthMatrix.

    Raises:
        ReportError: run.json is not JSON, or not what a run writes; the message names it.
    """
    path = RunFolder(run_dir).manifest
    if not path.is_file():
        return {}
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as exc:
        raise ReportError(f"{path}: not valid JSON ({exc}); delete it to make the report without it") from None
    try:
        return {**manifest, "bandwidth": _checked(manifest)}
    except ValueError as exc:
        raise ReportError(f"{path}: not what a run writes ({exc}); delete it to make the report without it") from None


def _checked(manifest: object) -> BandwidthMatrix | None:
    """The manifest's matrix, once its keys have the types a run writes.

    Raises:
        ValueError: saying which key is wrong.
    """
    if not isinstance(manifest, dict):
        raise ValueError("not a JSON object")
    for key, kind in (("run_id", str), ("job", dict), ("tf_configs", dict)):
        if manifest.get(key) is not None and not isinstance(manifest[key], kind):
            raise ValueError(f"{key} is {type(manifest[key]).__name__}, not {kind.__name__}")
    name = (manifest.get("job") or {}).get("name")
    if name is not None and not isinstance(name, str):
        raise ValueError(f"job.name is {name!r}")
    if manifest.get("bandwidth") is None:
        return None
    try:
        return bandwidth_store.from_json(manifest["bandwidth"])
    except ValueError as exc:
        raise ValueError(f"bandwidth: {exc}") from None


def _series(rows: list[dict], key: str) -> Series:
    rows = [row for row in rows if isinstance(row.get("time"), (int, float))]
    return Series(tuple(row["time"] for row in rows), tuple(_number(row.get(key)) for row in rows))


def _number(value: object) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def workers_from_metrics(path: Path) -> tuple[WorkerTimeline, ...]:
    """Each worker's series from metrics.jsonl (every line, never downsampled); lines that do not parse are skipped."""
    by_worker: dict[str, list[dict]] = {}
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict) and isinstance(row.get("worker_label"), str):
            by_worker.setdefault(row["worker_label"], []).append(row)
    ranks = {name: rows[0].get("worker") for name, rows in by_worker.items()}
    workers = []
    for name, rows in sorted(by_worker.items()):
        batch = next((r["batch_size"] for r in rows
                      if r.get("event") == "start" and _number(r.get("batch_size"))), None)
        steps = [r for r in rows if r.get("event") == "step"]
        epochs = [r for r in rows if r.get("event") == "epoch"]  # `end` repeats the last epoch
        rated = steps if any(_number(r.get("examples_per_sec")) is not None for r in steps) else epochs
        rates = _series(rated, "examples_per_sec")
        workers.append(WorkerTimeline(
            name, _series(steps, "loss"), _series(steps, "accuracy"), rates,
            Series(rates.times, tuple(v / batch if v is not None and batch else None for v in rates.values)),
            _series(epochs, "loss"), _series(epochs, "accuracy"), _series(epochs, "val_loss"),
            _series(epochs, "val_accuracy"), _shares(epochs, ranks.get(name), len(by_worker)),
            _series(epochs, "compute_examples_per_sec")))
    return tuple(workers)


def _shares(epochs: list[dict], rank: object, workers: int) -> Series:
    """The worker's own share of each step, from its epoch lines' `shares` (one per worker, in rank order)."""
    rows = [row for row in epochs if isinstance(row.get("time"), (int, float)) and isinstance(rank, int)
            and isinstance(row.get("shares"), list) and len(row["shares"]) == workers and 0 <= rank < workers]
    return Series(tuple(row["time"] for row in rows), tuple(_number(row["shares"][rank]) for row in rows))


def log_tails(run_dir: Path) -> dict[str, list[str]]:
    """The last LOG_TAIL_LINES lines of each logs/WORKER.log as a person should see them: each
    traceback once and bounded (TracebackFold), however long its message and however far above the
    end its header; another worker's that repeats it is one line. Each log is read as a stream."""
    fold = TracebackFold(lambda worker: f"logs/{worker}.log")
    tails = {}
    for path in sorted(RunFolder(run_dir).logs.glob("*.log")):
        tail: collections.deque[str] = collections.deque(maxlen=LOG_TAIL_LINES)
        with open(path, encoding="utf-8", errors="replace") as log:
            for line in log:
                tail.extend(fold.feed(path.stem, line.rstrip("\n")))
        tail.extend(text for _, text in fold.finish())
        tails[path.stem] = list(tail)
    return tails

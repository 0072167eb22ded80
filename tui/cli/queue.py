"""`homegpu submit JOB`, `homegpu queue`, `homegpu cancel ID`: the queue that `homegpu serve` runs, reached
through serve's socket (remote/queue/client.py). Without a serve each says in one line how to start one;
`homegpu run` never needs one. Where the placement keeps a queue of its own (Slurm's) that
queue is listed and cancelled through the placement (remote/placement/); no serve is needed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from typing import TextIO

from homegpu.remote.config import ClusterSpec
from homegpu.remote.queue import MAX_PRIORITY, EntryState, QueueClient, QueueError, entry_fields, socket_path
from homegpu.remote.placement import Placement, PlacementError, make_placement
from homegpu.tui.cli.common import UserError, load_spec
from homegpu.tui.view.queue_text import FINISHED_SHOWN, format_queue, format_slurm_queue, job_words, slurm_job_fields
from homegpu.tui.view.text import serve_command


def register(commands: argparse._SubParsersAction) -> None:
    submit = commands.add_parser(
        "submit", help="queue a run: serve starts it once its nodes' GPUs are free",
        description="Add a run of JOB (a job of the cluster file) to the queue that `homegpu serve` runs. It starts "
                    "when every node of the job is online and its GPUs are free (no other user's process holds "
                    "more than 10% of one, no other queued run uses it), in priority then submission order. "
                    "On a Slurm cluster (scheduler = \"slurm\") serve submits it to Slurm at once and Slurm decides "
                    "when it runs (--priority N is sbatch's --nice=-N). Prints its queue id.",
        epilog="examples:\n  homegpu submit train\n  homegpu submit train --set epochs=20 --set batch_size=256\n"
               "  homegpu submit evaluate --after q-12\n  homegpu submit train --priority 10 --set env.SEED=3",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    submit.add_argument("job", metavar="JOB", help="a job of the cluster file ([jobs.JOB])")
    submit.add_argument("--after", action="append", default=[], metavar="ID",
                        help="start only once queue entry ID has succeeded (cancelled if it fails); repeatable")
    submit.add_argument("--priority", type=_priority, default=0, metavar="N",
                        help="higher starts first (default 0; equal priorities go in submission order)")
    submit.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="this run's own setting of a job key: epochs, batch_size, steps_per_epoch, args, "
                             "env.NAME, data, model, data_dir, restart, max_restarts, stall_timeout, "
                             "reconnect_timeout, keras, min_workers, on_fewer_workers, rejoin; repeatable (VALUE as in TOML: args=[\"--lr\", \"0.01\"])")
    submit.set_defaults(handler=run_submit)

    queue = commands.add_parser(
        "queue", help="list the queue: running, waiting (and why), finished",
        description="List the queue that `homegpu serve` runs: running entries, then waiting ones in the order "
                    "they will start with why each waits, then the latest finished. On a Slurm cluster: homegpu's "
                    "jobs in Slurm's queue (squeue on slurm_login) with why each waits, then serve's entries when "
                    "a serve runs.",
    )
    queue.add_argument("--all", action="store_true", help="list every finished entry, not only the latest 10")
    queue.add_argument("--json", action="store_true", help="print every entry as one JSON object for scripts")
    queue.set_defaults(handler=run_queue)

    cancel = commands.add_parser(
        "cancel", help="cancel a queued run, or stop it if it runs",
        description="Cancel queue entry ID: a waiting one never starts; a running one is stopped (TERM to every "
                    "worker, KILL after a grace period) and ends as cancelled. Entries waiting --after it are "
                    "cancelled too. On a Slurm cluster a number is a Slurm job id of homegpu's (`homegpu queue` "
                    "lists them): scancel, and the run on its nodes stops.",
    )
    cancel.add_argument("ids", nargs="+", metavar="ID",
                        help="a queue id such as q-12, or on a Slurm cluster a Slurm job id (`homegpu queue` lists them)")
    cancel.set_defaults(handler=run_cancel)


def _priority(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if abs(value) > MAX_PRIORITY:
        raise argparse.ArgumentTypeError(f"use a whole number from -{MAX_PRIORITY} to {MAX_PRIORITY}")
    return value


def client(spec: ClusterSpec) -> QueueClient:
    return QueueClient(socket_path(spec), serve_command(spec))


def _ask(request):
    try:
        return asyncio.run(request)
    except (QueueError, PlacementError) as exc:
        raise UserError(str(exc)) from None


def run_submit(args: argparse.Namespace, out: TextIO | None = None) -> int:
    out = out or sys.stdout
    entry = _ask(client(load_spec(args)).submit(args.job, args.after, args.priority, args.overrides))
    waits = f", after {', '.join(entry.after)}" if entry.after else ""
    print(f"{entry.id}  {job_words(entry)}  queued{waits}; `homegpu queue` shows when it starts, "
          f"`homegpu cancel {entry.id}` takes it back", file=out)
    return 0


def run_queue(args: argparse.Namespace, out: TextIO | None = None) -> int:
    out = out or sys.stdout
    spec = load_spec(args)
    placed = _ask(make_placement(spec).queued())
    if placed is not None:
        return _placed_queue(args, spec, placed, out)
    entries = _ask(client(spec).entries())
    if args.json:
        json.dump({"entries": [entry_fields(entry) for entry in entries]}, out, indent=2)
        print(file=out)
    else:
        print(format_queue(entries, time.time(), None if args.all else FINISHED_SHOWN), file=out)
    return 0


def _placed_queue(args: argparse.Namespace, spec: ClusterSpec, jobs: list, out: TextIO) -> int:
    """The placement's queue of homegpu's jobs (Slurm's), then, where a serve runs, its entries (those not placed
    yet among them: one waiting --after another)."""
    try:
        entries = asyncio.run(client(spec).entries())
    except QueueError:
        entries = None  # no serve: Slurm's queue is the whole queue
    if args.json:
        served = {"entries": [entry_fields(entry) for entry in entries]} if entries is not None else {}
        json.dump({"slurm_jobs": [slurm_job_fields(job) for job in jobs], **served}, out, indent=2)
        print(file=out)
        return 0
    print(format_slurm_queue(jobs), file=out)
    if entries is not None:
        print(f"\nqueued in serve:\n{format_queue(entries, time.time(), None if args.all else FINISHED_SHOWN)}",
              file=out)
    return 0


def _placed_cancel(placement: Placement, ids: list[str], out: TextIO) -> int:
    """Cancel each of homegpu's runs in the placement's queue named; another's, or one it does not know, is said
    and left."""
    failed = _ask(placement.cancel_queued(ids, lambda line: print(line, file=out),
                                          lambda line: print(f"homegpu: {line}", file=sys.stderr)))
    return 2 if failed else 0


def run_cancel(args: argparse.Namespace, out: TextIO | None = None) -> int:
    out = out or sys.stdout
    spec = load_spec(args)
    placement = make_placement(spec)
    if placement.owns_ids(args.ids):  # the placement's ids (Slurm's job ids); q-N are serve's entries
        return _placed_cancel(placement, args.ids, out)
    queue, failed = client(spec), 0
    for id_ in args.ids:
        try:
            entry = asyncio.run(queue.cancel(id_))
        except QueueError as exc:
            print(f"homegpu: {exc}", file=sys.stderr)
            failed += 1
            continue
        if entry.state is EntryState.CANCELLED:
            print(f"{entry.id}  {job_words(entry)}  cancelled", file=out)
        else:
            print(f"{entry.id}  {job_words(entry)}  stopping run {entry.run_id} (TERM to every worker, then KILL); "
                  "it ends as cancelled", file=out)
    return 2 if failed else 0

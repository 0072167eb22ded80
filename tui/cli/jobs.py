"""`homegpu run`, `jobs`, `logs`, `stop` and `tfconfig`: jobs from the command line."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys
from pathlib import Path

from homegpu.remote.config import PER_GPU, ClusterSpec
from homegpu.remote.events import NodeState
from homegpu.remote.jobs import JobRuntimes, LaunchError, list_workers
from homegpu.remote.nodes import Cluster, cause
from homegpu.remote.plan import JobConfigError, find_job, job_node_specs, last_timeline, lay_out
from homegpu.remote.runtimes import WorkerStatus
from homegpu.tui.cli.common import EXPERIMENTS, UserError, load_spec
from homegpu.tui.cli.headless import run_headless
from homegpu.tui.view.text import table


def register(commands: argparse._SubParsersAction) -> None:
    run = commands.add_parser(
        "run", help="train a job across its nodes, or attach to it if it runs",
        description="Preflight every node of JOB, ship the code, start one TensorFlow worker per node with "
                    "its TF_CONFIG, and follow the run: per-node log lines, a progress line per epoch, and a "
                    "summary. A failed or stalled worker restarts the whole job (restart, max_restarts). "
                    "Logs, metrics and the chief's final model land in experiments/RUN-ID/. With no "
                    "cluster.toml it runs the demo job on this machine (two local workers). Ctrl-C stops "
                    "every worker. Exit status 0 only when every worker succeeded.",
    )
    run.add_argument("job", nargs="?", metavar="JOB", help="job name (default: the only job)")
    run.add_argument("--no-tui", action="store_true",
                     help="plain output for scripts and cron (the default when not on a terminal)")
    run.add_argument("--detach", action="store_true", help="start the job and return; it keeps running")
    run.add_argument("--experiments", type=Path, default=EXPERIMENTS, metavar="DIR",
                     help="where runs are recorded (default: ./experiments)")
    run.set_defaults(handler=run_job)

    jobs = commands.add_parser("jobs", help="list the workers on every node, running or finished",
                               description="List every worker homegpu started on the nodes, from the "
                                           "state kept on the nodes themselves.")
    jobs.set_defaults(handler=list_jobs)

    logs = commands.add_parser(
        "logs", help="print (or follow) a job's logs from its nodes",
        description="Print the latest run's log of every worker of JOB, read from the nodes over SSH, each "
                    "line prefixed with its worker; -f keeps following them. The full logs of runs started "
                    "from this machine are also in experiments/RUN-ID/logs/.")
    logs.add_argument("job", metavar="JOB", help="job name from cluster.toml")
    logs.add_argument("--node", metavar="NODE", help="only this node's worker")
    logs.add_argument("-f", "--follow", action="store_true", help="keep following until Ctrl-C")
    logs.add_argument("--run", metavar="RUN_ID", default="",
                      help="this run's logs (default: the latest), where runs of JOB share cards at once")
    logs.set_defaults(handler=show_logs)

    stop = commands.add_parser(
        "stop", help="stop a running job on every node (TERM, then KILL)",
        description="Stop every worker of JOB's running run on every node, whichever homegpu started it: "
                    "TERM, a grace period, then KILL. Exit status 0 once none runs. Where several runs of JOB "
                    "share cards at once (the queue's gpu_memory), --run names the one to stop.")
    stop.add_argument("job", metavar="JOB", help="job name from cluster.toml")
    stop.add_argument("--run", metavar="RUN_ID", default="", help="the run to stop, where JOB runs several times")
    stop.set_defaults(handler=stop_job)

    tfconfig = commands.add_parser(
        "tfconfig", help="print a job's device plan and each worker's TF_CONFIG",
        description="Ask JOB's nodes for their address and GPUs, then print the device plan as `homegpu run` "
                    "would lay it out: each worker's node, index, address and devices, the collective, the "
                    "batch and who sets the pace; then the TF_CONFIG environment variable each worker gets. "
                    "Nothing is started.")
    tfconfig.add_argument("job", nargs="?", metavar="JOB", help="job name (default: the only job)")
    tfconfig.add_argument("--offline", action="store_true",
                          help="do not connect: addresses from cluster.toml only, and no device plan")
    tfconfig.set_defaults(handler=print_tfconfig)


def _job(spec: ClusterSpec, name: str | None):
    try:
        return find_job(spec, name)
    except JobConfigError as exc:
        raise UserError(str(exc)) from None


def run_job(args: argparse.Namespace) -> int:
    spec = load_spec(args)
    job = _job(spec, args.job)
    if args.no_tui or args.detach or not (sys.stdin.isatty() and sys.stdout.isatty()):
        return asyncio.run(run_headless(spec, job, args.experiments, args.detach))
    from homegpu.tui.app.main import run_app

    return run_app(spec, args.experiments, launch=job.name)


def print_tfconfig(args: argparse.Namespace) -> int:
    """The plan, then each worker's TF_CONFIG. Exit 1 when the plan refuses the layout (said in one
    line, as `homegpu run` would refuse it), after the TF_CONFIG the job's default layout would get."""
    spec = load_spec(args)
    job = _job(spec, args.job)
    names = [node.name for node in job_node_specs(spec, job)]
    if args.offline:
        resolved = {node.name: (node.cluster_address, "cluster.toml") for node in job_node_specs(spec, job)}
        gpus: dict = {}
    else:
        resolved, gpus = asyncio.run(_ask_nodes(spec, names))
    for name, (address, source) in resolved.items():
        print(f"{name}: {address} ({source})")
    addresses = {name: address for name, (address, _) in resolved.items()}
    layout = lay_out(spec, job, gpus, addresses, last_timeline(EXPERIMENTS, job.name))
    silent, slots = layout.silent, layout.slots
    if layout.plan:
        print("", *layout.plan_lines(), sep="\n")
    elif args.offline:
        print("\ndevices not asked (--offline): a \"per-gpu\" node shows one worker here")
    elif silent:
        print(f"\nno device plan: {', '.join(silent)} did not report {'its' if len(silent) == 1 else 'their'} "
              "GPUs (see `homegpu status`); a \"per-gpu\" node shows one worker here")
    print()
    for slot in slots:
        role = "chief" if slot.is_chief else "worker"
        print(f"{slot.label} ({role}, index {slot.index}):\n  {layout.launch_line(job, slot)}")
    if layout.refusal:
        print(f"homegpu: {layout.refusal}", file=sys.stderr)
        return 1
    return 0


async def _ask_nodes(spec: ClusterSpec, names: list[str]) -> tuple[dict[str, tuple[str, str]], dict]:
    """Each node's (cluster address, where it comes from), and its first stats (its GPUs; None for a
    node that did not answer)."""
    async with Cluster(spec) as cluster:
        resolved = await cluster.resolve_addresses(names)
        await asyncio.gather(*(_first_stats(cluster, name) for name in names))
        return resolved, {name: cluster.node(name).latest for name in names}


async def _first_stats(cluster: Cluster, name: str) -> None:
    node = cluster.node(name)
    if node.latest is None and node.state is NodeState.ONLINE:
        with contextlib.suppress(asyncio.TimeoutError):
            await node.wait_for(lambda n: n.latest is not None, 3 * cluster.spec.stats_interval + 5)


def list_jobs(args: argparse.Namespace) -> int:
    """The table of workers, then a line per damaged state file. Exit 1 when a node could not be
    listed or a state file is damaged (the table is then incomplete)."""
    spec = load_spec(args)
    rows, problems = asyncio.run(_collect_workers(spec))
    if rows:
        print(table(("JOB", "RUN", "WORKER", "NODE", "GENERATION", "STATE"), rows))
    elif not problems:
        print("no workers on any node")
    for problem in problems:
        print(problem)
    return 1 if problems or any(row[-1].startswith("not listed") for row in rows) else 0


async def _collect_workers(spec: ClusterSpec) -> tuple[list[tuple], list[str]]:
    """(a row per worker and per node not listed, sorted; each damaged state file's line)."""
    async with Cluster(spec, stream_stats=False) as cluster:
        found = await list_workers(cluster)
    rows, problems = [], []
    for node, workers in found:
        if isinstance(workers, LaunchError):
            rows.append(("?", "?", "?", node, "?", f"not listed: {workers}"))
            continue
        rows += [(w.job or "?", w.run_id or "?", w.label, node, "?" if w.generation is None else str(w.generation),
                  w.state if w.exit_status is None else f"{w.state} ({w.exit_status})") for w in workers]
        problems += [w.problem for w in workers if w.problem]
    return sorted(rows), problems


def stop_job(args: argparse.Namespace) -> int:
    spec = load_spec(args)
    job = _job(spec, args.job)
    return asyncio.run(_stop(spec, job, args.run))


def _cluster_for(spec: ClusterSpec, job) -> Cluster:
    """A Cluster for acting on the job's runs; it streams stats only for a "per-gpu" job, whose
    workers per node follow the nodes' GPUs (JobRuntimes lays them out from the first stats)."""
    return Cluster(spec, stream_stats=job.workers_per_node == PER_GPU)


async def _open_job_runtimes(cluster: Cluster, job) -> JobRuntimes:
    """The job's runtimes, for commands that act on runs started elsewhere."""
    try:
        return await JobRuntimes.open(cluster, job)
    except LaunchError as exc:
        raise UserError(f"cannot reach the job's nodes: {exc}") from None


RUNS_NAMED = 5  # where --run names none of a job's runs: the newest this many are named


def _one_run(job, runs: list[tuple[str, int]], run_id: str, what: str) -> tuple[str, int] | None:
    """The run `run_id` names among `runs` (newest first), or the only one; a UserError where --run names none of
    them, or where several run at once and none was named."""
    if run_id:
        named = next((run for run in runs if run[0] == run_id), None)
        if named is None:
            more = f" and {len(runs) - RUNS_NAMED} more" if len(runs) > RUNS_NAMED else ""
            listed = f" (those {what}: {', '.join(r for r, _ in runs[:RUNS_NAMED])}{more})" if runs else ""
            raise UserError(f"no run {run_id} of {job.name} {what} on its nodes{listed}")
        return named
    if len(runs) > 1:
        raise UserError(f"{job.name} runs {len(runs)} times at once ({', '.join(r for r, _ in runs)}): name one "
                        "with --run RUN_ID (`homegpu queue` says which queue entry each is)")
    return runs[0] if runs else None


async def _stop(spec: ClusterSpec, job, run_id: str = "") -> int:
    async with _cluster_for(spec, job) as cluster:
        nodes = await _open_job_runtimes(cluster, job)
        active = _one_run(job, await nodes.runs(), run_id, "running")
        if active is None:
            print(f"{job.name} is not running")
            return 0
        await nodes.mark_stopped(active[0])  # the `homegpu run` watching it ends it as stopped, not restarts it
        results = await nodes.stop(active[0])
        statuses = [s for s in results if isinstance(s, WorkerStatus) and not s.problem]
        for status in statuses:
            code = f" ({status.exit_status})" if status.exit_status is not None else ""
            print(f"{status.label}: {status.state}{code}")
        unknown = [f"{slot.label}: not stopped: {_why(result)}" for slot, result in zip(nodes.slots, results)
                   if not isinstance(result, WorkerStatus) or result.problem]
        left = [s.label for s in statuses if s.running]
        if left:
            print(f"still running: {', '.join(left)}")
        if unknown:
            print(*unknown, sep="\n")
        if left or unknown:
            return 1
        print(f"stopped {job.name} (run {active[0]})")
        return 0


def _why(result: WorkerStatus | BaseException) -> str:
    if isinstance(result, WorkerStatus):
        return result.problem
    return cause(result)


def show_logs(args: argparse.Namespace) -> int:
    spec = load_spec(args)
    job = _job(spec, args.job)
    return asyncio.run(_logs(spec, job, args.node, args.follow, args.run))


async def _logs(spec: ClusterSpec, job, node: str | None, follow: bool, run_id: str = "") -> int:
    async with _cluster_for(spec, job) as cluster:
        nodes = await _open_job_runtimes(cluster, job)
        runs = await nodes.runs(running_only=False)
        latest = _one_run(job, runs, run_id, "found") if run_id else (runs[0] if runs else None)
        if latest is None:
            raise UserError(f"no run of {job.name} found on its nodes")
        running = [run for run, _ in await nodes.runs()] if not run_id and len(runs) > 1 else []
        if len(running) > 1:
            print(f"{job.name} runs {len(running)} times at once ({', '.join(running)}): these are "
                  f"{latest[0]}'s logs; --run RUN_ID shows another's", file=sys.stderr)
        run_id, generation = latest
        try:
            slots = nodes.slots_on(node)
        except LookupError as exc:
            raise UserError(str(exc)) from None
        width = max(len(s.label) for s in slots)
        tails = nodes.tails(run_id, generation, slots, follow=follow,
                            on_line=lambda line: print(f"{line.worker:>{width}} | {line.text}", flush=True))
        stop = asyncio.Event()
        asyncio.get_running_loop().add_signal_handler(signal.SIGINT, stop.set)
        waiting = [asyncio.create_task(t.finished.wait()) for t in tails]
        done = asyncio.create_task(stop.wait()) if follow else asyncio.gather(*waiting)
        await done
        for tail in tails:
            await tail.stop()
        for task in waiting:
            task.cancel()
    return 0

"""Plain-text renderings shared by the commands and the TUI (no Textual): tables of specs, snapshots,
the bandwidth matrix, doctor's report and the command that starts serve."""

from __future__ import annotations

import dataclasses
import shlex
import shutil
from itertools import groupby
from pathlib import Path
from typing import Callable, Iterable, Mapping, Sequence

from homegpu.remote.config import (
    BUDGETS, DEFAULT_CONFIG_NAME, EMBEDDED_DEFAULT, SWITCHES, AlertRules, ClusterSpec, JobSpec, NotifyTarget, Tariff,
)
from homegpu.remote.doctor import Check
from homegpu.remote.events import NA, BandwidthMatrix, Metric
from homegpu.remote.jobs import keras3_problem
from homegpu.remote.net import format_gbits
from homegpu.remote.nodes import (
    SshTarget, budget_text, card_budgets, gib, held_back, jump_hostname_address, owner_text,
)
from homegpu.remote.plan import worker_slots
from homegpu.remote.record import LiveRun

DIAGONAL = "—"
NOT_MEASURED = "·"
CHECK_MARKS = {True: "✓", False: "✗", None: "-"}


def number(value: object, spec: str = ".4f") -> str:
    return format(value, spec) if isinstance(value, (int, float)) else "n/a"


def money(amount: float) -> str:
    """An amount of money to the cent, or to two significant digits below a cent, so a small cost (an idle GPU's
    half hour) never reads 0.00."""
    return f"{amount:.2f}" if amount == 0 or abs(amount) >= 0.01 else f"{amount:.2g}"


def rate_text(metric: Metric) -> str:
    """"412 examples/s", or "37.0 steps/s" where a script's Keras says only its steps."""
    value, unit = metric.rate()
    return f"{number(value, '.0f' if unit == 'examples/s' else '.1f')} {unit}"


def worker_share(shares: Sequence[int] | None, place: int | None, workers: int | None) -> tuple[int, int] | None:
    """(its share, the global batch): a worker's share of a step in a balanced run of a replica each (`place`: its
    rank among `workers`); None otherwise (not balanced, or shares per replica of workers with several)."""
    if not shares or place is None or len(shares) != workers or not 0 <= place < len(shares):
        return None
    return shares[place], sum(shares)


def share_text(shares: Sequence[int] | None, place: int | None, workers: int | None) -> str:
    """"422/512" (worker_share), or ""."""
    share = worker_share(shares, place, workers)
    return f"{share[0]}/{share[1]}" if share else ""


def step_text(metric: Metric | None) -> str:
    """"a step 1.09 s compute + 0.16 s besides + 0.09 s waiting": a balanced run's worker's step in parts, from
    its epoch line; "" where it told none."""
    if metric is None or metric.compute_seconds is None:
        return ""
    parts = zip((metric.compute_seconds, metric.overhead_seconds, metric.wait_seconds),
                ("compute", "besides", "waiting"))
    return "a step " + " + ".join(f"{seconds:.2g} s {what}" for seconds, what in parts if seconds is not None)


def balance_text(share: str, step: str) -> str:
    """"share 441/512, a step 1.1 s compute + …": what share_text and step_text told, as the TUI and status say it;
    "" where neither told anything."""
    return ", ".join(text for text in (share and f"share {share}", step) if text)


def epoch_line(metric: Metric, total: object) -> str:
    """An epoch's figures as `run --no-tui` and the TUI's logs show them:
    "epoch 2/6  loss 1.8467  accuracy 0.4083  val_loss 1.7759  val_accuracy 0.4240  37.0 steps/s"."""
    figures = "  ".join(f"{name} {number(value)}" for name, value in metric.figures().items())
    return f"epoch {metric.epoch}/{total}  {figures}  {rate_text(metric)}"


class EpochEcho:
    """The built-in trainer says each epoch twice: its metric line, then the same figures in its own words
    (`epoch 2/2  loss …  (2.7 s, …)`). A front end that shows the metric as epoch_line drops those words."""

    def __init__(self) -> None:
        self._shown: set[str] = set()  # workers whose epoch was just shown

    def shown(self, worker: str) -> None:
        self._shown.add(worker)

    def repeats(self, worker: str, text: str) -> bool:
        """Whether `worker`'s next line `text` is the trainer's words for the epoch just shown."""
        if worker not in self._shown:
            return False
        self._shown.discard(worker)
        return text.startswith("epoch ")


def table(headers: Sequence[str], rows: Sequence[Sequence[object]], indent: str = "  ") -> str:
    """Left-aligned columns sized to their widest cell."""
    cells = [[str(cell) for cell in row] for row in [headers, *rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    return "\n".join(
        indent + "  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in cells
    )


def format_cluster(spec: ClusterSpec, targets: Mapping[str, SshTarget]) -> str:
    """What `homegpu check` prints: the cluster settings, then one row per node.

    Args:
        targets: node name -> where its SSH connection goes (nodes.ssh_target), for every node that
            is not "local": host, port and user as homegpu will use them, with where each comes from.
    """
    ssh = spec.ssh
    jobs = ", ".join(spec.jobs) or "none"
    lines = [
        f"{spec.source}: cluster {spec.name!r}, {_plural(len(spec.nodes), 'node')}, jobs: {jobs}",
        f"  ssh: user {ssh.user or '(from ~/.ssh/config or login)'}, "
        f"key {ssh.identity_file or '(ssh defaults)'}, known_hosts {ssh.known_hosts}",
        f"       connect timeout {ssh.connect_timeout:g}s, keepalive every {ssh.keepalive_interval:g}s, "
        f"offline after {ssh.keepalive_count_max} missed",
        f"  stats every {spec.stats_interval:g}s",
        f"  electricity: {_tariff_text(spec.tariff)}",
        f"  the rest of the machines: RAPL where the node's user can read it, else {_host_watts_text(spec.nodes)}",
        *_sleep_and_wake_lines(spec.nodes),
        "",
    ]
    rows = [
        (node.name, *_ssh_columns(node, targets.get(node.name)), _configured_address(node, targets.get(node.name)),
         node.runtime if node.runtime == "docker" else f"process ({node.python})",
         spec.work_dir_of(node), ",".join(node.tags) or "-")
        for node in spec.nodes
    ]
    lines.append(table(("NODE", "HOST", "PORT", "USER", "ADDRESS", "RUNTIME", "WORK DIR", "TAGS"), rows))
    lines += _ssh_config_problems(targets.values())
    lines += ["", *_format_jobs(spec), "", *format_alerts(spec.alerts)]
    return "\n".join(lines)


def _tariff_text(tariff: Tariff) -> str:
    """`0.35 EUR a kWh, 0.18 22:00-06:00`, or how to set a price."""
    if not tariff.priced:
        return "no price (runs show their energy; price_per_kwh in [cluster] adds the cost)"
    periods = "".join(f", {period.price:g} {period.text}" for period in tariff.periods)
    return f"{tariff.price_per_kwh:g} {tariff.currency} a kWh".replace("  ", " ") + periods


def _host_watts_text(nodes) -> str:
    """`desk 45-150 W, closet 30 W`: the estimates idle_watts/busy_watts set, or that none is set."""
    set_ = [f"{n.name} {n.idle_watts:g}" + (f"-{n.busy_watts:g}" if n.busy_watts not in (None, n.idle_watts) else "")
            + " W" for n in nodes if n.idle_watts is not None]
    return ("estimated: " + ", ".join(set_)) if set_ else "GPU only (idle_watts and busy_watts in [[nodes]] estimate it)"


def _sleep_and_wake_lines(nodes) -> list[str]:
    """A line per node that homegpu may wake or put to sleep (its mac, wake_via, sleep_after, sleep_command,
    wake_timeout), or how to let it."""
    lines = []
    for node in nodes:
        keys = node.sleep_wake
        if not keys.wakeable and keys.sleep_after is None:
            continue
        wake = (f"woken by {keys.mac}" + (f" from {keys.wake_via}" if keys.wake_via else "")
                + f", {keys.wake_timeout:g}s to boot") if keys.wakeable else "not woken (no mac)"
        sleep = (f"asleep after {keys.sleep_after:g}s idle by {keys.sleep_command!r}"
                 if keys.sleep_after is not None else "never put to sleep by serve (no sleep_after)")
        lines.append(f"    {node.name}: {wake}; {sleep}")
    if not lines:
        return ["  sleep and wake: none (mac in [[nodes]] lets homegpu wake a node, sleep_after puts it to sleep idle)"]
    return ["  sleep and wake:", *lines]


def format_alerts(rules: AlertRules, which: Callable[[str], str | None] = shutil.which) -> list[str]:
    """The [alerts] rules as `check` shows them, and whether the command's program is found here."""
    if not rules.enabled and not rules.command:
        return ["Alerts: none ([alerts] in docs/reference.md: a GPU too hot, a node offline, a job that failed ...)."]
    on = []
    if rules.gpu_temperature is not None:
        on.append(f"GPU at {rules.gpu_temperature:g} °C or more")
    if rules.gpu_memory_percent is not None:
        on.append(f"GPU memory {rules.gpu_memory_percent:g}% used or more")
    if rules.node_offline_seconds is not None:
        on.append(f"node offline {rules.node_offline_seconds:g}s")
    on += [key.replace("_", " ") for key in SWITCHES if getattr(rules, key)]
    on += [f"{key.replace('_', ' ')} {getattr(rules, key):g}" for key in BUDGETS if getattr(rules, key) is not None]
    lines = [f"Alerts: {', '.join(on) if on else 'no rule is on'}"]
    lines += [f"  {target.shown(index)}: {_routed(target)}" for index, target in enumerate(rules.notify, 1)]
    if not rules.command:
        lines.append("  shown in the TUI and `run` output" + (", and sent to the notify URLs" if rules.notify else
                                                             " only (no command, no notify URLs)"))
        return lines
    found = "" if which(rules.command[0]) else f"  (not found: {rules.command[0]} is not on this machine's PATH)"
    lines.append(f"  command: {shlex.join(rules.command)}{found}")
    lines.append(f"  runs here for each alert and each clear, killed after {rules.command_timeout:g}s")
    return lines


def _routed(target: NotifyTarget) -> str:
    """Which alerts a notify URL gets, as `check` says it."""
    return "every alert and clear" if not target.kinds else "only " + ", ".join(sorted(target.kinds))


def _format_jobs(spec: ClusterSpec) -> list[str]:
    """A row per job, or what to do when there is none."""
    if not spec.jobs:
        first = spec.nodes[0].name if spec.nodes else "NODE"
        return [f"No job yet: add one, e.g. a [jobs.demo] table with nodes = [\"{first}\"] trains the built-in "
                "demo there (docs/reference.md)."]
    rows = [(job.name, runs_what(job), ", ".join(job.nodes) if job.nodes else "every node", job.workers_per_node,
             job.port, _goes_on_with(job)) for job in spec.jobs.values()]
    refusals = [f"✗ {job.name}: {problem}" for job in spec.jobs.values()
                if (problem := keras3_problem(job, spec.source, len(worker_slots(spec, job))))]
    return [table(("JOB", "RUNS", "NODES", "WORKERS/NODE", "PORT", "MIN WORKERS"), rows), *refusals,
            "", "Next: homegpu doctor, then homegpu run JOB (homegpu tfconfig JOB shows each worker's TF_CONFIG)."]


def _goes_on_with(job: JobSpec) -> str:
    """min_workers as `check` shows it: `all` (a machine that leaves fails the run), or the fewest a run goes on
    with and, for the built-in trainer, which batch it keeps (on_fewer_workers)."""
    if not job.min_workers:
        return "all"
    return f"{job.min_workers} ({job.on_fewer_workers})" if job.uses_trainer else str(job.min_workers)


def runs_what(job: JobSpec) -> str:
    """The built-in trainer, or the script with what its `import keras` gives on the workers."""
    if job.is_pytorch:
        return f"{job.script or 'the PyTorch demo'} under torchrun"
    if job.is_jax:
        return f"{job.script or 'the JAX demo'} with jax.distributed"
    if job.uses_trainer:
        return "built-in trainer"
    return f"{job.script} ({'import keras runs tf-keras' if job.keras == 'tf-keras' else 'keras as installed'})"


def _ssh_columns(node, target: SshTarget | None) -> tuple[str, str, str]:
    """HOST (with the HostName an alias stands for), PORT and USER as homegpu connects, and from where."""
    if target is None:  # a "local" node: no SSH
        return node.host, "-", "-"
    host = node.host if target.host == node.host else f"{node.host} → {target.host}"
    host += f" via {target.jump}" if target.jump else ""
    return host, f"{target.port} ({target.port_from})", f"{target.user} ({target.user_from})"


def _ssh_config_problems(targets: Iterable[SshTarget]) -> list[str]:
    """Each ssh config that could not be read, once: the rows above then show cluster.toml's values and the
    defaults, which connecting does not use (it fails with the same line until the file is fixed)."""
    problems = dict.fromkeys(target.problem for target in targets if target.problem)
    return [f"✗ {problem} (PORT and USER above are cluster.toml's or the defaults; fix it to connect)"
            for problem in problems]


def _configured_address(node, target: SshTarget | None) -> str:
    """What `check` can say about a node's cluster address without connecting: where it comes from."""
    if node.address:
        return f"{node.address} (address)"
    if node.is_local:
        return node.cluster_address
    if target is not None and target.jump:  # no socket peer through a gateway: what the others reach
        return f"{target.host} (HostName)" if jump_hostname_address(target) else f"{target.host} as {node.name} resolves it"
    return f"where ssh reaches {node.host}"


def _plural(count: int, word: str) -> str:
    return f"{count} {word}{'' if count == 1 else 's'}"


# -- status -------------------------------------------------------------------------------------


def format_status(nodes: Sequence, watched: bool = False, runs: Sequence[LiveRun] = ()) -> str:
    """One block per node: a state line, then a line per GPU (or "CPU only"); then the runs recorded here now
    (remote/record/live_runs.py). `watched`: see _gpu_held_back."""
    return "\n".join([*(_node_block(node, watched) for node in nodes), *_runs_lines(runs)])


def _runs_lines(runs: Sequence[LiveRun]) -> list[str]:
    """Each run recorded here now, and each of its workers' latest epoch: its pace and, in a balanced run, its share
    of a step and its step in parts."""
    if not runs:
        return []
    lines = ["", "runs recorded here now:"]
    for run in runs:
        lines.append(f"  {run.run_id}")
        width = max((len(label) for label, _ in run.epochs), default=0)
        lines += [f"    {label:<{width}}  {_worker_epoch(metric)}".rstrip() for label, metric in run.epochs]
        lines += [] if run.epochs else ["    no epoch yet"]
    return lines


def _worker_epoch(metric: Metric) -> str:
    """"epoch 3/6  327 examples/s  share 441/512, a step 1.1 s compute + 0.16 s besides + 0.09 s waiting"."""
    told = balance_text(share_text(metric.shares, metric.rank, metric.workers), step_text(metric))
    return f"epoch {metric.epoch}/{metric.epochs or '?'}  {rate_text(metric)}  {told}"


def _gpu_held_back(node, gpu, watched: bool = False) -> list[str]:
    """What holds `gpu` of `node` back, in sentences. One reading (status once) judges every reason active in it;
    `watched` (status --watch, the node's session having judged each line as it came: its `health`) judges a
    reason once held a few seconds, with since when, as the TUI does."""
    if watched:
        return node.health.causes([gpu.index])
    return held_back(gpu, at=node.latest.timestamp)


def _node_block(node, watched: bool) -> str:
    mark = STATE_MARKS.get(node.state.value, "?")
    head = f"{mark} {node.name:<12} {node.spec.host:<16} {node.address:<15} {node.state.value}"
    stats = node.latest
    if stats is None:
        waiting = getattr(node, "waiting_on", "")  # a login still not done, say
        detail = node.reason or (f"(waiting for stats: {waiting})" if waiting else "(waiting for stats)")
        return f"{head}\n    {detail}"
    head += (f"   cpu {stats.cpu:5.1f}%  load {stats.load[0]:4.2f}  "
             f"mem {gib(stats.mem_used, 5)}/{gib(stats.mem_total, 5)} GiB ({stats.mem_percent:3.0f}%)")
    if not stats.gpus:
        return f"{head}\n    CPU only (no GPU found)"
    lines = [head, f"    GPUs via {stats.source}, driver {stats.driver}, CUDA {stats.cuda}"]
    for gpu in stats.gpus:
        lines.append(_gpu_line(gpu))
        if budgets := card_budgets(gpu):
            lines.append(f"        {budgets}")
        lines += [f"        held back: {cause}" for cause in _gpu_held_back(node, gpu, watched)]
        lines += [_process_line(process) for process in gpu.processes]
    return "\n".join(lines)


def _gpu_line(gpu) -> str:
    return (f"    [{gpu.index}] {str(gpu.name)[:28]:<28} util {gpu.util:3.0f}%  "
            f"mem {gib(gpu.mem_used, 5)}/{gib(gpu.mem_total, 5)} GiB  {gpu.temp:3.0f}°C  "
            f"{gpu.power:5.0f}/{gpu.power_limit:3.0f} W  procs {len(gpu.processes)}")


def _process_line(process) -> str:
    """`        pid 4242  python3              19.6 GiB  homegpu worker 0 of job demo run R, gpu_memory 24.0 GiB`."""
    budget = budget_text(process.owner)
    return (f"        pid {process.pid:<7} {str(process.name)[-20:]:<20} {gib(process.mem, 5)} GiB  "
            f"{owner_text(process.owner)}" + (f", {budget}" if budget else ""))


STATE_MARKS = {
    "online": "●", "connecting": "…", "offline": "✗", "auth failed": "!", "host key unknown": "?",
    "host key changed": "!", "asleep": "☾",
}


def status_json(cluster_name: str, nodes: Sequence, at: float, watched: bool = False,
                runs: Sequence[LiveRun] = ()) -> dict:
    """The documented `status --json` object; "not available" values become null. `watched`: see _gpu_held_back."""
    return {
        "cluster": cluster_name,
        "at": at,
        "nodes": [
            {"name": node.name, "host": node.spec.host, "address": node.address,
             "address_source": node.address_source, "state": node.state.value, "reason": node.reason,
             "fingerprint": node.fingerprint,
             "stats": _stats_json(node, watched) if node.latest else None}
            for node in nodes
        ],
        "runs": [{"run_id": run.run_id, "workers": [_worker_json(label, metric) for label, metric in run.epochs]}
                 for run in runs],
    }


def _worker_json(label: str, metric: Metric) -> dict:
    """A worker's latest epoch in `status --json`: its pace, and in a balanced run its share and step in parts."""
    share, global_batch = worker_share(metric.shares, metric.rank, metric.workers) or (None, None)
    return {"worker": label, "rank": metric.rank, "epoch": metric.epoch, "epochs": metric.epochs,
            "examples_per_sec": metric.examples_per_sec, "share": share, "global_batch": global_batch,
            "step_seconds": metric.step_seconds, "compute_seconds": metric.compute_seconds,
            "overhead_seconds": metric.overhead_seconds, "wait_seconds": metric.wait_seconds}


def _stats_json(node, watched: bool) -> dict:
    """A node's stats as JSON, each GPU's clocks in one object and what holds it back in words."""
    stats = node.latest
    obj = _jsonable(dataclasses.asdict(stats))
    for gpu, gpu_obj in zip(stats.gpus, obj["gpus"]):
        sm_max, mem, mem_max = (gpu_obj.pop(key) for key in ("sm_clock_max", "mem_clock", "mem_clock_max"))
        gpu_obj["clocks"] = {"sm": gpu_obj["sm_clock"], "sm_max": sm_max, "mem": mem, "mem_max": mem_max}
        gpu_obj["held_back"] = _gpu_held_back(node, gpu, watched)
    return obj


def _jsonable(value):
    if value is NA:
        return None
    if isinstance(value, dict):
        return {key: _jsonable(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(item) for item in value]
    return value


# -- bandwidth ----------------------------------------------------------------------------------


def format_matrix(matrix: BandwidthMatrix, names: Sequence[str], not_measured: str = "not measured (--star)") -> str:
    """Rows are sources, columns destinations, in Gbit/s; errors as `err[N]` with footnotes below.

    Links that fail for the same reason (an offline node fails all of its links) share a footnote.
    """
    footnotes: dict[str, int] = {}
    rows = [[src, *(_cell(matrix, src, dst, footnotes) for dst in names)] for src in names]
    lines = ["Gbit/s, rows: from, columns: to", table(["FROM \\ TO", *names], rows)]
    lines += [f"  [{number}] {error}" for error, number in footnotes.items()]
    if any(NOT_MEASURED in row for row in rows):
        lines.append(f"  {NOT_MEASURED} {not_measured}")
    return "\n".join(lines)


def _cell(matrix: BandwidthMatrix, src: str, dst: str, footnotes: dict[str, int]) -> str:
    if src == dst:
        return DIAGONAL
    result = matrix.get(src, dst)
    if result is None:
        return NOT_MEASURED
    if result.ok:
        return format_gbits(result.gbits, unit=False)
    number = footnotes.setdefault(result.error, len(footnotes) + 1)
    return f"err[{number}]"


# -- doctor -------------------------------------------------------------------------------------


def format_check(check: Check) -> str:
    """`  ✓ name: detail`, `  ✗ name: detail — fix: ...`, `  - name: detail`."""
    line = f"  {CHECK_MARKS[check.ok]} {check.name}: {check.detail}"
    return f"{line} — fix: {check.fix}" if check.ok is False and check.fix else line


def format_report(spec: ClusterSpec, checks: Sequence[Check]) -> str:
    """A header per node, its checks, then one summary line."""
    lines = []
    for name, group in groupby(checks, key=lambda check: check.node):
        node = spec.node(name)
        lines.append(f"{name} ({node.host}, runtime {node.runtime})")
        lines.extend(format_check(check) for check in group)
    lines.append(_summary(checks))
    return "\n".join(lines)


def _summary(checks: Sequence[Check]) -> str:
    failed = [check for check in checks if check.ok is False]
    if not failed:
        return "all checks passed"
    nodes = sorted({check.node for check in failed})
    return f"{len(failed)} problem{'s' if len(failed) != 1 else ''} on {', '.join(nodes)}"


def serve_command(spec: ClusterSpec) -> str:
    """How to start the serve of `spec`'s cluster file from here: the command a "no serve" line names."""
    if spec.source == EMBEDDED_DEFAULT:
        return "homegpu --local serve"
    path = Path(spec.source).resolve()
    if path == Path(DEFAULT_CONFIG_NAME).resolve():
        return "homegpu serve"
    return f"homegpu --config {shlex.quote(str(path))} serve"

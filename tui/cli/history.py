"""`homegpu history [NODE] [--since 2h|1d|7d] [--json]`: what the cluster did, from the history that
`homegpu serve` records: each GPU's utilisation and memory over the window (sparklines), GPU-hours per
user and per job run, each GPU's energy and cost with its idle part, per user and run too, and when each
node was offline."""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict
from typing import TextIO

from homegpu.remote.config import ClusterSpec, duration_seconds
from homegpu.remote.history import (
    GpuEnergy, GpuSeries, HistoryReader, HostEnergy, NodeOffline, OwnerEnergy, history_path,
)
from homegpu.tui.cli.common import UserError, load_spec
from homegpu.tui.view.plot import sparkline
from homegpu.tui.view.text import money, table

POINTS = 48  # sparkline cells
RECORDING_SLACK = 30.0  # seconds: a history whose newest sample is older than this is not being recorded
START_SERVE = "start `homegpu serve` to record it (docs/always-on.md)"


def register(commands: argparse._SubParsersAction) -> None:
    history = commands.add_parser(
        "history", help="what the cluster did: GPU use, GPU-hours per user and job",
        description="Read the history `homegpu serve` records for this cluster file: each GPU's utilisation and "
                    "memory over the window, GPU-hours per user and per job run, and when each node was offline.",
    )
    history.add_argument("node", nargs="?", metavar="NODE", help="only this node")
    history.add_argument("--since", default="2h", type=since_seconds, metavar="AGE",
                         help="how far back: 30m, 2h, 1d, 7d (default 2h)")
    history.add_argument("--json", action="store_true", help="print one JSON object for scripts")
    history.set_defaults(handler=run_history)


def since_seconds(text: str) -> float:
    seconds = duration_seconds(text)
    if not seconds:
        raise argparse.ArgumentTypeError(f"{text!r} is not an age: write a number and s, m, h, d or w (2h, 1d, 7d)")
    return seconds


def run_history(args: argparse.Namespace, out: TextIO | None = None) -> int:
    spec = load_spec(args)
    if args.node is not None and args.node not in {node.name for node in spec.nodes}:
        raise UserError(f"no node {args.node!r} in {spec.source}; use one of: {', '.join(n.name for n in spec.nodes)}")
    path = history_path(spec)
    if not path.is_file():
        raise UserError(f"no history of cluster {spec.name} yet ({path}): {START_SERVE}")
    now = time.time()
    with HistoryReader(path) as reader:
        since = now - args.since
        report = Report(spec, args.node, since, now, reader.span(), reader.gpus(since, now, POINTS),
                        reader.gpu_hours_by_user(since, now), reader.gpu_hours_by_run(since, now),
                        reader.offline(since, now), reader.gpu_energy(since, now, spec.tariff),
                        reader.owner_energy(since, now, spec.tariff), reader.host_energy(since, now, spec.tariff))
    out = out or sys.stdout
    print(json.dumps(report.as_json()) if args.json else report.text(), file=out)
    return 0


class Report:
    """One window of the history, for one node or all, as text or JSON."""

    def __init__(self, spec: ClusterSpec, node: str | None, since: float, until: float, span, gpus, users, runs,
                 offline, energy=(), owner_energy=(), host_energy=()) -> None:
        self.spec, self.node, self.since, self.until, self.span = spec, node, since, until, span
        self.gpus: tuple[GpuSeries, ...] = tuple(g for g in gpus if node in (None, g.node))
        self.users, self.runs = users, runs
        self.energy: tuple[GpuEnergy, ...] = tuple(e for e in energy if node in (None, e.node))
        self.owner_energy: tuple[OwnerEnergy, ...] = owner_energy
        self.host_energy: tuple[HostEnergy, ...] = tuple(e for e in host_energy if node in (None, e.node))
        self.offline: tuple[NodeOffline, ...] = tuple(o for o in offline if node in (None, o.node))

    @property
    def recording(self) -> bool:
        return self.span is not None and self.until - self.span[1] <= RECORDING_SLACK

    def text(self) -> str:
        lines = [f"{self.spec.name}{' · ' + self.node if self.node else ''}: the last {_age(self.until - self.since)}"
                 f" ({_clock(self.since)} to {_clock(self.until)})"]
        if not self.recording:
            last = f"its last sample is from {_when(self.span[1])}" if self.span else "it holds no sample yet"
            lines.append(f"not recording now ({last}): {START_SERVE}")
        lines += ["", "GPUs: utilisation and memory, oldest left"]
        lines += [self._gpu_line(gpu) for gpu in self.gpus] or ["  no GPU seen in this window"]
        lines += ["", "GPU-hours by user"]
        lines += [table(("USER", "GPU-HOURS"), [(u.user or "(unknown)", f"{u.gpu_hours:.2f}") for u in self.users])
                  if self.users else "  none"]
        lines += ["", "GPU-hours by job run"]
        lines += [table(("JOB", "RUN", "USER", "GPU-HOURS"),
                        [(r.job, r.run_id, r.user or "-", f"{r.gpu_hours:.2f}") for r in self.runs])
                  if self.runs else "  none"]
        lines += ["", "Energy of the GPUs" + (f" ({self.spec.tariff.currency or 'cost'} at the tariff of "
                                                 f"{self.spec.source})" if self.spec.tariff.priced else "")]
        lines += self._energy_lines()
        lines += ["", "Offline and asleep"]
        lines += [self._offline_line(node) for node in self.offline] or ["  no node known yet"]
        return "\n".join(lines)

    def _energy_lines(self) -> list[str]:
        if not self.energy and not self.host_energy:
            return ["  none recorded in this window (GPUs that report their power, or machines with RAPL or "
                    "idle_watts, with serve running)"]
        priced = self.spec.tariff.priced

        def cost(value: float) -> str:
            return money(value) if priced else "-"
        lines = self._gpu_lines(cost) if self.energy else ["  no GPU reported its power in this window"]
        lines += self._host_lines(cost)
        if not priced:
            lines.append("  set price_per_kwh in [cluster] of cluster.toml for the cost")
        return lines

    def _gpu_lines(self, cost) -> list[str]:
        """Each GPU's energy with its idle part, then per user and per run where processes used them."""
        rows = [(f"{e.node} GPU {e.gpu}", f"{e.energy_kwh:.3f}", cost(e.cost), f"{e.idle_kwh:.3f}", cost(e.idle_cost),
                 e.method) for e in self.energy]
        total = sum(e.energy_kwh for e in self.energy)
        rows.append(("all", f"{total:.3f}", cost(sum(e.cost for e in self.energy)),
                     f"{sum(e.idle_kwh for e in self.energy):.3f}", cost(sum(e.idle_cost for e in self.energy)), ""))
        lines = [table(("GPU", "KWH", "COST", "IDLE KWH", "IDLE COST", "HOW"), rows)]
        users: dict[str, list[float]] = {}
        for owner in self.owner_energy:
            found = users.setdefault(owner.user or "(unknown)", [0.0, 0.0])
            found[0] += owner.energy_kwh
            found[1] += owner.cost
        if users:
            lines += [table(("USER", "KWH", "COST"), [(user, f"{kwh:.3f}", cost(money)) for user, (kwh, money) in
                                                      sorted(users.items(), key=lambda item: -item[1][0])])]
        runs = [(o.job, o.run_id, f"{o.energy_kwh:.3f}", cost(o.cost)) for o in self.owner_energy if o.run_id]
        if runs:
            lines += [table(("JOB", "RUN", "KWH", "COST"), runs)]
        return lines

    def _host_lines(self, cost) -> list[str]:
        """The rest of each machine (CPUs, memory, board), where RAPL measured or idle_watts estimated it."""
        nodes = [n.name for n in self.spec.nodes if self.node in (None, n.name)]
        gpu_only = [name for name in nodes if name not in {e.node for e in self.host_energy}]
        lines = ["", "Energy of the rest of the machines"]
        if self.host_energy:
            lines.append(table(("NODE", "KWH", "COST", "HOW"), [(e.node, f"{e.energy_kwh:.3f}", cost(e.cost), e.method)
                                                              for e in self.host_energy]))
        if gpu_only:
            lines.append(f"  {', '.join(gpu_only)}: GPU only (RAPL not readable there: set idle_watts and busy_watts "
                         "in its [[nodes]] table for an estimate)")
        return lines

    def energy_by_node(self) -> list[dict]:
        """Each node's energy in the window: its GPUs', the rest of the machine's, in all, and how."""
        hosts = {e.node: e for e in self.host_energy}
        rows = []
        for name in dict.fromkeys([*(e.node for e in self.energy), *hosts]):
            gpus = [e for e in self.energy if e.node == name]
            host = hosts.get(name)
            gpu_kwh, host_kwh = sum(e.energy_kwh for e in gpus), host.energy_kwh if host else 0.0
            rows.append({"node": name, "energy_kwh": gpu_kwh + host_kwh, "gpu_kwh": gpu_kwh, "host_kwh": host_kwh,
                         "cost": sum(e.cost for e in gpus) + (host.cost if host else 0.0),
                         "host_method": host.method if host else "gpu only"})
        return rows

    def _gpu_line(self, gpu: GpuSeries) -> str:
        util = [u for u in gpu.util if u is not None]
        mem = [m for m in gpu.mem_used if m is not None]
        total = gpu.mem_total or (max(mem) if mem else 0) or 1
        mem_share = [None if m is None else 100 * m / total for m in gpu.mem_used]
        util_figure = f"avg {sum(util) / len(util):3.0f}%" if util else "avg   -"
        mem_figure = f"max {max(mem) / 1024:.1f}/{total / 1024:.1f} GiB" if mem else "max   -"
        return (f"  {gpu.node} GPU {gpu.gpu} {gpu.name}\n    util {sparkline(gpu.util, POINTS)}  {util_figure}\n"
                f"    mem  {sparkline(mem_share, POINTS)}  {mem_figure}")

    def _offline_line(self, node: NodeOffline) -> str:
        """Its offline spells, then those it slept (homegpu put it to sleep) and what they saved."""
        if not node.intervals:
            return f"  {node.node}: online throughout"
        asleep = [i for i in node.intervals if i.state == "asleep"]
        down = [i for i in node.intervals if i.state != "asleep"]
        parts = [self._spells("offline", down), self._spells("asleep", asleep) + self._saved(node.node, asleep)]
        return f"  {node.node}: " + "; ".join(part for part in parts if part)

    def _spells(self, what: str, intervals: list) -> str:
        if not intervals:
            return ""
        spans = ", ".join(f"{_clock(i.start)}–{'now' if i.ongoing else _clock(i.stop)} ({i.state}"
                          f"{': ' + i.reason if i.reason else ''})" for i in intervals)
        return f"{what} {_age(self._inside(intervals))} in {len(intervals)} interval(s): {spans}"

    def _saved(self, name: str, asleep: list) -> str:
        """What sleeping saved, at the machine's idle_watts (its GPUs' idle draw not counted: at least this)."""
        watts = next((n.idle_watts for n in self.spec.nodes if n.name == name), None)
        if not asleep or not watts:
            return ""
        kwh = watts * self._inside(asleep) / 3_600_000
        cost = f", {money(kwh * self.spec.tariff.price_at(time.time()))} {self.spec.tariff.currency}".rstrip() \
            if self.spec.tariff.priced else ""
        return f", saving at least {kwh:.3f} kWh{cost} (its idle_watts {watts:g} W)"

    def _inside(self, intervals: list) -> float:
        """Seconds of `intervals` inside the window."""
        return sum(max(0.0, min(i.stop, self.until) - max(i.start, self.since)) for i in intervals)

    def as_json(self) -> dict:
        return {"cluster": self.spec.name, "node": self.node, "since": self.since, "until": self.until,
                "recording": self.recording, "gpus": [asdict(g) for g in self.gpus],
                "gpu_hours_by_user": [asdict(u) for u in self.users],
                "gpu_hours_by_run": [asdict(r) for r in self.runs], "offline": [asdict(o) for o in self.offline],
                "currency": self.spec.tariff.currency, "priced": self.spec.tariff.priced,
                "energy_by_gpu": [asdict(e) for e in self.energy],
                "energy_by_owner": [asdict(o) for o in self.owner_energy], "energy_by_node": self.energy_by_node()}


def _age(seconds: float) -> str:
    for unit, size in (("d", 86_400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            whole, rest = divmod(round(seconds), size)
            smaller = {"d": ("h", 3600), "h": ("min", 60), "min": ("s", 1)}[unit]
            return f"{whole} {unit}" + (f" {rest // smaller[1]} {smaller[0]}" if rest // smaller[1] else "")
    return f"{seconds:.0f} s"


def _clock(t: float) -> str:
    return time.strftime("%H:%M:%S" if time.time() - t < 86_400 else "%Y-%m-%d %H:%M", time.localtime(t))


def _when(t: float) -> str:
    return f"{time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(t))}, {_age(time.time() - t)} ago"

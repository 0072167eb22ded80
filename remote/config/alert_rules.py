"""`[alerts]`: the thresholds that raise an alert, and the command and Apprise URLs that deliver it, as frozen
AlertRules.

Validated with checks.py's Validator, like the rest of cluster.toml. The command is an argument
list run without a shell; its arguments may hold `{placeholders}` (PLACEHOLDERS), filled in per
alert, and are checked here so that a typo in one is refused before anything runs. A `notify` URL is checked for
its shape only (Apprise, imported when alerts are sent, knows its services); a problem names the URL by its place
and scheme, never by its text, which may hold a token.
"""

from __future__ import annotations

import re
import string
from dataclasses import dataclass

from homegpu.remote.config.checks import Check, Limits, Validator, show
from homegpu.remote.config.durations import Duration
from homegpu.remote.config.key_tables import ALERTS

# (lowest, highest, unit) of each number
LIMITS: Limits = {
    "gpu_temperature": (1.0, 150.0, " °C"),
    "gpu_memory_percent": (1.0, 100.0, "%"),
    "node_offline_seconds": (1.0, 604_800.0, " seconds (a week)"),
    "command_timeout": (1.0, 3600.0, " seconds"),
    "budget_per_day": (0.0, 1e6, " (in [cluster].currency)"),
    "budget_per_run": (0.0, 1e6, " (in [cluster].currency)"),
}
BUDGETS = ("budget_per_day", "budget_per_run")  # what the electricity may cost; need [cluster].price_per_kwh
SWITCHES = ("job_failed", "job_stalled", "straggler", "job_succeeded", "run_shrunk", "queued_runs")
# What the rules raise (an alert's kind): queued_runs raises one kind per state of a queued run.
QUEUED_RUN_KINDS = ("queued_run_started", "queued_run_succeeded", "queued_run_failed", "queued_run_cancelled")
KINDS = ("gpu_temperature", "gpu_memory", "node_offline", "job_failed", "job_stalled", "straggler", "job_succeeded",
         "run_shrunk",
         *QUEUED_RUN_KINDS, *BUDGETS)
MAX_ARGS = 100
MAX_NOTIFY = 32  # URLs
# the rule names a notify target may route: each alert kind, and queued_runs for all four of its kinds
ROUTES = {**{kind: (kind,) for kind in KINDS}, "queued_runs": QUEUED_RUN_KINDS}
_URL_RE = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://\S+")

# What `{name}` in a command argument becomes (remote/alerts/command.py fills them in).
PLACEHOLDERS = {
    "title": "a short headline: homegpu CLUSTER: what happened (cleared)",
    "message": "one sentence: what happened, with the figures",
    "alert": "the rule: " + ", ".join(KINDS),
    "state": '"firing", or "cleared" when the condition is over',
    "node": "the node (empty for job alerts)",
    "gpu": "the GPU index (empty unless a GPU alert)",
    "worker": "the worker (straggler alerts)",
    "job": "the job of the run, if one runs",
    "run_id": "the run's id, if one runs",
    "queue_id": "the queue entry (q-12) a queued run's alert is about (empty for other alerts)",
    "value": "the measured value (°C, %, seconds offline, a cost)",
    "threshold": "the rule's threshold",
    "cluster": "[cluster].name",
    "time": "when, as 2026-11-22T12:00:00+01:00",
}


@dataclass(frozen=True)
class NotifyTarget:
    """One `notify` URL and the alert kinds it gets (empty: every one)."""

    url: str
    kinds: frozenset[str] = frozenset()

    def wants(self, kind: str) -> bool:
        return not self.kinds or kind in self.kinds

    @property
    def scheme(self) -> str:
        return self.url.split("://", 1)[0]

    def shown(self, place: int) -> str:
        """How messages name it: its place in the list and its service, never its URL (which may hold a token)."""
        return f"notify {place} ({self.scheme}://…)"


@dataclass(frozen=True)
class AlertRules:
    """The [alerts] table; a threshold of None and a switch of False are off."""

    gpu_temperature: float | None = None  # °C: a GPU at or above it fires; 5 °C below clears
    gpu_memory_percent: float | None = None  # % of a GPU's memory used; 5 points below clears
    node_offline_seconds: float | None = None  # a node that was online, unreachable this long
    job_failed: bool = False
    job_stalled: bool = False
    straggler: bool = False
    job_succeeded: bool = False
    run_shrunk: bool = False  # a run went on without a machine that left (its job's min_workers)
    queued_runs: bool = False  # each run of `homegpu serve`'s queue: started, succeeded, failed, cancelled
    command: tuple[str, ...] = ()
    command_timeout: float = 30.0
    budget_per_day: float | None = None  # the cluster's electricity today (local day) costs at least this: fires once
    budget_per_run: float | None = None  # a run's GPUs have cost at least this: fires once per run
    notify: tuple[NotifyTarget, ...] = ()  # Apprise URLs each alert and clear goes to (remote/alerts/notify.py)

    @property
    def enabled(self) -> bool:
        """Whether any rule is on (else nothing needs watching)."""
        thresholds = (self.gpu_temperature, self.gpu_memory_percent, self.node_offline_seconds,
                      self.budget_per_day, self.budget_per_run)
        return any(value is not None for value in thresholds) or any(getattr(self, key) for key in SWITCHES)


def template_fields(template: str) -> list[str]:
    """The `{names}` of a command argument, in order.

    Raises:
        ValueError: a brace without its pair, or a field with a conversion or format (`{a!r}`, `{a:5}`).
    """
    names = []
    for _, name, spec, conversion in string.Formatter().parse(template):
        if name is None:
            continue
        if spec or conversion:
            raise ValueError(f"{{{name}}} may not have a format or conversion")
        names.append(name)
    return names


def parse_alerts(v: Validator, data: dict) -> AlertRules:
    """The `[alerts]` table of the parsed file, validated (AlertRules() when there is none). Raises ConfigError."""
    path = ("alerts",)
    table = v.table(data, path)
    v.unknown_keys(table, path, ALERTS.names, ALERTS.hint)
    get = v.getter(table, path, LIMITS)
    return AlertRules(
        gpu_temperature=get("gpu_temperature", float, None),
        gpu_memory_percent=get("gpu_memory_percent", float, None),
        node_offline_seconds=get("node_offline_seconds", Duration, None),
        **{key: get(key, bool, False) for key in SWITCHES},
        command=tuple(get("command", list, [], _check_command(v))),
        command_timeout=get("command_timeout", Duration, AlertRules.command_timeout),
        budget_per_day=get("budget_per_day", float, None),
        budget_per_run=get("budget_per_run", float, None),
        notify=_notify_targets(v, table.get("notify", []), path + ("notify",)),
    )


_NOTIFY_EXAMPLE = 'notify = ["ntfys://ntfy.sh/my-topic", { url = "tgram://TOKEN/CHAT", alerts = ["job_failed"] }]'


def _notify_targets(v: Validator, value: object, path: tuple) -> tuple[NotifyTarget, ...]:
    """The `notify` list: URLs, or tables of a url and the alerts it gets."""
    if not isinstance(value, list):
        raise v.fail(path, f"{show(value) if not isinstance(value, str) else 'a string'} is not a list",
                     f"write it as a list: {_NOTIFY_EXAMPLE}")
    if len(value) > MAX_NOTIFY:
        raise v.fail(path, f"{len(value)} URLs", f"send alerts to at most {MAX_NOTIFY}")
    return tuple(_notify_target(v, item, path, index) for index, item in enumerate(value, 1))


def _notify_target(v: Validator, item: object, path: tuple, index: int) -> NotifyTarget:
    table = item if isinstance(item, dict) else {"url": item}
    unknown = sorted(set(table) - {"url", "alerts"})
    if unknown:
        raise v.fail(path, f"entry {index} has the key {show(unknown[0])}", "give each entry url and alerts only")
    url = table.get("url")
    if not isinstance(url, str) or not _URL_RE.fullmatch(url.strip()):
        what = "has no url" if url is None else "is not an Apprise URL (SERVICE://...)"
        raise v.fail(path, f"entry {index} {what}", f"write it like {_NOTIFY_EXAMPLE}")
    target = NotifyTarget(url.strip())
    if "alerts" not in table:
        return target
    alerts = table["alerts"]
    if not isinstance(alerts, list) or not alerts or not all(isinstance(name, str) for name in alerts):
        raise v.fail(path, f"entry {index} ({target.scheme}://…): alerts must be a list of rule names",
                     "list the rules it gets, e.g. alerts = [\"job_failed\", \"job_succeeded\"], or leave alerts out")
    wrong = [name for name in alerts if name not in ROUTES]
    if wrong:
        raise v.fail(path, f"entry {index} ({target.scheme}://…): unknown alert {show(wrong[0])}",
                     "use " + ", ".join(ROUTES))
    return NotifyTarget(target.url, frozenset(kind for name in alerts for kind in ROUTES[name]))


_EXAMPLE = 'command = ["notify-send", "{title}", "{message}"]'


def _check_command(v: Validator) -> Check:
    def check(path: tuple, value: list) -> None:
        if not value:
            raise v.fail(path, "the command is empty", f"write it like {_EXAMPLE}, or leave it out")
        if len(value) > MAX_ARGS:
            raise v.fail(path, f"{len(value)} arguments", f"an alert command needs at most {MAX_ARGS}")
        for index, item in enumerate(value):
            if not isinstance(item, str):
                raise v.fail(path, f"{show(item)} is not a string", f"write every argument in quotes: {_EXAMPLE}")
            if "\0" in item:
                raise v.fail(path, f"argument {index + 1} holds a NUL character", "remove it")
            _check_template(v, path, index, item)
        if not value[0].strip() or value[0].startswith("-"):
            raise v.fail(path, f"{show(value[0])} is not a program",
                         f"start with the program to run, then its arguments: {_EXAMPLE}")
    return check


def _check_template(v: Validator, path: tuple, index: int, item: str) -> None:
    try:
        names = template_fields(item)
    except ValueError as exc:
        raise v.fail(path, f"argument {show(item)}: {exc}",
                     "write {{ and }} for a literal brace, and {name} for a placeholder") from None
    unknown = [name for name in names if name not in PLACEHOLDERS]
    if unknown:
        raise v.fail(path, f"unknown placeholder {show('{' + unknown[0] + '}')} in {show(item)}",
                     "use " + ", ".join(f"{{{name}}}" for name in PLACEHOLDERS))
    if index == 0 and names:
        raise v.fail(path, f"the program {show(item)} holds a placeholder",
                     "name the program itself; placeholders go in its arguments")

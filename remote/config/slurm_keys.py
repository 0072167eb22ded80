"""The Slurm keys of cluster.toml: `[cluster]`'s scheduler and slurm_login, and a job's partition, account,
qos, time_limit and gres, checked as sbatch would read them.

A cluster whose scheduler is "slurm" submits each run as one Slurm job through sbatch on `slurm_login`
(remote/slurm/ builds the command). On homegpu's own scheduler the job keys would do nothing, so they are
refused there, naming the fix, rather than ignored. time_limit is written back as Slurm itself prints a
limit (`30:00`, `2:00:00`, `1-00:00:00`), so a message can quote it beside sinfo's.
"""

from __future__ import annotations

import re

from homegpu.remote.config.checks import HOST_RE, NAME_RE, Check, Validator, show

HOMEGPU, SLURM = "homegpu", "slurm"
SCHEDULERS = (HOMEGPU, SLURM)
SLURM_JOB_KEYS = ("partition", "account", "qos", "time_limit", "gres")
MAX_TIME_LIMIT = 365 * 24 * 3600  # a year: past any real partition's limit, so only a typo meets it

# sbatch --time's six forms: M, M:S, H:M:S, D-H, D-H:M, D-H:M:S (squeue(1), sbatch(1) "-t").
_TIME_FORMS = (
    re.compile(r"(?P<m>\d{1,7})"),
    re.compile(r"(?P<m>\d{1,7}):(?P<s>\d{1,2})"),
    re.compile(r"(?P<h>\d{1,5}):(?P<m>\d{1,2}):(?P<s>\d{1,2})"),
    re.compile(r"(?P<d>\d{1,3})-(?P<h>\d{1,2})"),
    re.compile(r"(?P<d>\d{1,3})-(?P<h>\d{1,2}):(?P<m>\d{1,2})"),
    re.compile(r"(?P<d>\d{1,3})-(?P<h>\d{1,2}):(?P<m>\d{1,2}):(?P<s>\d{1,2})"),
)
_TIME_HINT = ('use one of Slurm\'s forms: "MM", "MM:SS", "HH:MM:SS", "D-HH", "D-HH:MM" or "D-HH:MM:SS" (e.g. '
              '"4:00:00"; seconds and minutes after the first field up to 59, hours after days up to 23)')
# a generic resource as sbatch --gres takes it: NAME[:TYPE][:COUNT], several joined by commas
_GRES_RE = re.compile(r"[a-z][a-z0-9_]{0,31}(:[A-Za-z][A-Za-z0-9_.-]{0,63})?(:[1-9][0-9]{0,3})?")


def time_limit_seconds(text: str) -> int | None:
    """Seconds in one of sbatch's time forms, or None when it is none of them (or a field overflows:
    seconds past 59, minutes past 59 after hours, hours past 23 after days)."""
    for form in _TIME_FORMS:
        match = form.fullmatch(text)
        if match:
            parts = {key: int(value) for key, value in match.groupdict().items() if value is not None}
            days, hours, minutes, seconds = (parts.get(key, 0) for key in "dhms")
            leading = next(key for key in "dhm" if key in parts)  # the first field may be as large as it likes
            if seconds > 59 or (minutes > 59 and leading != "m") or (hours > 23 and leading != "h"):
                return None
            return ((days * 24 + hours) * 60 + minutes) * 60 + seconds
    return None


def format_time_limit(seconds: int) -> str:
    """A limit as Slurm prints one (squeue's TIME_LIMIT, sinfo's TIMELIMIT): M:SS, H:MM:SS or D-HH:MM:SS."""
    minutes, secs = divmod(seconds, 60)
    hours, minutes = divmod(minutes, 60)
    days, hours = divmod(hours, 24)
    if days:
        return f"{days}-{hours:02d}:{minutes:02d}:{secs:02d}"
    if hours:
        return f"{hours}:{minutes:02d}:{secs:02d}"
    return f"{minutes}:{secs:02d}"


def gres_gpus(gres: str) -> int:
    """GPUs per node that a --gres asks for ("gpu:rtx4090:2" → 2, "gpu" → 1, none → 0)."""
    total = 0
    for item in filter(None, gres.split(",")):
        parts = item.split(":")
        if parts[0] == "gpu":
            total += int(parts[-1]) if len(parts) > 1 and parts[-1].isdigit() else 1
    return total


def check_scheduler(v: Validator, table: dict) -> tuple[str, str]:
    """`[cluster]`'s (scheduler, slurm_login), the login required by Slurm and refused without it."""
    get = v.getter(table, ("cluster",))
    scheduler = get("scheduler", str, HOMEGPU, v.choice(
        SCHEDULERS, f'use "{HOMEGPU}" (homegpu starts each worker itself) or "{SLURM}" (each run is a Slurm job)',
        "scheduler"))
    login = get("slurm_login", str, "", _check_login(v))
    if scheduler == SLURM and not login:
        raise v.fail(("cluster", "scheduler"), '"slurm" needs slurm_login, the machine where sbatch runs',
                     'add slurm_login = "NAME" to [cluster]: a [[nodes]] name or an ~/.ssh/config alias')
    if scheduler != SLURM and login:
        raise v.fail(("cluster", "slurm_login"), "is only used when jobs run through Slurm",
                     'set scheduler = "slurm" in [cluster], or remove slurm_login')
    return scheduler, login


def scheduler_keys(scheduler: str, login: str) -> dict[str, str]:
    """`[cluster]`'s scheduler keys as cluster.toml writes them: none for homegpu's own scheduler (the default)."""
    return {} if scheduler == HOMEGPU else {"scheduler": scheduler, "slurm_login": login}


def _check_login(v: Validator) -> Check:
    def check(path: tuple, value: str) -> None:
        v.check_safe(path, value, "a host name")
        if not HOST_RE.fullmatch(value):
            raise v.fail(path, f"invalid login {show(value)}",
                         "use a [[nodes]] name, a host name or an ~/.ssh/config alias")
    return check


def parse_slurm_job(v: Validator, table: dict, path: tuple, scheduler: str) -> dict[str, str]:
    """A job's Slurm keys, checked and normalised (time_limit as Slurm prints it); refused, naming the
    fix, on a cluster whose scheduler is not Slurm."""
    if scheduler != SLURM:
        for key in SLURM_JOB_KEYS:
            if key in table:
                raise v.fail(path + (key,), "a Slurm key, but this cluster's jobs run on homegpu's own scheduler",
                             f'set scheduler = "slurm" and slurm_login in [cluster], or remove {key}')
        return {}
    get = v.getter(table, path)
    if isinstance(table.get("time_limit"), int) and not isinstance(table["time_limit"], bool):
        raise v.fail(path + ("time_limit",), f"expected a string, got an integer {show(table['time_limit'])}",
                     f'write it in quotes, as sbatch reads it: time_limit = "{table["time_limit"]}" (minutes)')
    time_limit = get("time_limit", str, "", _check_time_limit(v))
    return {
        "partition": get("partition", str, "", _check_names(v, "partition", several=True)),
        "account": get("account", str, "", _check_names(v, "account")),
        "qos": get("qos", str, "", _check_names(v, "qos")),
        "time_limit": format_time_limit(time_limit_seconds(time_limit) or 0) if time_limit else "",
        "gres": get("gres", str, "", _check_gres(v)),
    }


def _check_names(v: Validator, what: str, several: bool = False) -> Check:
    """A Slurm name (a partition may be a comma-separated list of them: the first that can start it)."""
    def check(path: tuple, value: str) -> None:
        names = value.split(",") if several else [value]
        if not all(NAME_RE.fullmatch(name) for name in names):
            listed = ", comma-separated for several" if several else ""
            raise v.fail(path, f"invalid {what} {show(value)}",
                         f"use the {what}'s name as Slurm lists it{listed} (letters, digits, - _ .)")
    return check


def _check_time_limit(v: Validator) -> Check:
    def check(path: tuple, value: str) -> None:
        seconds = time_limit_seconds(value)
        if seconds is None:
            raise v.fail(path, f"invalid time limit {show(value)}", _TIME_HINT)
        if not 0 < seconds <= MAX_TIME_LIMIT:
            raise v.fail(path, f"{show(value)} is {'no time' if not seconds else 'more than a year'}",
                         "give the run the time it needs, or leave time_limit out for the partition's default")
    return check


def _check_gres(v: Validator) -> Check:
    def check(path: tuple, value: str) -> None:
        if not all(_GRES_RE.fullmatch(item) for item in value.split(",")):
            raise v.fail(path, f"invalid gres {show(value)}",
                         'write it as sbatch --gres takes it: NAME[:TYPE][:COUNT] per node, e.g. "gpu:1" or '
                         '"gpu:rtx4090:2"')
    return check

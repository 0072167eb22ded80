"""`--set KEY=VALUE`: one run's own settings for a queued job, checked as cluster.toml's are.

VALUE is a TOML value (`epochs=5`, `stall_timeout=600.0`, `args=["--lr", "0.01"]`, `data="npz:/d/mnist.npz"`);
text that is not one is taken as a string, so bare words need no quotes (`model=resnet`,
`data=npz:/d/mnist.npz`). `env.NAME=VALUE` sets one variable on top of the job's `env`, VALUE always text
(`env.SEED=3` is "3"). `args` replaces the job's list.

Only what one run may change: how long and how it trains, its data, model, arguments, environment, and
how it recovers. Not where it runs or what code it runs (nodes, workers_per_node, share_gpus, port, image,
python, script, code_dir): those decide the run's GPUs, the job's lock on its chief node and what is
synced, which the queue and `homegpu run` must agree on; another setting of them is another job.

The result is the job with the settings replaced, validated by the same checks as cluster.toml
(config's `parse_job_table`), and every mistake is one line naming the `--set` and the fix.
"""

from __future__ import annotations

import difflib
import tomllib
from dataclasses import fields, replace
from typing import Any, Sequence

from homegpu.remote.config import ClusterSpec, ConfigError, JobSpec, parse_job_table
from homegpu.remote.queue.entries import QueueError

PER_RUN_KEYS = ("epochs", "batch_size", "steps_per_epoch", "args", "env", "data", "model", "data_dir", "restart",
                "max_restarts", "stall_timeout", "reconnect_timeout", "keras", "min_workers", "on_fewer_workers",
                "rejoin", "checkpoint", "balance", "gpu_memory")
_WHERE = ("nodes", "workers_per_node", "share_gpus", "port")
_WHAT = ("image", "python", "script", "code_dir")
_SHOWN = 60  # characters of a --set quoted in a message


class OverrideError(QueueError):
    """A `--set` that cannot be applied; the message is one line naming it and the fix."""


def parse_value(text: str) -> Any:
    """VALUE as TOML reads it, else the text itself (a bare word)."""
    try:
        parsed = tomllib.loads(f"v = {text}")
    except tomllib.TOMLDecodeError:
        return text
    return parsed["v"] if list(parsed) == ["v"] else text  # "1\nx = 2" is not one value


def apply_overrides(cluster: ClusterSpec, job: JobSpec, texts: Sequence[str]) -> JobSpec:
    """`job` with each `--set KEY=VALUE` of `texts` applied, validated as cluster.toml's [jobs.NAME] is.

    Raises:
        OverrideError: a malformed, unknown, fixed, repeated or invalid setting.
    """
    table: dict[str, Any] = {}
    env = dict(job.env)
    given: dict[str, str] = {}  # key -> the --set that set it, for messages
    for text in texts:
        key, value = _split(text)
        if key in given:
            raise OverrideError(f"--set {_short(text)}: {key} is set twice (also by --set {_short(given[key])}); "
                                "give each key once")
        given[key] = text
        if key.startswith("env."):
            env[key.removeprefix("env.")] = value
        else:
            table[key] = parse_value(value)
    if any(key.startswith("env.") for key in given):
        table["env"] = env  # the job's own variables with these on top, checked together
    what = {"script": job.script} if job.script else {}  # the checks that depend on what the job runs see it
    try:
        checked = parse_job_table(job.name, {**what, **table}, tuple(node.name for node in cluster.nodes), "--set")
    except ConfigError as exc:
        key = exc.key.rsplit("].", 1)[-1]
        culprit = given.get(key) or given.get(f"env.{key.removeprefix('env.')}") or key
        raise OverrideError(f"--set {_short(culprit)}: {exc.problem}; {exc.hint}") from None
    return replace(job, **{key: getattr(checked, key) for key in table})


def _split(text: str) -> tuple[str, str]:
    """("epochs", "5") for "epochs=5", with the key checked. Raises OverrideError."""
    key, sep, value = text.partition("=")
    key = key.strip()
    if not sep or not key:
        raise OverrideError(f"--set {_short(text)}: expected KEY=VALUE; write it like --set epochs=5")
    if key == "env" or key.startswith("env."):
        name = key.removeprefix("env").removeprefix(".")
        if not name:
            raise OverrideError(f"--set {_short(text)}: set one variable at a time; write it like "
                                "--set env.WANDB_MODE=offline")
        return key, _text_value(value)
    if key in PER_RUN_KEYS:
        return key, value.strip()
    if key in _WHERE or key in _WHAT:
        what = "where the job runs" if key in _WHERE else "what code the job runs"
        raise OverrideError(f"--set {_short(text)}: {key} decides {what} and cannot change for one run; "
                            "edit the job in cluster.toml, or add a second [jobs.NAME] with it")
    if key in {field.name for field in fields(JobSpec)}:
        raise OverrideError(f"--set {_short(text)}: {key} cannot be set; keys a run may set: {', '.join(PER_RUN_KEYS)}")
    close = difflib.get_close_matches(key, PER_RUN_KEYS, n=1, cutoff=0.6)
    hint = f"did you mean {close[0]}? " if close else ""
    raise OverrideError(f"--set {_short(text)}: unknown key {_short(key)!r}; {hint}keys a run may set: "
                        f"{', '.join(PER_RUN_KEYS)}")


def _text_value(value: str) -> str:
    """An environment variable's value: a TOML string's content, else the text as written."""
    parsed = parse_value(value.strip())
    return parsed if isinstance(parsed, str) else value.strip()


def _short(text: str) -> str:
    return text if len(text) <= _SHOWN else text[:_SHOWN] + "…"

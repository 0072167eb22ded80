"""The [alerts] command: its arguments and environment for one alert, and one run of it.

The command is an argument list run without a shell (asyncio's exec), so nothing an alert says
(a node name, a log line in a message) can become shell syntax; `{placeholders}` are filled in
argument by argument. It runs in its own session so a timeout kills whatever it started (curl under
a wrapper script, say).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import string
from datetime import datetime

from homegpu.remote.events import Alert, AlertState

STDERR_KEPT = 2_000  # bytes of the command's stderr kept to say why it failed

TITLES = {
    "gpu_temperature": "GPU too hot", "gpu_memory": "GPU memory nearly full", "node_offline": "node offline",
    "job_failed": "job failed", "job_stalled": "job stalled", "straggler": "straggler",
    "job_succeeded": "job succeeded", "run_shrunk": "a run went on with fewer machines",
    "queued_run_started": "queued run started",
    "queued_run_succeeded": "queued run succeeded", "queued_run_failed": "queued run failed",
    "queued_run_cancelled": "queued run cancelled", "budget_per_day": "the day's electricity budget crossed",
    "budget_per_run": "a run's electricity budget crossed",
}


def alert_values(alert: Alert, cluster: str) -> dict[str, str]:
    """Every placeholder's text for `alert` (config/alert_rules.PLACEHOLDERS names them)."""
    cleared = alert.state is AlertState.CLEARED
    title = f"homegpu {cluster}: {TITLES.get(alert.kind, alert.kind)}" + (" (cleared)" if cleared else "")
    return {
        "title": title, "message": alert.message, "alert": alert.kind, "state": alert.state.value,
        "node": alert.node, "gpu": "" if alert.gpu is None else str(alert.gpu), "worker": alert.worker,
        "job": alert.job, "run_id": alert.run_id, "queue_id": alert.queue_id, "value": _number(alert.value),
        "threshold": _number(alert.threshold), "cluster": cluster,
        "time": datetime.fromtimestamp(alert.at).astimezone().isoformat(timespec="seconds"),
    }


def alert_env(values: dict[str, str], base: dict[str, str] | None = None) -> dict[str, str]:
    """The command's environment: the controller's own (DISPLAY and DBUS for notify-send, PATH, proxies)
    with the alert in HOMEGPU_ALERT (its kind) and HOMEGPU_ALERT_* / HOMEGPU_JOB / HOMEGPU_RUN_ID / HOMEGPU_QUEUE_ID /
    HOMEGPU_CLUSTER."""
    env = dict(os.environ if base is None else base)
    env["HOMEGPU_ALERT"] = values["alert"]
    for name in ("state", "title", "message", "node", "gpu", "worker", "value", "threshold", "time"):
        env[f"HOMEGPU_ALERT_{name.upper()}"] = values[name]
    env.update(HOMEGPU_JOB=values["job"], HOMEGPU_RUN_ID=values["run_id"], HOMEGPU_QUEUE_ID=values["queue_id"],
               HOMEGPU_CLUSTER=values["cluster"])
    return env


def fill(template: str, values: dict[str, str]) -> str:
    """`template` with each `{name}` replaced by values[name] and `{{`/`}}` by one brace.

    Only plain names are looked up (the config refused anything else), never attributes or items.
    """
    parts = []
    for literal, name, _, _ in string.Formatter().parse(template):
        parts.append(literal)
        if name is not None:
            parts.append(values.get(name, ""))
    return "".join(parts)


def alert_argv(command: tuple[str, ...], values: dict[str, str]) -> list[str]:
    return [command[0], *(fill(argument, values) for argument in command[1:])]


async def run_command(argv: list[str], env: dict[str, str], timeout: float) -> str | None:
    """Run the command to its end, at most `timeout` seconds; None when it exits 0, else why not.

    Its output is not shown (stdout is discarded, the end of stderr kept for the reason). Cancelling
    kills it.
    """
    try:
        process = await asyncio.create_subprocess_exec(
            *argv, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE, env=env, start_new_session=True)
    except (OSError, ValueError) as exc:  # not found, not executable; a NUL byte in an argument
        return f"cannot run {argv[0]}: {getattr(exc, 'strerror', None) or exc}"
    try:
        stderr, status = await asyncio.wait_for(_finish(process), timeout)
    except asyncio.TimeoutError:
        await _kill(process)
        return f"{argv[0]} did not finish within {timeout:g} s and was killed"
    except BaseException:
        await _kill(process)
        raise
    if status == 0:
        return None
    last = stderr.decode("utf-8", "replace").strip().splitlines()
    how = f"was killed by signal {-status}" if status < 0 else f"exited with status {status}"
    return f"{argv[0]} {how}" + (f": {last[-1][:200]}" if last else "")


async def _finish(process: asyncio.subprocess.Process) -> tuple[bytes, int]:
    """Read stderr to its end, keeping only its last STDERR_KEPT bytes, then wait for the exit."""
    kept = b""
    while chunk := await process.stderr.read(65536):
        kept = (kept + chunk)[-STDERR_KEPT:]
    return kept, await process.wait()


async def _kill(process: asyncio.subprocess.Process) -> None:
    """Kill the command's whole session, and reap it."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError):
        process.kill()
    await process.wait()


def _number(value: float | None) -> str:
    if value is None:
        return ""
    return f"{value:.0f}" if abs(value) >= 10 else f"{value:.3g}"

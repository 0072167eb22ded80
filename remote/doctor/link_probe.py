"""The doctor's load probe: the node's GPUs under a short load of its own, read while it runs.

node_side/scripts/gpu_load.py copies host→GPU on every GPU and says when its copies run; the stats agent
then reads the GPUs (their links trained up by the copies), and closing the load's stdin ends it,
when it says what each GPU's copies got through. The pure judgement is remote/doctor/link.py's.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import AsyncIterator, Awaitable, Callable

from homegpu.remote.doctor.link import LoadFacts
from homegpu.remote.net import json_object
from homegpu.remote.node_side import script
from homegpu.remote.nodes import CommandResult, NodeSession, RemoteProcess, cause

LOAD_SCRIPT = script("gpu_load")
# The load starts its copies within its own START_TIMEOUT_S (20 s), ends them within its STOP_TIMEOUT_S
# (10 s) of its stdin closing, and holds for at most MAX_LOAD_S (60 s): longer than the reading under it
# may take (probe.AGENT_TIMEOUT_S), so the reading is always taken while the copies run.
LOAD_START_TIMEOUT_S = 30.0
LOAD_END_TIMEOUT_S = 20.0
LINK_SETTLE_S = 0.5  # between the copies starting and the reading: the link has trained up by then


async def probe_under_load(session: NodeSession, python: str,
                           read: Callable[[], Awaitable[CommandResult]]) -> LoadFacts:
    """Start the load with `python`, call `read` (the stats agent's one reading) once its copies run,
    then end the load and keep what it said. Never raises: what went wrong is the facts' failure."""
    try:
        process = await session.spawn([python, "-c", LOAD_SCRIPT])
    except Exception as exc:  # noqa: BLE001 - NodeOffline, asyncssh errors: the link is gone
        return LoadFacts(failure=f"cannot start {python}: {cause(exc)}")
    said: list[dict] = []
    reading, lines = None, process.lines()
    waiting = f"its copies did not start within {LOAD_START_TIMEOUT_S:g} s"
    try:
        if await asyncio.wait_for(_said_until_loading(lines, said), LOAD_START_TIMEOUT_S):
            await asyncio.sleep(LINK_SETTLE_S)
            reading = await read()
        process.close_stdin()
        waiting = f"it did not end within {LOAD_END_TIMEOUT_S:g} s of being told to"
        await asyncio.wait_for(_said_until_end(lines, said), LOAD_END_TIMEOUT_S)
        failure = "" if said else await _why_silent(process)
    except asyncio.TimeoutError:
        failure = waiting
    except Exception as exc:  # noqa: BLE001 - the link went away mid-probe
        failure = cause(exc)
    finally:
        process.terminate()
    return LoadFacts(tuple(said), reading, failure)


async def _said_until_loading(lines: AsyncIterator[str], said: list[dict]) -> bool:
    """Collect the load's lines into `said` until it says its copies run (True) or it ends (False)."""
    async for line in lines:
        record = json_object(line) or {}  # not JSON: a login shell's banner, say
        if "loading" in record:
            return bool(record["loading"])
        if record:
            said.append(record)
    return False


async def _said_until_end(lines: AsyncIterator[str], said: list[dict]) -> None:
    async for line in lines:
        if record := json_object(line):
            said.append(record)


async def _why_silent(process: RemoteProcess) -> str:
    """Why the load ended without a line: its stderr's last line, else its exit status."""
    status = None
    with contextlib.suppress(asyncio.TimeoutError):
        status = await asyncio.wait_for(process.wait(), 5)
    stderr = (await process.stderr_text()).strip().splitlines()
    if stderr:
        return stderr[-1]
    return "it ended without a word" + ("" if status is None else f" (exit status {status})")

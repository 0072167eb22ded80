"""A login timed on a command that only writes the marker (transport.framed(["true"])), within a bound.

A stuck login (a stale lock it waits for) must not hold doctor or preflight past `timeout`: what the shell
said on stderr so far comes back with `seconds` None, and the channel is closed.
"""

from __future__ import annotations

import asyncio
import time

from homegpu.remote.nodes.login_time import LoginTiming
from homegpu.remote.nodes.transport_base import CHUNK_SIZE


async def time_login(process, mark: bytes, timeout: float) -> LoginTiming:
    """Time `process`'s login (an asyncssh process just started): from now until `mark` on its stdout,
    with its stderr up to its own `mark`; at most `timeout` seconds, then it is closed either way."""
    started = time.monotonic()
    stdout, stderr = bytearray(), bytearray()
    marked: list[float] = []

    async def read_out() -> None:
        while chunk := await process.stdout.read(CHUNK_SIZE):
            stdout.extend(chunk)
            if not marked and mark in stdout:
                marked.append(time.monotonic() - started)

    async def read_err() -> None:
        while chunk := await process.stderr.read(CHUNK_SIZE):
            stderr.extend(chunk)

    readers = [asyncio.ensure_future(read_out()), asyncio.ensure_future(read_err())]
    try:
        async with asyncio.timeout(timeout):
            await asyncio.gather(*readers)
    except Exception:  # noqa: BLE001 - the bound passed, or the link went: what was read so far is the answer
        pass
    finally:
        for reader in readers:
            reader.cancel()
        await asyncio.gather(*readers, return_exceptions=True)
        process.close()
    said = bytes(stderr).partition(mark)[0].decode("utf-8", "replace")
    return LoginTiming(marked[0] if marked else None, said, round(time.monotonic() - started, 1))

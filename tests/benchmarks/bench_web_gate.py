"""The web view's token gate (tui/web/token_gate.py, throttle.py): how long 1,000 guesses of its token take
from one client, against 1,000 requests with the right token. Prints figures and a ratio; asserts nothing.

Run (no root, no simulated LAN):  .venv/bin/python tests/benchmarks/bench_web_gate.py [SECONDS]

A real view (start_web, as `homegpu serve --web` runs it) on 127.0.0.1, asked one request at a time over
one connection: `/?token=RIGHT` (the gate's redirect, no page rendered) then `/?token=WRONG` (its 401).
Wrong guesses are measured for SECONDS (default 20); past the throttle's cap every guess waits the
cap, so the rest of the 1,000 is projected at the cap each.
"""

from __future__ import annotations

import asyncio
import os
import platform
import sys
import time

import aiohttp

from homegpu.tui.web.server import Listen, start_web
from homegpu.tui.web.throttle import MAX_DELAY

GUESSES = 1000
TOKEN = "bench-token-for-the-web-gate-0123456789"


async def timed(session: aiohttp.ClientSession, url: str, count: int, budget: float) -> tuple[int, float]:
    """(requests sent, seconds taken): `count` requests of `url` one after another, or fewer once `budget` is spent."""
    began, sent = time.perf_counter(), 0
    while sent < count and time.perf_counter() - began < budget:
        async with session.get(url, allow_redirects=False) as response:
            await response.read()
        sent += 1
    return sent, time.perf_counter() - began


async def main() -> None:
    budget = float(sys.argv[1]) if len(sys.argv) > 1 else 20.0
    print(f"web gate benchmark, {platform.node()}, {os.cpu_count()} cores, {time.strftime('%Y-%m-%d')}, "
          f"Python {platform.python_version()}\n")
    view = await start_web(["--local"], Listen("127.0.0.1", 0), token=TOKEN)
    base = view.url.split("/?")[0]
    try:
        async with aiohttp.ClientSession(cookie_jar=aiohttp.DummyCookieJar()) as session:
            _, right = await timed(session, f"{base}/?token={TOKEN}", GUESSES, float("inf"))
            sent, wrong = await timed(session, f"{base}/?token=wrong-{TOKEN}", GUESSES, budget)
    finally:
        await view.stop()
    projected = wrong + (GUESSES - sent) * MAX_DELAY
    print(f"{GUESSES} requests with the right token: {right:.3f} s ({right / GUESSES * 1000:.2f} ms each)")
    print(f"{sent} wrong guesses measured: {wrong:.2f} s; {GUESSES} projected at {MAX_DELAY:g} s each past them: "
          f"{projected:.0f} s ({projected / 60:.0f} min)")
    print(f"ratio, {GUESSES} wrong / {GUESSES} right: {projected / right:,.0f}")


if __name__ == "__main__":
    asyncio.run(main())

"""serve's wiring (tui/daemon.py): a service that fails to start closes every one started before it.

serve runs here in this process on the embedded default (this machine, through local processes), with
its history and queue in the session's private XDG_DATA_HOME (conftest). "Closed" is read from the
process itself: no descriptor left open on the history or queue file, no task of serve's left running.
"""

from __future__ import annotations

import asyncio
import os
import socket
from pathlib import Path

import pytest

from homegpu.remote.alerts import AlertWatcher
from homegpu.remote.config import embedded_default
from homegpu.remote.history import history_path
from homegpu.remote.queue import queue_path, socket_path
from homegpu.tui.daemon import ServeOptions, serve
from homegpu.tui.errors import UserError


def open_files() -> set[Path]:
    """The files this process holds open now."""
    found = set()
    for fd in Path("/proc/self/fd").iterdir():
        try:
            found.add(Path(os.readlink(fd)))
        except OSError:
            continue  # closed while listed (the listing's own descriptor)
    return found


def held(spec) -> list[Path]:
    """serve's stores (and their -wal/-shm) still open in this process."""
    stores = {history_path(spec), queue_path(spec)}
    return sorted(path for path in open_files() if any(str(path).startswith(str(store)) for store in stores))


async def others_running(before: set[asyncio.Task]) -> list[str]:
    """Tasks started since `before` that are still running, after a moment to finish their cancellation."""
    for _ in range(3):
        await asyncio.sleep(0)
    return sorted(task.get_name() for task in asyncio.all_tasks() - before - {asyncio.current_task()}
                  if not task.done())


def options(tmp_path: Path, port: int = 0) -> ServeOptions:
    return ServeOptions("127.0.0.1", port, tmp_path / "experiments")


async def test_an_alert_watcher_that_fails_to_start_closes_the_history_and_the_queue(tmp_path, monkeypatch):
    def broken_start(self):
        raise RuntimeError("the alert watcher failed to start")

    monkeypatch.setattr(AlertWatcher, "start", broken_start)
    spec = embedded_default()
    before = asyncio.all_tasks()
    with pytest.raises(RuntimeError, match="alert watcher failed"):
        await serve(spec, options(tmp_path))
    assert history_path(spec).is_file() and queue_path(spec).is_file()  # they were opened: this is no no-op
    assert held(spec) == []
    assert await others_running(before) == []


async def test_a_metrics_port_in_use_closes_what_started_before_it(tmp_path):
    """The metrics endpoint starts after the nodes' sessions, the history's recorder, the queue's runner and
    the follower: each is closed, and the queue's socket was never opened."""
    spec = embedded_default()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        before = asyncio.all_tasks()
        with pytest.raises(UserError, match="cannot serve metrics on 127.0.0.1"):
            await serve(spec, options(tmp_path, taken.getsockname()[1]))
    assert held(spec) == []
    assert await others_running(before) == []
    assert not socket_path(spec).exists()

"""serve's wiring (tui/daemon.py): a service that fails to start closes every one started before it.

serve runs here in this process on a cluster file of its own whose one node is this machine (through local
processes: no LAN), with its history and queue in the session's private XDG_DATA_HOME (conftest), and its
queue's socket folder named after that file (never the one of a `homegpu --local serve` of yours). "Closed" is read from the
process itself: no descriptor left open on the history or queue file, no task of serve's left running.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import os
import socket
import sqlite3
from pathlib import Path

import pytest

from helpers import local_cluster_toml, wait_until
from homegpu.remote.alerts import AlertWatcher
from homegpu.remote.config import load_cluster
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


def local_cluster(tmp_path: Path):
    """A cluster file of the test's own: this machine as its one node."""
    return load_cluster(local_cluster_toml(tmp_path))


def options(tmp_path: Path, port: int = 0) -> ServeOptions:
    return ServeOptions("127.0.0.1", port, tmp_path / "experiments")


async def test_an_alert_watcher_that_fails_to_start_closes_the_history_and_the_queue(tmp_path, monkeypatch):
    def broken_start(self):
        raise RuntimeError("the alert watcher failed to start")

    monkeypatch.setattr(AlertWatcher, "start", broken_start)
    spec = local_cluster(tmp_path)
    before = asyncio.all_tasks()
    with pytest.raises(RuntimeError, match="alert watcher failed"):
        await serve(spec, options(tmp_path))
    assert history_path(spec).is_file() and queue_path(spec).is_file()  # they were opened: this is no no-op
    assert held(spec) == []
    assert await others_running(before) == []


async def test_a_metrics_port_in_use_closes_what_started_before_it(tmp_path):
    """The metrics endpoint starts after the history and the queue's store, before any node is reached:
    they are closed, and neither a node's session nor the queue's socket was opened."""
    spec = local_cluster(tmp_path)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        before = asyncio.all_tasks()
        with pytest.raises(UserError, match="cannot serve metrics on 127.0.0.1"):
            await serve(spec, options(tmp_path, taken.getsockname()[1]))
    assert held(spec) == []
    assert await others_running(before) == []
    assert not socket_path(spec).exists()


def history_rows(spec) -> dict[str, list[tuple]]:
    with contextlib.closing(sqlite3.connect(f"file:{history_path(spec)}?mode=ro", uri=True)) as db:
        return {table: db.execute(f"SELECT * FROM {table} ORDER BY rowid").fetchall()
                for table in ("sessions", "node_down", "nodes")}


async def test_a_second_serve_is_refused_having_touched_nothing_of_the_first(tmp_path):
    """The second is refused before it opens the history, the queue or a session to a node: the first's
    history is as it was, row for row, and no second stats agent started."""
    spec = local_cluster(tmp_path)
    out = io.StringIO()
    first = asyncio.create_task(serve(spec, options(tmp_path), out=out))
    try:
        await wait_until(lambda: "\nqueue: " in out.getvalue() or first.done(), 60, "the first serve to listen")
        assert not first.done(), out.getvalue()
        before, agents = history_rows(spec), stats_agents()
        with pytest.raises(UserError, match="another homegpu serve already runs this cluster"):
            await serve(spec, options(tmp_path / "second"))
        assert history_rows(spec) == before
        assert stats_agents() == agents
    finally:
        first.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await first
    assert held(spec) == []


def stats_agents() -> set[int]:
    """This machine's stats agents (the local node's, started by a serve of the embedded default)."""
    found = set()
    for status in Path("/proc").glob("[0-9]*/cmdline"):
        with contextlib.suppress(OSError):
            if b"stats_agent.py" in status.read_bytes():
                found.add(int(status.parent.name))
    return found

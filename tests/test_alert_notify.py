"""[alerts] notify through the real Apprise library to a real receiver: a small HTTP server here that takes
Apprise's JSON posts (`json://` URLs), as a phone's ntfy server or a chat's webhook would. Alerts come from the
real AlertWatcher on a real EventHub; a dead endpoint is a port nothing listens on, or a server that never answers.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Iterator

import pytest
from helpers import homegpu

from homegpu.remote.alerts import AlertWatcher, notify
from homegpu.remote.alerts import watcher as watcher_module
from homegpu.remote.config.cluster_spec import parse_cluster
from homegpu.remote.events import AlertNotifyFailed, EventHub, JobState, JobStateChanged
from homegpu.tui.view.text import format_alerts

TOKEN = "tok3n-s3cret-9f8e7d"  # in every URL: it must never be shown


class Receiver:
    """An HTTP server on 127.0.0.1 keeping each JSON body posted to it; `stall` makes it never answer."""

    def __init__(self, stall: bool = False) -> None:
        received, release = self.received, self.release = [], threading.Event()
        self.held = 0  # requests a stalling server holds unanswered
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if stall:
                    receiver.held += 1
                    release.wait(60)
                    return
                received.append({"path": self.path, **json.loads(body)})
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def url(self, path: str = "hook") -> str:
        return f"json://127.0.0.1:{self.port}/{path}?token={TOKEN}"

    def close(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    server = Receiver()
    yield server
    server.close()


def dead_url() -> str:
    """A URL whose port nothing listens on (refused at once)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    return f"json://127.0.0.1:{port}/hook?token={TOKEN}"


def cluster(notify: str, extra: str = "") -> str:
    return f'[cluster]\nname = "home"\n[[nodes]]\nname = "desktop"\nhost = "desktop"\n[alerts]\njob_failed = true\n' \
           f"job_succeeded = true\njob_stalled = true\nnotify = {notify}\n{extra}"


def run_state(state: JobState, detail: str) -> JobStateChanged:
    return JobStateChanged(job="train", run_id="train-1", state=state, generation=1, restarts=0, detail=detail)


async def watch(spec_text: str, events: list, wait_for, timeout: float = 20.0, linger: float = 0.0,
                say=None) -> list:
    """Publish `events` on a hub an AlertWatcher of `spec_text` watches, until `wait_for()` holds and `linger`
    seconds more; what the hub said of failed notifications."""
    hub = EventHub()
    seen = hub.subscribe()
    watcher = AlertWatcher(parse_cluster(spec_text), hub, say=say).start()
    try:
        for event in events:
            hub.publish(event)
        deadline = time.monotonic() + timeout
        while not wait_for() and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        await asyncio.sleep(linger)
    finally:
        await watcher.close()
    return [event for event in seen.drain(10_000) if isinstance(event, AlertNotifyFailed)]


async def test_a_failing_runs_alerts_and_a_clear_each_arrive_once(receiver):
    """A run stalls (job_stalled fires), then fails (job_failed fires, and the stall clears as the run ends)."""
    events = [run_state(JobState.RUNNING, ""), run_state(JobState.RESTARTING, "stalled: no output for 120 s"),
              run_state(JobState.FAILED, "node2 exited with status 1")]
    await watch(cluster(f'["{receiver.url()}"]'), events, lambda: len(receiver.received) >= 3)
    await asyncio.sleep(0.5)  # nothing more comes
    titles = sorted((post["title"], post["type"]) for post in receiver.received)
    assert titles == [("homegpu home: job failed", "failure"), ("homegpu home: job stalled", "warning"),
                      ("homegpu home: job stalled (cleared)", "success")], titles
    failed = next(post for post in receiver.received if post["title"] == "homegpu home: job failed")
    assert "node2 exited with status 1" in failed["message"] and failed["path"].startswith("/hook")


async def test_a_dead_endpoint_delays_nothing_else_and_is_said_once(receiver, monkeypatch):
    """Three alerts to a URL that refuses and to one that never answers, beside a live one: the live one has all
    three while the silent one still holds the first; the refusing one is said once, by place and service, with no
    part of its URL."""
    monkeypatch.setattr(notify, "RETRY_DELAYS", (0.2, 0.2))
    monkeypatch.setattr(watcher_module, "NOTIFY_CLOSE_SECONDS", 1.0)  # the silent URL is given up at exit
    silent = Receiver(stall=True)
    held_when_live_had_all: list[int] = []

    def live_has_all() -> bool:
        if len(receiver.received) < 3:
            return False
        held_when_live_had_all.append(silent.held)
        return True

    try:
        urls = f'["{dead_url()}", "{silent.url()}", "{receiver.url()}"]'
        events = [run_state(JobState.RUNNING, ""), run_state(JobState.RESTARTING, "stalled: no output"),
                  run_state(JobState.FAILED, "node2 exited")]
        logged: list[str] = []  # what serve's log gets
        said = await watch(cluster(urls), events, live_has_all, linger=1.5, say=logged.append)
    finally:
        silent.close()
    assert len(receiver.received) == 3 and held_when_live_had_all[:1] == [1], held_when_live_had_all
    assert [event.command for event in said] == ["notify 1 (json://…)"], said
    assert logged == ["notification failed: the service did not accept it (unreachable, refused, or a wrong token) "
                      "(notify 1 (json://…); said once until one arrives again)"], logged
    shown = " ".join(f"{event.heading} {event.reason} {event.detail}" for event in said)
    assert TOKEN not in shown and "127.0.0.1" not in shown, shown


async def test_routing_sends_a_url_only_the_alerts_it_names(receiver):
    phone, log = receiver.url("phone"), receiver.url("all")
    notify_list = f'[{{ url = "{phone}", alerts = ["job_failed"] }}, "{log}"]'
    events = [run_state(JobState.SUCCEEDED, "done")]
    await watch(cluster(notify_list), events, lambda: len(receiver.received) >= 1)
    await asyncio.sleep(0.5)
    assert [post["path"].split("?")[0] for post in receiver.received] == ["/all"], receiver.received


def test_check_names_each_url_by_its_place_and_service_only(receiver, tmp_path):
    spec = parse_cluster(cluster(f'["{receiver.url()}", {{ url = "{dead_url()}", alerts = ["job_failed"] }}]'))
    lines = format_alerts(spec.alerts)
    assert "  notify 1 (json://…): every alert and clear" in lines
    assert "  notify 2 (json://…): only job_failed" in lines
    assert TOKEN not in "\n".join(lines)
    config = tmp_path / "cluster.toml"
    config.write_text(cluster(f'["{receiver.url()}"]'))
    checked = homegpu("--config", str(config), "check")
    assert checked.returncode == 0 and "notify 1 (json://…)" in checked.stdout, checked.stdout + checked.stderr
    assert TOKEN not in checked.stdout + checked.stderr


def test_a_bad_notify_entry_is_one_line_that_never_shows_the_url(tmp_path):
    config = tmp_path / "cluster.toml"
    config.write_text(cluster(f'[{{ url = "tgram://{TOKEN}/123", alerts = ["job_faild"] }}]'))
    checked = homegpu("--config", str(config), "check")
    assert checked.returncode != 0
    (line,) = checked.stderr.strip().splitlines()
    assert line.startswith(f"homegpu: error: {config}:10: [alerts].notify: entry 1 (tgram://…): unknown alert "
                           "'job_faild'"), line
    assert TOKEN not in checked.stdout + checked.stderr


def test_alerts_test_says_which_url_arrived(receiver, tmp_path):
    config = tmp_path / "cluster.toml"
    config.write_text(cluster(f'["{receiver.url()}", "{dead_url()}"]'))
    result = homegpu("--config", str(config), "alerts", "test", timeout=60)
    assert result.returncode == 1, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "notify 1 (json://…): arrived"
    assert lines[1].startswith("notify 2 (json://…): failed: the service did not accept it"), lines
    assert lines[2] == "1 of 2 arrived"
    assert [post["title"] for post in receiver.received] == ["homegpu home: test"]
    assert TOKEN not in result.stdout + result.stderr

"""[alerts] notify: each alert and its clear sent to Apprise URLs (ntfy, Telegram, Discord, Slack, mail, ...).

Every URL has a queue and a task of its own, so a dead endpoint delays nothing else: not the other URLs, not the
command, not the controller. Apprise's `notify()` blocks on the network, so it runs in a thread, within its own
connect and read timeouts. A failed send is tried again after RETRY_DELAYS, then given up; a URL that fails is
said once (AlertNotifyFailed), and again only after something reached it in between. Nothing shown ever holds a
URL's text, which may carry a token: a target is named by its place in the list and its service
(NotifyTarget.shown). Apprise is imported when the first alert is sent.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Callable

from homegpu.remote.alerts.command import alert_values
from homegpu.remote.config import NotifyTarget
from homegpu.remote.events import Alert, AlertNotifyFailed, AlertState

RETRY_DELAYS = (5.0, 30.0)  # seconds before the second and the third try of one alert
MAX_QUEUED = 200  # alerts waiting per URL; past it the oldest are not sent (still shown)
SEND_TIMEOUT = 30.0  # one try, whatever Apprise's own timeouts say
# Apprise's type per alert kind, for services that colour or prioritise by it; a clear is a success
_FAILURES = frozenset({"job_failed", "queued_run_failed", "node_offline"})
_SUCCESSES = frozenset({"job_succeeded", "queued_run_succeeded"})


def apprise_type(alert: Alert) -> str:
    if alert.state is AlertState.CLEARED or alert.kind in _SUCCESSES:
        return "success"
    if alert.kind in _FAILURES:
        return "failure"
    return "info" if alert.kind == "queued_run_started" else "warning"


def put_bounded(queue: asyncio.Queue, item: object, limit: int) -> None:
    """Queue `item`; past `limit` waiting, the oldest is dropped (and counted done, so that join() still ends)."""
    if queue.qsize() >= limit:
        queue.get_nowait()
        queue.task_done()
    queue.put_nowait(item)


def send_once(url: str, title: str, body: str, notify_type: str) -> str | None:
    """One try to deliver to `url` (blocking: run it in a thread); None when Apprise says it arrived, else why not,
    in words that hold no part of the URL."""
    import apprise

    _quiet(logging.getLogger("apprise"))
    sender = apprise.Apprise()
    if not sender.add(url):
        return "Apprise does not know this URL's service, or the URL is malformed (see its wiki's list of services)"
    try:
        delivered = sender.notify(title=title, body=body, notify_type=notify_type)
    except Exception as exc:  # noqa: BLE001 - a plugin's error must never reach the controller
        return f"Apprise failed ({type(exc).__name__})"
    return None if delivered else "the service did not accept it (unreachable, refused, or a wrong token)"


def _quiet(logger: logging.Logger) -> None:
    """Apprise logs its failures, some with a URL's host or path: they stay out of every log homegpu keeps (and
    Python's last-resort stderr); the reason a send failed is said in homegpu's own words."""
    if not logger.handlers:
        logger.addHandler(logging.NullHandler())
    logger.propagate = False


class Notifier:
    """Sends alerts to `targets`, each in its own task; `said(event)` publishes a target's failure (once)."""

    def __init__(self, targets: tuple[NotifyTarget, ...], cluster: str, said: Callable[[AlertNotifyFailed], None],
                 sender: Callable[[str, str, str, str], str | None] = send_once) -> None:
        self.targets, self.cluster, self._said, self._send = targets, cluster, said, sender
        self._queues = [asyncio.Queue() for _ in targets]
        self._failing = [False] * len(targets)
        self._tasks: list[asyncio.Task] = []

    def start(self) -> "Notifier":
        self._tasks = [asyncio.create_task(self._deliver(index), name=f"notify {index + 1}")
                       for index in range(len(self.targets))]
        return self

    def send(self, alert: Alert) -> None:
        """Queue `alert` for every target that wants its kind."""
        for target, queue in zip(self.targets, self._queues):
            if target.wants(alert.kind):
                put_bounded(queue, alert, MAX_QUEUED)

    async def _deliver(self, index: int) -> None:
        queue = self._queues[index]
        while True:
            alert = await queue.get()
            try:
                await self.deliver(index, alert)
            finally:
                queue.task_done()

    async def deliver(self, index: int, alert: Alert) -> str | None:
        """Send `alert` to target `index`, trying again after each of RETRY_DELAYS; None once it arrived, else
        why the last try failed (said once while the target keeps failing)."""
        values = alert_values(alert, self.cluster)
        problem = None
        for delay in (0.0, *RETRY_DELAYS):
            await asyncio.sleep(delay)
            problem = await self.try_once(index, values["title"], values["message"], apprise_type(alert))
            if problem is None:
                self._failing[index] = False
                return None
        if not self._failing[index]:
            self._failing[index] = True
            self._said(AlertNotifyFailed(self.targets[index].shown(index + 1), problem))
        return problem

    async def try_once(self, index: int, title: str, body: str, notify_type: str) -> str | None:
        try:
            return await asyncio.wait_for(
                asyncio.to_thread(self._send, self.targets[index].url, title, body, notify_type), SEND_TIMEOUT)
        except asyncio.TimeoutError:
            return f"no answer within {SEND_TIMEOUT:g} s"

    async def drain(self, timeout: float) -> None:
        """Wait up to `timeout` seconds for what is queued to be sent (or given up)."""
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(asyncio.gather(*(queue.join() for queue in self._queues)), timeout)

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()

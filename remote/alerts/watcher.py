"""AlertWatcher: [alerts] applied to a cluster's live events, and the command run and the notify URLs sent to for
each alert.

The evaluator (evaluate.py) sees each event as it is published (EventHub.derive); its alerts follow
their cause on the hub, for every front end and the timeline, and a timer ticks the offline clock.
Commands run one at a time, in order, in a task of their own, each with a timeout; a failing command
is said once (AlertCommandFailed), and again only after it has worked in between. Notifications go out beside
them, each URL in a task of its own (notify.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import shlex
import time
from typing import Callable

from homegpu.remote.alerts.command import alert_argv, alert_env, alert_values, run_command
from homegpu.remote.alerts.evaluate import AlertEvaluator
from homegpu.remote.alerts.notify import Notifier, put_bounded
from homegpu.remote.config import ClusterSpec
from homegpu.remote.events import Alert, AlertCommandFailed, EventHub

TICK_SECONDS = 1.0
MAX_QUEUED = 1_000  # alerts waiting for the command; past it the oldest are not sent (still shown)
CLOSE_GRACE_SECONDS = 5.0  # on top of the command's timeout, for the last alerts' commands at exit
NOTIFY_CLOSE_SECONDS = 15.0  # for the last alerts' notifications at exit (a URL still failing is given up)


class AlertWatcher:
    """Watches `hub` for `spec.alerts` from start() (before the nodes: their first events count) until close().

    Args:
        clock: the time the offline clock ticks with (the hub's events carry time.time()).
        say: also told, in a line, when the command or a notify URL fails (serve's log).
    """

    def __init__(self, spec: ClusterSpec, hub: EventHub, clock: Callable[[], float] = time.time,
                 say: Callable[[str], None] | None = None) -> None:
        self.spec, self.hub, self.clock, self.say = spec, hub, clock, say
        self.rules, self.evaluator = spec.alerts, AlertEvaluator(spec.alerts, spec.tariff)
        self._queue: asyncio.Queue[Alert] = asyncio.Queue()
        self._tasks: list[asyncio.Task] = []
        self._failing = False  # the command's last run failed (and that was said)
        self.notifier = Notifier(spec.alerts.notify, spec.name, self._failed) if spec.alerts.notify else None

    def start(self) -> "AlertWatcher":
        if not self.rules.enabled:
            return self  # no rule is on: nothing to watch
        self.hub.derive(self._derive)
        self._tasks.append(asyncio.create_task(self._tick(), name="alert clock"))
        if self.rules.command:
            self._tasks.append(asyncio.create_task(self._deliver(), name="alert command"))
        if self.notifier:
            self.notifier.start()
        return self

    def _derive(self, event: object) -> list[Alert]:
        alerts = self.evaluator.take(event)
        self._send(alerts)
        return alerts

    def _send(self, alerts: list[Alert]) -> None:
        if self.notifier:
            for alert in alerts:
                self.notifier.send(alert)
        if not self.rules.command:
            return
        for alert in alerts:
            put_bounded(self._queue, alert, MAX_QUEUED)

    async def _tick(self) -> None:
        while True:
            await asyncio.sleep(TICK_SECONDS)
            alerts = self.evaluator.tick(self.clock())
            self._send(alerts)
            for alert in alerts:
                self.hub.publish(alert)

    async def _deliver(self) -> None:
        while True:
            alert = await self._queue.get()
            try:
                await self.run(alert)
            except Exception as exc:  # noqa: BLE001 - an alert must never take the controller down
                self._said_failure(f"{type(exc).__name__}: {exc}")
            finally:
                self._queue.task_done()

    async def run(self, alert: Alert) -> str | None:
        """Run the command for one alert; returns why it failed, or None."""
        values = alert_values(alert, self.spec.name)
        problem = await run_command(alert_argv(self.rules.command, values), alert_env(values),
                                    self.rules.command_timeout)
        if problem is None:
            self._failing = False
        else:
            self._said_failure(problem)
        return problem

    def _said_failure(self, problem: str) -> None:
        if not self._failing:
            self._failing = True
            self._failed(AlertCommandFailed(shlex.join(self.rules.command), problem))

    def _failed(self, event: AlertCommandFailed) -> None:
        """A delivery failed (said once by whoever delivers): on the hub, and in `say`'s log."""
        self.hub.publish(event)
        if self.say:
            self.say(f"{event.heading}: {event.reason} ({event.detail})")

    async def close(self) -> None:
        """Stop watching; the commands of alerts already given still run (within their timeout).
        Closing again does nothing."""
        self.hub.underive(self._derive)
        if self.rules.command and self._tasks:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._queue.join(), self.rules.command_timeout + CLOSE_GRACE_SECONDS)
        if self.notifier and self._tasks:
            await self.notifier.drain(NOTIFY_CLOSE_SECONDS)
            await self.notifier.close()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()

"""homegpu.remote.alerts: [alerts] applied to the hub's events: which alerts fire and which clear (pure),
and the user's command run for each, without a shell, in the background, and the notify URLs sent to.
"""

from __future__ import annotations

from homegpu.remote.alerts.notify import send_once
from homegpu.remote.alerts.watcher import AlertWatcher

__all__ = [
    "AlertWatcher", "send_once",
]

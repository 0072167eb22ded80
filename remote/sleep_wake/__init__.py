"""homegpu.remote.sleep_wake: machines that sleep. A node with a `mac` is woken with Wake-on-LAN (waking.py)
when work needs it or `homegpu wake` asks, and put to sleep (sleeping.py) by `homegpu sleep` once idle;
nodes/asleep.py remembers which sleep, so every homegpu process tells them from offline ones.
"""

from __future__ import annotations

from homegpu.remote.sleep_wake.idle_sleep import IdleSleeper
from homegpu.remote.sleep_wake.sleeping import NotIdle, SleepFailed, idle_problems, put_to_sleep
from homegpu.remote.sleep_wake.waking import WakeFailed, is_progress_tick, wake, wake_asleep

__all__ = ["IdleSleeper", "NotIdle", "SleepFailed", "WakeFailed", "idle_problems", "is_progress_tick",
           "put_to_sleep", "wake", "wake_asleep"]

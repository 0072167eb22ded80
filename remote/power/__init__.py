"""homegpu.remote.power: machines that sleep. A node with a `mac` is woken with Wake-on-LAN (waking.py)
when work needs it or `homegpu wake` asks, and put to sleep (sleeping.py) by `homegpu sleep` once idle;
nodes/asleep.py remembers which sleep, so every homegpu process tells them from offline ones.
"""

from __future__ import annotations

from homegpu.remote.power.idle_sleep import IdleSleeper
from homegpu.remote.power.sleeping import NotIdle, SleepFailed, idle_problems, put_to_sleep
from homegpu.remote.power.waking import WakeFailed, wake, wake_asleep

__all__ = ["IdleSleeper", "NotIdle", "SleepFailed", "WakeFailed", "idle_problems", "put_to_sleep", "wake", "wake_asleep"]

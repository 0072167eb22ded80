"""A node's sleep-and-wake keys in `[[nodes]]`: how homegpu wakes it (Wake-on-LAN) and when it may put it to sleep.

    mac = "a8:a1:59:0c:22:7e"       # its wired NIC's MAC: the magic packet's address (needed for a wake)
    wake_via = "desktop"            # another node sends the packet on its own LAN (controller on Wi-Fi, VPN)
    sleep_after = "30m"             # serve puts it to sleep when idle this long (off without it)
    sleep_command = "systemctl suspend"  # run through `sudo -n` when the SSH user is not root
    wake_timeout = "2m"             # how long a boot may take before a wake is called failed

Validated here with checks.py's Validator, like the rest of cluster.toml; node_spec.py gathers them.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass

from homegpu.remote.config.checks import Limits, Validator, show
from homegpu.remote.config.durations import Duration

DEFAULT_SLEEP_COMMAND = "systemctl suspend"
DEFAULT_WAKE_TIMEOUT_S = 120.0
_MAC_RE = re.compile(r"[0-9A-Fa-f]{2}([:-])[0-9A-Fa-f]{2}(?:\1[0-9A-Fa-f]{2}){4}")
LIMITS: Limits = {
    "sleep_after": (10.0, 604_800.0, " seconds (a week)"),  # ten seconds to a week of idleness
    "wake_timeout": (5.0, 3600.0, " seconds (an hour)"),
}


@dataclass(frozen=True)
class NodeSleepWake:
    """How a node is woken and put to sleep; every key optional (None/"": homegpu never does it)."""

    mac: str = ""  # lower case, colons
    wake_via: str = ""  # a node's name
    sleep_after: float | None = None  # seconds idle
    sleep_command: str = DEFAULT_SLEEP_COMMAND
    wake_timeout: float = DEFAULT_WAKE_TIMEOUT_S

    @property
    def wakeable(self) -> bool:
        return bool(self.mac)

    def sleep_argv(self, as_root: bool) -> list[str]:
        """The sleep command as argv, through `sudo -n` (never a password prompt) unless the user is root."""
        argv = shlex.split(self.sleep_command)
        return argv if as_root else ["sudo", "-n", *argv]


def parse_sleep_wake(v: Validator, item: dict, path: tuple, name: str) -> NodeSleepWake:
    """The node's sleep-and-wake keys, validated (wake_via is checked against the other nodes by check_wake_via)."""
    get = v.getter(item, path, LIMITS)
    mac = get("mac", str, "", _check_mac(v))
    sleep_after = get("sleep_after", Duration, None)
    if sleep_after is not None and not mac:
        raise v.fail(path + ("sleep_after",), f"node {name!r} would sleep but could not be woken: it has no mac",
                     'add mac = "aa:bb:cc:dd:ee:ff" (its wired NIC\'s: `ip link` on it shows it)')
    wake_via = get("wake_via", str, "", v.check_name)
    if wake_via and not mac:
        raise v.fail(path + ("wake_via",), "wake_via without mac", "add the node's mac: the packet names it")
    return NodeSleepWake(
        mac=mac.lower().replace("-", ":"),
        wake_via=wake_via,
        sleep_after=sleep_after,
        sleep_command=get("sleep_command", str, DEFAULT_SLEEP_COMMAND, _check_command(v)),
        wake_timeout=get("wake_timeout", Duration, DEFAULT_WAKE_TIMEOUT_S),
    )


def check_wake_via(v: Validator, names: list[str], keys: list[NodeSleepWake]) -> None:
    """Each wake_via names another node of the cluster."""
    for index, (name, node) in enumerate(zip(names, keys)):
        if not node.wake_via:
            continue
        if node.wake_via == name:
            raise v.fail(("nodes", index, "wake_via"), f"node {name!r} cannot wake itself",
                         "name another node on its LAN, or leave wake_via out to send from here")
        if node.wake_via not in names:
            raise v.fail(("nodes", index, "wake_via"), f"no node {show(node.wake_via)}",
                         "use one of: " + ", ".join(n for n in names if n != name))


def _check_mac(v: Validator):
    def check(path: tuple, value: str) -> None:
        if not _MAC_RE.fullmatch(value):
            raise v.fail(path, f"invalid MAC address {show(value)}",
                         'write six hex pairs such as "a8:a1:59:0c:22:7e" (`ip link` on the node shows it)')
        if problem := _not_a_nic(bytes.fromhex(value.replace(":", "").replace("-", ""))):
            raise v.fail(path, f"{show(value)} is {problem}, not a network card's address",
                         "copy the node's wired NIC's MAC from `ip link` on it (link/ether)")
    return check


def _not_a_nic(mac: bytes) -> str:
    """Why `mac` cannot be a NIC's own address (a magic packet to it wakes nothing), or ""."""
    if mac == b"\xff" * 6:
        return "the broadcast address"
    if mac == bytes(6):
        return "all zeros"
    return "a multicast address (its first byte is odd)" if mac[0] & 1 else ""


def _check_command(v: Validator):
    def check(path: tuple, value: str) -> None:
        try:
            argv = shlex.split(value)
        except ValueError as exc:
            raise v.fail(path, f"{show(value)} cannot be split into words ({exc})", "close its quotes") from None
        if not argv or argv[0].startswith("-"):
            raise v.fail(path, f"{show(value)} is not a command", f'write a command such as "{DEFAULT_SLEEP_COMMAND}"')
    return check

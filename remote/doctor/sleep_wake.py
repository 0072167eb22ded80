"""The doctor's "wake and sleep" row, for a node with a `mac`: that the MAC is one of its NICs', that its
SSH user may run its sleep command without a password (asked of sudo with `sudo -n -l`, which lists a
command it would allow and runs nothing: the node is never put to sleep by doctor), and whether a sleep of
its own will be heard (gdbus, node_side/agent/sleep_watch.py).

The probe is `sleep_wake_facts`; `sleep_wake_check` is pure.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass, replace
from typing import Awaitable, Callable, Sequence

from homegpu.remote.config import NodeSpec
from homegpu.remote.doctor.check import Check
from homegpu.remote.nodes import CommandResult

NAME = "wake and sleep"
# The node's NICs and their MACs, whether it runs as root and has gdbus: one small read of sysfs and PATH.
NICS_SCRIPT = """\
import json, os, shutil
nics = {}
for name in sorted(os.listdir("/sys/class/net")):
    try:
        with open(os.path.join("/sys/class/net", name, "address")) as handle:
            nics[name] = handle.read().strip().lower()
    except OSError:
        pass
print(json.dumps({"nics": nics, "root": os.geteuid() == 0, "gdbus": bool(shutil.which("gdbus"))}))
"""
SUDOERS_FIX = ("Let {user} run it without a password: `sudo visudo -f /etc/sudoers.d/homegpu-suspend` with "
               "`{user} ALL=(root) NOPASSWD: {command}` (docs/sleep.md).")


@dataclass(frozen=True)
class SleepWakeFacts:
    mac: str
    sleep_command: str
    user: str  # the node's SSH user, for the sudoers line
    nics: CommandResult  # NICS_SCRIPT's answer
    sudo: CommandResult | None = None  # `sudo -n -l COMMAND` where the user is not root


async def sleep_wake_facts(spec: NodeSpec, user: str, python: str,
                      run: Callable[[Sequence[str]], Awaitable[CommandResult]]) -> SleepWakeFacts | None:
    """What the row needs, for a node with a mac (None for one without)."""
    if not spec.sleep_wake.wakeable:
        return None
    facts = SleepWakeFacts(spec.sleep_wake.mac, spec.sleep_wake.sleep_command, user, await run([python, "-c", NICS_SCRIPT]))
    if _answer(facts.nics).get("root", True):
        return facts
    return replace(facts, sudo=await run(["sudo", "-n", "-l", *spec.sleep_wake.sleep_argv(as_root=True)]))


def sleep_wake_check(node: str, facts: SleepWakeFacts | None) -> Check:
    """✓ the mac is a NIC's and the sleep command is allowed; ✗ naming which is not, with the fix."""
    if facts is None:
        return Check(node, NAME, None, "not set up (no mac: homegpu neither wakes nor sleeps it)")
    try:
        nics: dict = dict(_answer(facts.nics)["nics"])
    except (KeyError, TypeError, ValueError):
        return Check(node, NAME, None, f"could not list its NICs ({facts.nics.telling_line})")
    mac = facts.mac
    owner = next((name for name, address in nics.items() if address == mac), None)
    if owner is None:
        listed = ", ".join(f"{name} {address}" for name, address in nics.items() if name != "lo") or "none"
        return Check(node, NAME, False, f"mac {mac} is none of its NICs' ({listed})",
                     "Set mac in cluster.toml to its wired NIC's (`ip link` on it shows link/ether).")
    command = facts.sleep_command
    if facts.sudo is not None and not facts.sudo.ok:
        return Check(node, NAME, False, f"mac is {owner}'s; but sudo does not let {facts.user} run `{command}` "
                     f"without a password ({facts.sudo.telling_line}), so homegpu cannot put it to sleep",
                     SUDOERS_FIX.format(user=facts.user, command=" ".join(shlex.split(command))))
    how = "as root" if facts.sudo is None else "through sudo -n, allowed"
    heard = ("" if _answer(facts.nics).get("gdbus", True) else "; without gdbus (libglib2.0-bin) a sleep of its "
             "own (a lid, its idle timer) will read as offline")
    return Check(node, NAME, True, f"mac is {owner}'s; `{command}` would run {how} (not run by doctor){heard}")


def _answer(result: CommandResult) -> dict:
    """NICS_SCRIPT's JSON ({} when the command failed or said something else)."""
    try:
        found = json.loads((result.stdout.strip().splitlines() or ["{}"])[-1])
    except ValueError:
        return {}
    return found if result.ok and isinstance(found, dict) else {}

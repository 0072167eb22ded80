"""A LAN in a box: one network namespace per simulated machine, all on one bridge.

Every node gets a namespace `hgsim<PID>-<N>` holding one end of a veth pair (`eth0`, address
10.213.0.N/24); the other end (`hgv<PID>-<N>`) is a port of the bridge `hgsim0` (10.213.0.1), through
which the controller (this machine's own network stack) reaches the nodes. Links are shaped with tc
tbf on both ends (1 Gbit/s by default, a home Ethernet). The range is used only inside namespaces the
test run creates, so no packet of it leaves this machine.

Docker sets the iptables FORWARD policy to DROP and bridged traffic passes through iptables here, so
one rule lets the bridge forward between its own ports; it is removed with the bridge.

The owner's pid is part of every name: a run that crashed leaves names whose pid is dead, and the
next run removes exactly those (and the bridge when nobody else uses it) before it builds its own.
"""

from __future__ import annotations

import atexit
import os
import subprocess

PREFIX = "hgsim"
BRIDGE = f"{PREFIX}0"
SUBNET = "10.213.0"
BRIDGE_ADDRESS = f"{SUBNET}.1"
FORWARD_RULE = ["FORWARD", "-i", BRIDGE, "-o", BRIDGE, "-j", "ACCEPT"]
DEFAULT_MBIT = 1000

_ours: set[str] = set()  # namespaces this process made and has not deleted
_bridge_ready = False


class NetError(RuntimeError):
    """A namespace, link or the bridge could not be set up; the message has the tool's output."""


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return _tool(["ip", *args], check)


def _tool(argv: list[str], check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    if check and proc.returncode != 0:
        raise NetError(f"{' '.join(argv)} failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc


def address_of(host: int) -> str:
    if not 2 <= host <= 254:
        raise NetError(f"host number {host} is outside 2..254 of {SUBNET}.0/24")
    return f"{SUBNET}.{host}"


def namespace_of(host: int) -> str:
    return f"{PREFIX}{os.getpid()}-{host}"


def veth_of(host: int) -> str:
    return f"hgv{os.getpid() % 10_000_000}-{host}"  # interface names have at most 15 characters


def _all_namespaces() -> list[str]:
    listing = _ip("netns", "list", check=False).stdout
    return [line.split()[0] for line in listing.splitlines() if line.startswith(PREFIX)]


def _owner_alive(namespace: str) -> bool:
    pid = namespace[len(PREFIX):].split("-", 1)[0]
    return pid.isdigit() and os.path.exists(f"/proc/{pid}")


def namespace_pids(namespace: str) -> set[int]:
    """Every process whose network namespace is `namespace` (as `ip netns pids` finds them)."""
    out = _ip("netns", "pids", namespace, check=False).stdout
    return {int(pid) for pid in out.split() if pid.isdigit()}


def _delete_namespace(namespace: str) -> None:
    for pid in namespace_pids(namespace):
        try:
            os.kill(pid, 9)
        except ProcessLookupError:
            pass
    _ip("netns", "delete", namespace, check=False)  # takes its veth pair with it


def _rule(action: str) -> bool:
    return _tool(["iptables", action, *FORWARD_RULE], check=False).returncode == 0


def ensure_bridge() -> None:
    """Remove what crashed runs left, then make the bridge and its FORWARD rule (once per process)."""
    global _bridge_ready
    if _bridge_ready:
        return
    for stale in _all_namespaces():
        if not _owner_alive(stale):
            _delete_namespace(stale)
    if _ip("link", "show", BRIDGE, check=False).returncode != 0:
        _ip("link", "add", BRIDGE, "type", "bridge")
        _ip("addr", "add", f"{BRIDGE_ADDRESS}/24", "dev", BRIDGE)
        _ip("link", "set", BRIDGE, "up")
    if not _rule("-C"):
        _tool(["iptables", "-I", *FORWARD_RULE])
    _bridge_ready = True
    atexit.register(teardown)


def teardown() -> None:
    """Delete this process's namespaces; the bridge and rule too when no live run uses them."""
    global _bridge_ready
    for namespace in list(_ours):
        remove_node(namespace)
    if any(_owner_alive(namespace) for namespace in _all_namespaces()):
        return
    _ip("link", "delete", BRIDGE, check=False)
    while _rule("-D"):
        pass
    _bridge_ready = False


def add_node(host: int, mbit: int | None = DEFAULT_MBIT) -> tuple[str, str]:
    """Make namespace and link for host number `host`; return (namespace, host-side veth)."""
    ensure_bridge()
    namespace, veth, address = namespace_of(host), veth_of(host), address_of(host)
    if namespace in _all_namespaces():
        _delete_namespace(namespace)  # our own, from a cluster of this process that crashed
    _ip("link", "delete", veth, check=False)  # a deleted namespace's link may outlive it for a moment
    _ip("netns", "add", namespace)
    _ours.add(namespace)
    _ip("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", namespace)
    _ip("link", "set", veth, "master", BRIDGE, "up")
    _ip("-n", namespace, "addr", "add", f"{address}/24", "dev", "eth0")
    _ip("-n", namespace, "link", "set", "eth0", "up")
    _ip("-n", namespace, "link", "set", "lo", "up")
    # A machine that had this address before (a test's earlier node) left its MAC in this machine's
    # neighbour table: forget it, or the new node is unreachable until that entry goes stale.
    _ip("neigh", "flush", "to", address, "dev", BRIDGE, check=False)
    set_speed(namespace, veth, mbit)
    return namespace, veth


def remove_node(namespace: str) -> None:
    """Kill what runs in the namespace and delete it (its link goes with it)."""
    _delete_namespace(namespace)
    _ours.discard(namespace)


def set_speed(namespace: str, veth: str, mbit: int | None) -> None:
    """Shape both ends of the link to `mbit` Mbit/s with tbf; None removes the shaping."""
    for prefix in ([], ["-n", namespace]):
        device = veth if not prefix else "eth0"
        _tool(["tc", *prefix, "qdisc", "del", "dev", device, "root"], check=False)
        if mbit is not None:
            # A burst of 256 kB at 1 Gbit/s measured 0.955 Gbit/s in iperf3; scale it with the rate.
            burst = max(32, 256 * mbit // 1000)
            _tool(["tc", *prefix, "qdisc", "add", "dev", device, "root", "tbf", "rate", f"{mbit}mbit",
                   "burst", f"{burst}kb", "latency", "20ms"])


def set_link(namespace: str, address: str, up: bool) -> None:
    """Lose or restore every packet between the node and the LAN, as a Wi-Fi drop does: the
    interfaces stay up (so no socket learns of it at once) and open connections stay open.

    Packets are dropped where they arrive, never where they are sent (a DROP on OUTPUT would fail the
    sender's write at once): in the node for what comes in, on this machine's bridge (FORWARD) and
    host (INPUT) for what the node sends. (This kernel has no tc drop action and no netem.)"""
    action = "-I" if not up else "-D"
    rules = [(["ip", "netns", "exec", namespace, "iptables"], ["INPUT", "!", "-i", "lo"]),
             (["iptables"], ["FORWARD", "-s", address]), (["iptables"], ["INPUT", "-s", address])]
    for command, rule in rules:
        _tool([*command, action, *rule, "-j", "DROP"], check=not up)

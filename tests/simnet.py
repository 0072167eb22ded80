"""A LAN in a box: one network namespace per simulated machine, all on one bridge.

Every node gets a namespace `hgsim<PID>-<N>` holding one end of a veth pair (`eth0`, address
10.213.0.N/24); the other end (`hgv<PID>-<N>`) is a port of the bridge `hgsim0` (10.213.0.1), through
which the controller (this machine's own network stack) reaches the nodes. Those are LAN 0's names: a
test session on LAN L (lan_id) uses 10.213.2L.0/24 and the bridge `hgsim<2L>`, so sessions on different
LANs (pytest-xdist's workers, separate checkouts) run side by side. Links are shaped with tc
tbf on both ends (1 Gbit/s by default, a home Ethernet). The range is used only inside namespaces the
test run creates, so no packet of it leaves this machine.

Docker sets the iptables FORWARD policy to DROP and bridged traffic passes through iptables here, so
one rule lets the bridge forward between its own ports; it is removed with the bridge.

A lab behind a gateway is a second LAN: the bridge `hgsim1` (10.213.1.0/24; LAN L's `hgsim<2L+1>`,
10.213.2L+1.0/24) has no address on this
machine, so the controller reaches its machines only through a gateway, a namespace with a leg on
each bridge (add_leg), whose sshd serves as the ssh config's ProxyJump. The machines behind it route
everything else through it (its 10.213.1.1), as a lab's machines route through their login node.

The owner's pid is part of every name: a run that crashed leaves names whose pid is dead, and the
next run removes exactly those before it builds its own; a session removes its LAN's bridges when no
other live process has a port on them.
"""

from __future__ import annotations

import atexit
import os
import subprocess

PREFIX = "hgsim"
LAN_ENV = "HOMEGPU_TEST_LAN"  # the first LAN id of a test session (default 0); xdist's worker gwN adds N
MAX_LAN_ID = 127  # LAN L's lab is 10.213.2L+1.0/24


def lan_id() -> int:
    """This session's LAN: $HOMEGPU_TEST_LAN (0 when unset) plus the number of its pytest-xdist worker."""
    first = os.environ.get(LAN_ENV, "0")
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw")
    if not (first.isdigit() and worker.isdigit()) or int(first) + int(worker) > MAX_LAN_ID:
        raise ValueError(f"${LAN_ENV}={first!r} with xdist worker gw{worker}: the LAN id must be 0..{MAX_LAN_ID}")
    return int(first) + int(worker)


LAN_ID = lan_id()
LAB = 1  # the LAN behind the gateway (a lan argument below: 0 is the controller's LAN)
SUBNET = f"10.213.{2 * LAN_ID}"
BRIDGE = f"{PREFIX}{2 * LAN_ID}"
BRIDGE_ADDRESS = f"{SUBNET}.1"
GATEWAY_HOST = 1  # the gateway's host number on the lab LAN (10.213.1.1): no bridge address takes it there
DEFAULT_MBIT = 1000

_ours: set[str] = set()  # namespaces this process made and has not deleted
_bridge_ready = False
_lab_ready = False


class NetError(RuntimeError):
    """A namespace, link or the bridge could not be set up; the message has the tool's output."""


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return _tool(["ip", *args], check)


def _tool(argv: list[str], check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    if check and proc.returncode != 0:
        raise NetError(f"{' '.join(argv)} failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc


def subnet_of(lan: int = 0) -> str:
    """The first three octets of `lan` (0 or LAB) of this session's LAN."""
    return f"10.213.{2 * LAN_ID + lan}"


def address_of(host: int, lan: int = 0) -> str:
    lowest = 1 if lan else 2
    if not lowest <= host <= 254:
        raise NetError(f"host number {host} is outside {lowest}..254 of {subnet_of(lan)}.0/24")
    return f"{subnet_of(lan)}.{host}"


def bridge_of(lan: int) -> str:
    return f"{PREFIX}{2 * LAN_ID + lan}"


def namespace_of(host: int, lan: int = 0) -> str:
    return f"{PREFIX}{os.getpid()}-{host}" if not lan else f"{PREFIX}{os.getpid()}-{lan}x{host}"


def veth_of(host: int, lan: int = 0) -> str:
    kind = "hgv" if not lan else f"hg{lan}"
    return f"{kind}{os.getpid() % 10_000_000}-{host}"  # interface names have at most 15 characters


def _all_namespaces() -> list[str]:
    listing = _ip("netns", "list", check=False).stdout
    return [line.split()[0] for line in listing.splitlines() if line.startswith(PREFIX)]


def _others_ports(bridge: str) -> list[str]:
    """The ports of `bridge` whose owner (the pid in a veth's name) is another live process: a session
    on the same LAN id."""
    listing = _ip("-o", "link", "show", "master", bridge, check=False).stdout
    ports = [line.split(":")[1].strip().split("@")[0] for line in listing.splitlines() if ":" in line]
    owners = [port[3:].split("-", 1)[0] for port in ports]
    return [port for port, pid in zip(ports, owners)
            if pid.isdigit() and int(pid) != os.getpid() % 10_000_000 and os.path.exists(f"/proc/{pid}")]


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


def _forward_rule(lan: int) -> list[str]:
    bridge = bridge_of(lan)
    return ["FORWARD", "-i", bridge, "-o", bridge, "-j", "ACCEPT"]


def _rule(action: str, lan: int = 0) -> bool:
    return _tool(["iptables", action, *_forward_rule(lan)], check=False).returncode == 0


def ensure_lab() -> None:
    """The lab LAN's bridge (no address here: the controller has no leg on it) and its FORWARD rule."""
    global _lab_ready
    ensure_bridge()
    if _lab_ready:
        return
    bridge = bridge_of(LAB)
    if _ip("link", "show", bridge, check=False).returncode != 0:
        _ip("link", "add", bridge, "type", "bridge")
        _ip("link", "set", bridge, "up")
    if not _rule("-C", LAB):
        _tool(["iptables", "-I", *_forward_rule(LAB)])
    _lab_ready = True


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
        _tool(["iptables", "-I", *_forward_rule(0)])
    _bridge_ready = True
    atexit.register(teardown)


def teardown() -> None:
    """Delete this process's namespaces; its LAN's bridges and rules too when no other process has a port
    on them (other LANs' bridges belong to sessions that may still be running)."""
    global _bridge_ready, _lab_ready
    for namespace in list(_ours):
        remove_node(namespace)
    if any(_others_ports(bridge_of(lan)) for lan in (0, LAB)):
        return
    for lan in (0, LAB):
        _ip("link", "delete", bridge_of(lan), check=False)
        while _rule("-D", lan):
            pass
    _bridge_ready = _lab_ready = False


def add_node(host: int, mbit: int | None = DEFAULT_MBIT, lan: int = 0) -> tuple[str, str]:
    """Make namespace and link for host number `host` on `lan`; return (namespace, host-side veth).
    A machine of the lab LAN routes everything else through the gateway."""
    if lan:
        ensure_lab()
    else:
        ensure_bridge()
    namespace, veth = namespace_of(host, lan), veth_of(host, lan)
    if namespace in _all_namespaces():
        _delete_namespace(namespace)  # our own, from a cluster of this process that crashed
    _ip("netns", "add", namespace)
    _ours.add(namespace)
    _ip("-n", namespace, "link", "set", "lo", "up")
    _attach(namespace, "eth0", host, lan, mbit)
    if lan:
        _ip("-n", namespace, "route", "add", "default", "via", address_of(GATEWAY_HOST, lan))
    return namespace, veth


def add_leg(namespace: str, host: int, lan: int = LAB, mbit: int | None = DEFAULT_MBIT) -> str:
    """Give a node's namespace a second interface, eth1 on `lan` (a gateway's); return its host-side veth."""
    ensure_lab()
    return _attach(namespace, "eth1", host, lan, mbit)


def _attach(namespace: str, device: str, host: int, lan: int, mbit: int | None) -> str:
    veth, address = veth_of(host, lan), address_of(host, lan)
    _ip("link", "delete", veth, check=False)  # a deleted namespace's link may outlive it for a moment
    _ip("link", "add", veth, "type", "veth", "peer", "name", device, "netns", namespace)
    _ip("link", "set", veth, "master", bridge_of(lan), "up")
    _ip("-n", namespace, "addr", "add", f"{address}/24", "dev", device)
    _ip("-n", namespace, "link", "set", device, "up")
    # A machine that had this address before (a test's earlier node) left its MAC in this machine's
    # neighbour table: forget it, or the new node is unreachable until that entry goes stale.
    _ip("neigh", "flush", "to", address, "dev", bridge_of(lan), check=False)
    set_speed(namespace, veth, mbit, device)
    return veth


def remove_node(namespace: str) -> None:
    """Kill what runs in the namespace and delete it (its link goes with it)."""
    _delete_namespace(namespace)
    _ours.discard(namespace)


def set_speed(namespace: str, veth: str, mbit: int | None, inside: str = "eth0") -> None:
    """Shape both ends of the link to `mbit` Mbit/s with tbf; None removes the shaping."""
    for prefix in ([], ["-n", namespace]):
        device = veth if not prefix else inside
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

"""Machines that sleep on the test LAN: a suspend that an SSH command asks for, Wake-on-LAN that ends it.

A sleepy node (`with node.sleepy() as sleeper:`, SimNode.sleepy) stands in for a machine with
`systemctl suspend` and a network card armed for Wake-on-LAN:

- `sleeper.command` is the node's sleep command (cluster.toml's `sleep_command`). Run on the node over
  SSH, it leaves a request (the session's $HOMEGPU_SIMNODE) in a file of the node's own, and the
  harness puts the node to sleep: its logind says PrepareForSleep(true) on the node's system bus
  (tests/simlogind.py), and SUSPEND_S later every process of it is killed at once (sshd's listener, every
  connection, the stats agent, workers, detached ones), as the network goes away under a real suspend,
  so the command's own SSH connection drops too. Only the wake listener is left.
- The wake listener is the network card: a Python of the standard library in the node's own network
  namespace, bound to UDP 0.0.0.0 ports 9 and 7, so it gets what reaches the node's eth0 (the LAN's
  broadcast 10.213.0.255, 255.255.255.255 sent on the LAN, the node's own address) and nothing the node's
  iptables drops. It passes every datagram up to the harness, which parses it (parse_magic): a magic
  packet for the node's own MAC while it sleeps starts sshd again through SimNode.start() (same
  address, same host key, so known_hosts still holds); any other datagram, or one while awake, only
  goes into `sleeper.packets`. A node made with `wakes=False` never wakes (its packets are recorded).

One thread per sleepy node reads the listener and watches the request file; the block's end stops both,
and wakes a node left asleep (a node of a shared cluster must be up for the next test).
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import shlex
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterator, NamedTuple

import simnet
from simlogind import Logind

if TYPE_CHECKING:
    from simcluster import SimNode

WAKE_PORTS = (9, 7)  # discard and echo: where wakeonlan, etherwake -b and NICs' firmware look
SYNC = b"\xff" * 6
BROADCAST = f"{simnet.SUBNET}.255"  # the test LAN's broadcast address, where the controller's packets go
POLL_S = 0.05
SUSPEND_S = 0.5  # from logind's PrepareForSleep(true) to the node's sleep

# The wake listener: every datagram to UDP 9 or 7 of any address of the namespace, as one JSON line.
_LISTENER = r"""
import json, select, socket, sys
socks = []
for port in map(int, sys.argv[1:]):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("0.0.0.0", port))
    socks.append(s)
print("ready", flush=True)
while True:
    for s in select.select(socks, [], [])[0]:
        data, (host, _) = s.recvfrom(65535)
        print(json.dumps({"sender": host, "port": s.getsockname()[1], "data": data.hex()}), flush=True)
"""


class WakePacket(NamedTuple):
    """A datagram the node's wake listener got: who sent it, to which port, the MAC of the magic packet it is
    (None: not a magic packet) and whether it woke the node."""

    sender: str
    port: int
    mac: str | None
    woke: bool


def magic_packet(mac: str) -> bytes:
    """The Wake-on-LAN magic packet for `mac` ("aa:bb:cc:dd:ee:ff" or with dashes): 6 x 0xFF, then the MAC
    16 times (102 bytes)."""
    raw = bytes.fromhex(mac.replace(":", "").replace("-", ""))
    if len(raw) != 6:
        raise ValueError(f"not a MAC address: {mac!r}")
    return SYNC + raw * 16


def parse_magic(data: bytes) -> str | None:
    """The MAC (lowercase, colons) a magic packet wakes, or None if `data` is none. As a network card does,
    the sync stream and 16 copies may sit anywhere in the payload (a SecureOn password may follow)."""
    start = data.find(SYNC)
    while start != -1:
        mac = data[start + 6:start + 12]
        if len(mac) == 6 and data[start + 6:start + 102] == mac * 16:
            return mac.hex(":")
        start = data.find(SYNC, start + 1)
    return None


def send_magic(mac: str, address: str = BROADCAST, port: int = 9, *, namespace: str | None = None,
               payload: bytes | None = None) -> None:
    """Send the magic packet for `mac` (or `payload`) to UDP `address`:`port` with SO_BROADCAST, from this
    machine (the controller, 10.213.0.1 on the LAN) or from a node's network namespace."""
    data = magic_packet(mac) if payload is None else payload
    if namespace is None:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_BROADCAST, 1)
            sock.sendto(data, (address, port))
        return
    script = ("import socket, sys; s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); "
              "s.setsockopt(socket.SOL_SOCKET, socket.SO_BROADCAST, 1); "
              "s.sendto(bytes.fromhex(sys.argv[1]), (sys.argv[2], int(sys.argv[3])))")
    sent = subprocess.run(["ip", "netns", "exec", namespace, sys.executable, "-c", script, data.hex(), address,
                           str(port)], capture_output=True, text=True, timeout=30)
    if sent.returncode != 0:  # e.g. 255.255.255.255: "Network is unreachable", a node has no default route
        raise OSError(f"sending to {address}:{port} from {namespace} failed: {sent.stderr.strip().splitlines()[-1:]}")


def mac_of(namespace: str, device: str = "eth0") -> str:
    """The MAC address of `device` in network namespace `namespace`, lowercase with colons."""
    out = subprocess.run(["ip", "-j", "-n", namespace, "link", "show", "dev", device], check=True,
                         capture_output=True, text=True, timeout=30).stdout
    return json.loads(out)[0]["address"].lower()


class Sleeper:
    """The sleep and wake of one node (made by SimNode.sleepy; use it as a context manager).

    `sleep` and `wake` are the node's own (SimNode's kill sparing the listener, and start); they run in
    this object's thread, never at once.
    """

    def __init__(self, node: SimNode, folder: Path, *, wakes: bool = True, returns: bool = False,
                 sleep: Callable[[set[int]], None], wake: Callable[[], None]) -> None:
        self.node = node
        self.wakes_on_lan = wakes
        self._request = folder / "sleep-request"
        self._sleep, self._wake = sleep, wake
        self._returns = returns
        self._cond = threading.Condition()
        self._asleep = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._listener: subprocess.Popen | None = None
        self.mac = node.mac
        self.packets: list[WakePacket] = []
        self.sleeps = 0  # times the node went to sleep
        self.wakes = 0  # times a magic packet woke it
        self.ignored_requests: list[str] = []  # sleep requests from another node's session (its marker)
        self.errors: list[BaseException] = []  # what failed in the thread (raised again at the block's end)
        self.logind: Logind | None = None  # the node's system bus, with logind's word before and after each sleep

    # -- what a test uses --

    @property
    def command(self) -> str:
        """The node's sleep command (cluster.toml `sleep_command`): run on the node over SSH, it puts the node
        to sleep within about 0.1 s; its connection drops (it never returns), unless the node was made with
        `returns=True`: then it exits 0 at once, as `systemctl suspend --no-block` does, and sleep follows."""
        path = shlex.quote(str(self._request))
        ask = f'echo "$HOMEGPU_SIMNODE" > {path}.tmp && mv {path}.tmp {path}'
        script = self._request.with_name("suspend")  # a program, as `systemctl suspend` is: run without a shell
        script.write_text(f"#!/bin/sh\n{ask}" + ("" if self._returns else " && sleep 30") + "\n")
        script.chmod(0o755)
        return str(script)

    @property
    def cluster_keys(self) -> dict[str, str]:
        """The node's keys for cluster.toml (`node_overrides={name: sleeper.cluster_keys}`)."""
        return {"mac": self.mac, "sleep_command": self.command}

    @property
    def asleep(self) -> bool:
        return self._asleep

    @property
    def listener_pid(self) -> int | None:
        return self._listener.pid if self._listener is not None and self._listener.poll() is None else None

    def sleep_now(self) -> None:
        """Put the node to sleep from the test, as the machine does by itself (an idle timer, a closed lid) or its
        sleep command would, and return once it sleeps."""
        self._request.with_name(self._request.name + ".tmp").write_text(self.node.marker + "\n")
        os.replace(self._request.with_name(self._request.name + ".tmp"), self._request)
        self.wait_asleep()

    def wait_asleep(self, timeout: float = 10.0) -> None:
        """Return once the node sleeps; TimeoutError after `timeout` s."""
        self._wait_for(True, timeout)

    def wait_awake(self, timeout: float = 10.0) -> None:
        """Return once the node is awake (sshd answering again); TimeoutError after `timeout` s."""
        self._wait_for(False, timeout)

    def packets_from(self, sender: str) -> list[WakePacket]:
        return [packet for packet in self.packets if packet.sender == sender]

    def wait_packets(self, count: int, timeout: float = 10.0) -> list[WakePacket]:
        """Return the packets once at least `count` have come (and been acted on); TimeoutError otherwise."""
        with self._cond:
            if not self._cond.wait_for(lambda: len(self.packets) >= count or self.errors, timeout):
                raise TimeoutError(f"{self.node.name}: {len(self.packets)} wake packets, not {count}, "
                                   f"after {timeout} s")
            self._raise_errors()
            return list(self.packets)

    # -- lifecycle --

    def start(self) -> Sleeper:
        """Start the wake listener in the node's namespace and the thread; return once the listener listens."""
        self._request.unlink(missing_ok=True)
        self.logind = Logind(self.node.system_bus_socket)
        self._listener = subprocess.Popen(
            self.node.in_namespace([sys.executable, "-u", "-c", _LISTENER, *map(str, WAKE_PORTS)]),
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, bufsize=0)
        ready, _, _ = select.select([self._listener.stdout], [], [], 10.0)
        if not ready or self._listener.stdout.readline() != b"ready\n":
            self.close()
            raise RuntimeError(f"{self.node.name}: the wake listener did not start: {self._stderr()}")
        self._thread = threading.Thread(target=self._loop, name=f"sleeper-{self.node.name}", daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        """Stop the thread and the listener; wake the node if it sleeps and nobody took it down meanwhile."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        left_asleep = self._asleep and self.listener_pid is not None
        if self._listener is not None:
            if self._listener.poll() is None:
                self._listener.kill()
            self._listener.wait(timeout=10)
            self._listener.stdout.close()
            self._listener.stderr.close()
        self._request.unlink(missing_ok=True)
        if left_asleep:
            self._wake()
            self._asleep = False
        if self.logind is not None:
            self.logind.close()

    def __enter__(self) -> Sleeper:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
        if exc[0] is None:
            self._raise_errors()

    # -- the thread --

    def _loop(self) -> None:
        stdout = self._listener.stdout
        while not self._stop.is_set():
            try:
                if select.select([stdout], [], [], POLL_S)[0]:
                    line = stdout.readline()
                    if not line:
                        return  # the listener died: the node was stopped or closed under us
                    self._on_datagram(json.loads(line))
                self._check_request()
            except BaseException as exc:  # noqa: BLE001 (kept for the test's thread)
                with self._cond:
                    self.errors.append(exc)
                    self._cond.notify_all()
                return

    def _check_request(self) -> None:
        try:
            marker = self._request.read_text().strip()
        except FileNotFoundError:
            return
        self._request.unlink(missing_ok=True)
        if marker != self.node.marker:
            self.ignored_requests.append(marker)
            return
        if not self._asleep:
            # Logind says it first, whoever asked (a sleep command, an idle timer, a lid), and the machine
            # takes a moment to freeze its processes.
            self.logind.prepare_for_sleep(True)
            time.sleep(SUSPEND_S)
            self._sleep({self._listener.pid})
            with self._cond:
                self._asleep = True
                self.sleeps += 1
                self._cond.notify_all()

    def _on_datagram(self, message: dict) -> None:
        mac = parse_magic(bytes.fromhex(message["data"]))
        woke = self._asleep and self.wakes_on_lan and mac == self.mac
        if woke:
            self._wake()
            self.logind.prepare_for_sleep(False)
        with self._cond:  # the packet, the count and the state change together for the test's waits
            self.packets.append(WakePacket(message["sender"], message["port"], mac, woke))
            if woke:
                self._asleep = False
                self.wakes += 1
            self._cond.notify_all()

    def _wait_for(self, asleep: bool, timeout: float) -> None:
        with self._cond:
            if not self._cond.wait_for(lambda: self._asleep == asleep or self.errors, timeout):
                state = "asleep" if asleep else "awake"
                raise TimeoutError(f"{self.node.name} not {state} after {timeout} s")
            self._raise_errors()

    def _raise_errors(self) -> None:
        if self.errors:
            raise RuntimeError(f"{self.node.name}'s sleeper failed: {self.errors[0]!r}") from self.errors[0]

    def _stderr(self) -> str:
        if self._listener is None or self._listener.poll() is None:
            return "(still running)"
        return self._listener.stderr.read().decode(errors="replace").strip()


@contextlib.contextmanager
def dropping_wake_packets(node: SimNode, address: str) -> Iterator[None]:
    """For the block, the node's own iptables drops UDP to its wake ports from `address` (rules in the node's
    namespace, so packets from elsewhere still come; they go with the namespace if the block never ends)."""
    rules = [["INPUT", "-p", "udp", "-s", address, "--dport", str(port), "-j", "DROP"] for port in WAKE_PORTS]
    added = []
    try:
        for rule in rules:
            subprocess.run(node.in_namespace(["iptables", "-I", *rule]), check=True, capture_output=True)
            added.append(rule)
        yield
    finally:
        for rule in added:
            subprocess.run(node.in_namespace(["iptables", "-D", *rule]), check=False, capture_output=True)


@contextlib.contextmanager
def limited_broadcast_route(node: SimNode) -> Iterator[None]:
    """For the block the node sends to 255.255.255.255 out its eth0, as a machine whose default route is on
    its LAN does (`wakeonlan`'s default address); without it such a send fails, "Network is unreachable"."""
    route = ["route", "add", "255.255.255.255/32", "dev", "eth0"]
    subprocess.run(node.in_namespace(["ip", *route]), check=True, capture_output=True)
    try:
        yield
    finally:
        subprocess.run(node.in_namespace(["ip", "route", "del", *route[2:]]), check=False, capture_output=True)


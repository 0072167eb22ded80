"""Wake-on-LAN: send a sleeping machine's magic packet to every LAN this machine is on.

Standard library only, Python 3.8+: homegpu sends from the controller, or ships this file to another
node (a node's ``wake_via``) to send from that node's LANs, for a controller whose broadcasts cannot
reach the sleeper (Wi-Fi, a VPN, another subnet). Run as ``python3 -c SOURCE MAC``, it prints one JSON
line: ``{"sent": ["ADDRESS:PORT", ...], "errors": [...]}``.

The magic packet is six 0xFF bytes, then the MAC sixteen times (AMD's "Magic Packet Technology" white
paper); a NIC armed for it (``ethtool NIC`` says ``Wake-on: g``) wakes its machine whatever else the
frame holds, so it goes as UDP to ports 9 (discard) and 7 (echo), the ports tools such as wakeonlan and
etherwake's UDP mode use. It is sent to the directed broadcast address of each IPv4 interface (a
router forwards none of them) and to 255.255.255.255, which leaves by the default route's interface.
"""

from __future__ import annotations

import json
import socket
import struct
import sys

PORTS = (9, 7)
LIMITED_BROADCAST = "255.255.255.255"
_SIOCGIFFLAGS, _SIOCGIFADDR, _SIOCGIFNETMASK = 0x8913, 0x8915, 0x891B  # Linux's ioctls: flags, address, netmask
_IFF_UP, _IFF_BROADCAST, _IFF_LOOPBACK = 0x1, 0x2, 0x8


def magic_packet(mac):
    """The packet that wakes the NIC with ``mac`` (``aa:bb:cc:dd:ee:ff`` or with dashes)."""
    raw = bytes.fromhex(mac.replace(":", "").replace("-", ""))
    if len(raw) != 6:
        raise ValueError(f"{mac!r} is not a MAC address")
    return b"\xff" * 6 + raw * 16


def broadcast_addresses():
    """Each up, broadcast-capable, non-loopback IPv4 interface's broadcast address (Linux: its address with
    the host bits set, as not every interface has its broadcast address configured), then 255.255.255.255;
    elsewhere, or where the interfaces cannot be asked, the last alone."""
    found = []
    try:
        import fcntl

        names = [name for _, name in socket.if_nameindex()]
    except (ImportError, OSError):
        return [LIMITED_BROADCAST]
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        for name in names:
            request = struct.pack("256s", name.encode()[:15])
            try:
                flags = struct.unpack("H", fcntl.ioctl(probe.fileno(), _SIOCGIFFLAGS, request)[16:18])[0]
                if flags & _IFF_LOOPBACK or not flags & _IFF_UP or not flags & _IFF_BROADCAST:
                    continue
                own = fcntl.ioctl(probe.fileno(), _SIOCGIFADDR, request)[20:24]
                mask = fcntl.ioctl(probe.fileno(), _SIOCGIFNETMASK, request)[20:24]
            except OSError:  # no IPv4 address on it
                continue
            address = socket.inet_ntoa(bytes(a | (~m & 0xFF) for a, m in zip(own, mask)))
            if address not in found and address != "0.0.0.0":
                found.append(address)
    return found + [LIMITED_BROADCAST]


def send(mac, addresses=None, ports=PORTS):
    """Send ``mac``'s magic packet to each address and port; return (sent "address:port" list, errors)."""
    packet = magic_packet(mac)
    sent, errors = [], []
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_BROADCAST, 1)
        for address in addresses or broadcast_addresses():
            for port in ports:
                try:
                    sock.sendto(packet, (address, port))
                    sent.append(f"{address}:{port}")
                except OSError as exc:
                    errors.append(f"{address}:{port}: {exc.strerror or exc}")
    return sent, errors


def main(argv):
    try:
        sent, errors = send(argv[0])
    except (IndexError, ValueError) as exc:
        sent, errors = [], [f"usage: wake_packet MAC ({exc})"]
    print(json.dumps({"sent": sent, "errors": errors}))
    return 0 if sent else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

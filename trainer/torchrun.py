"""`python -m homegpu.trainer.torchrun --address ADDRESS TORCHRUN-ARGS...`: PyTorch's torchrun, on the
interface that holds the node's cluster address.

gloo and NCCL pick their network interface from the machine's hostname, which a home machine often maps
to 127.0.1.1 (Debian and Ubuntu do): the processes of two nodes then cannot reach each other. Here
GLOO_SOCKET_IFNAME and NCCL_SOCKET_IFNAME are set to the interface that holds ADDRESS (unless the job's
env sets them), looked up where the worker runs (in a container too: its network is the host's), then
torch.distributed.run runs in this process as `torchrun TORCHRUN-ARGS...` would.

Standard library only until torch's own module; homegpu ships it with every run.
"""

from __future__ import annotations

import fcntl
import os
import runpy
import socket
import struct
import sys

SOCKET_VARS = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")
_SIOCGIFADDR = 0x8915  # Linux: an interface's IPv4 address


def interface_of(address: str) -> str | None:
    """The name of this machine's interface that holds the IPv4 `address`, or None."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        for _, name in socket.if_nameindex():
            try:
                reply = fcntl.ioctl(probe.fileno(), _SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
            except OSError:
                continue  # no IPv4 address on it
            if socket.inet_ntoa(reply[20:24]) == address:
                return name
    return None


def main(argv: list[str]) -> None:
    if len(argv) < 2 or argv[0] != "--address":
        sys.exit("usage: python -m homegpu.trainer.torchrun --address ADDRESS TORCHRUN-ARGS...")
    interface = interface_of(argv[1])
    if interface:
        for name in SOCKET_VARS:
            os.environ.setdefault(name, interface)
    sys.argv = ["torchrun", *argv[2:]]
    runpy.run_module("torch.distributed.run", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main(sys.argv[1:])

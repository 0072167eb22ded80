"""What holds a GPU back, as both GPU sources read it: clock event reasons, clocks, the PCIe link and its traffic.

Standard library only, Python 3.8+: it runs on the nodes with the agent (see ``stats_agent.py``).
``gpu_nvml.py`` and ``smi_parse.py`` read the figures; this module names the reasons and gives a
GPU's health keys one shape, whichever source filled them (``null`` where a card or driver has none):

    "throttle": ["sw_power_cap", ...] | null,  "mem_clock", "sm_clock_max", "mem_clock_max": MHz,
    "pcie": {"gen", "width", "max_gen", "max_width", "gpu_max_gen", "gpu_max_width", "tx_mbs", "rx_mbs"},
    "bus_id": "00000000:2D:00.0" | null

``max_gen`` and ``max_width`` are what the card *and* its slot can do (NVML's and nvidia-smi's
"possible with this device and system"); ``gpu_max_gen`` (NVML, nvidia-smi's ``pcie.link.gen.gpumax``)
and ``gpu_max_width`` (Linux's own reading of the card's link capability in sysfs) are the card's
alone, so a x16 card in a x4 slot is told apart from a x4 card. ``tx_mbs`` and ``rx_mbs`` are the MB/s the
GPU sends and receives over the link (NVML's nvmlDeviceGetPcieThroughput, KB/s over 20 ms, divided by
1000); nvidia-smi's --query-gpu has no such field, so they are null from it. ``bus_id`` is the GPU's PCI
address as NVML and nvidia-smi spell it: the agent matches the kernel log's XIDs to it (``gpu_xid.py``).
"""

from __future__ import annotations

import os

# NVML's documented nvmlClocksEventReason* bits (the same values as the deprecated
# nvmlClocksThrottleReason*, whose BoardLimit and Reliability bits come last), as stable names.
THROTTLE_REASONS = (
    (0x1, "gpu_idle"),
    (0x2, "applications_clocks"),
    (0x4, "sw_power_cap"),
    (0x8, "hw_slowdown"),
    (0x10, "sync_boost"),
    (0x20, "sw_thermal"),
    (0x40, "hw_thermal"),
    (0x80, "hw_power_brake"),
    (0x100, "display_clocks"),
    (0x200, "board_limit"),
    (0x400, "reliability"),
)
_KNOWN_BITS = sum(bit for bit, _ in THROTTLE_REASONS)
PCIE_KEYS = ("gen", "width", "max_gen", "max_width", "gpu_max_gen", "gpu_max_width", "tx_mbs", "rx_mbs")
CLOCK_KEYS = ("mem_clock", "sm_clock_max", "mem_clock_max")
SYSFS_PCI = "/sys/bus/pci/devices"


def throttle_names(mask):
    """The active reasons of an NVML bitmask, by name; a bit NVML had not documented is ``bit_0x...``.

    None (unknown) for anything but a non-negative int, so a failed reading never reads as "none".
    """
    if not isinstance(mask, int) or isinstance(mask, bool) or mask < 0:
        return None
    names = [name for bit, name in THROTTLE_REASONS if mask & bit]
    unknown = mask & ~_KNOWN_BITS
    return names + [f"bit_{1 << i:#x}" for i in range(unknown.bit_length()) if unknown >> i & 1]


def no_health():
    """A GPU's health keys where nothing is known (yet): every figure null."""
    health = {"throttle": None}
    health.update((key, None) for key in CLOCK_KEYS)
    health["pcie"] = {key: None for key in PCIE_KEYS}
    health["bus_id"] = None
    return health


def sysfs_bus_id(bus_id):
    """``00000000:2D:00.0`` (NVML, nvidia-smi) as Linux names the device: ``0000:2d:00.0``; None if unlike."""
    if not isinstance(bus_id, str):
        return None
    parts = bus_id.strip().lower().split(":")
    if len(parts) != 3 or not all(parts):
        return None
    domain, bus, device = parts
    return f"{domain[-4:]:0>4}:{bus}:{device}"


def card_max_width(bus_id, root=None):
    """The card's own maximum link width (its link capability, as Linux reads it), or None.

    sysfs is world-readable, so no privilege is needed; elsewhere than Linux, or for a bus id
    that names no device here (a container without /sys), it is None.
    """
    name = sysfs_bus_id(bus_id)
    if name is None:
        return None
    try:
        with open(os.path.join(root or SYSFS_PCI, name, "max_link_width")) as handle:
            value = int(handle.read().strip())
    except (OSError, ValueError):
        return None
    return value if value > 0 else None

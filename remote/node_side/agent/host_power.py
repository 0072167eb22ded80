"""The energy of the machine's CPUs (and memory) from RAPL, for the stats agent: joules since the agent began.

Standard library only, Python 3.8+: it runs on the nodes with the agent (see ``stats_agent.py``).

The kernel's powercap interface (Documentation/power/powercap/powercap.rst) has a zone per RAPL domain under
/sys/class/powercap: ``intel-rapl:N`` at the top (``name`` "package-N", or "psys" for the whole platform on
recent laptops; AMD's Zen CPUs use the same driver and names), ``intel-rapl:N:M`` below it ("core", "uncore",
"dram"). Each has ``energy_uj``, a counter in microjoules that wraps at ``max_energy_range_uj``. The machine's
energy is psys alone where there is one (it holds the packages), else every package and every dram domain
(DRAM is not part of its package's count). Since Linux 5.10 energy_uj is readable by root only (the PLATYPUS
side channel), so for most SSH users there is no RAPL: then the figure is null and the controller estimates.
"""

from __future__ import annotations

import os

if __package__:  # how the node_side modules import each other: see stats_agent.py's docstring
    from .agent_common import describe
else:
    from agent_common import describe

POWERCAP = "/sys/class/powercap"
UJ_PER_J = 1e6


def _read_text(path):
    with open(path) as handle:
        return handle.read().strip()


def rapl_zones(root=POWERCAP):
    """The zone directories whose counters add up to the machine's energy (the module's docstring), by path."""
    try:
        names = sorted(os.listdir(root))
    except OSError:
        return []
    named = {}
    for entry in names:
        if entry.startswith("intel-rapl:"):
            try:
                named[os.path.join(root, entry)] = _read_text(os.path.join(root, entry, "name"))
            except OSError:
                continue
    top = {path: name for path, name in named.items() if os.path.basename(path).count(":") == 1}
    psys = [path for path, name in top.items() if name == "psys"]
    if psys:
        return psys
    return [path for path, name in named.items() if name.startswith("package") or name == "dram"]


class RaplCounter:
    """The machine's RAPL energy in joules since this counter was made, wraps undone; ``problem`` says why
    there is none ("" where there is no RAPL at all: a VM, an ARM board)."""

    def __init__(self, root=POWERCAP):
        self.zones, self.problem = [], ""
        for zone in rapl_zones(root):
            try:
                self.zones.append([zone, int(_read_text(os.path.join(zone, "max_energy_range_uj"))),
                                   int(_read_text(os.path.join(zone, "energy_uj")))])
            except (OSError, ValueError) as exc:
                self.zones, self.problem = [], f"rapl: {zone}/energy_uj: {describe(exc)}" + (
                    " (root only since Linux 5.10); the rest of the machine is estimated where the node has "
                    "idle_watts in cluster.toml" if isinstance(exc, PermissionError) else "")
                break
        self.joules = 0.0

    def read(self, errors):
        """The joules so far, or None without RAPL (a zone that fails to read is said in ``errors``)."""
        if not self.zones:
            return None
        for zone in self.zones:
            path, wrap, before = zone
            try:
                now = int(_read_text(os.path.join(path, "energy_uj")))
            except (OSError, ValueError) as exc:
                errors.append(f"rapl: {path}/energy_uj: {describe(exc)}")
                return None
            self.joules += ((now - before) % (wrap + 1)) / UJ_PER_J  # a wrap counts from 0 again
            zone[2] = now
        return round(self.joules, 3)

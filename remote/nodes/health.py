"""Whether a GPU is held back, and by what, in words that name the cause and its fix.

Pure: a :class:`GpuStats` in (its health as the agent read it, node_side/agent/gpu_health.py), sentences
out, such as "GPU 1 thermal slowdown at 87 °C: clocks 1,200 of 1,860 MHz; improve the case's
airflow". An XID the driver logged within ``XID_RECENT_S`` is named whatever the load, with what it
means and its fix for the common codes. Nothing else is judged on an idle GPU: an idle card lowers its
clocks and drops its PCIe link generation to save power, which is not a fault. Under load a GPU is held
back when a clock event reason other than idle is active (for ``HELD_FOR_S`` where :class:`ReasonTimer`
says how long), when its SM clock is well below its maximum with no reason given, or when its link runs
below what the card and the slot can do, or the slot below what the card can. :class:`GpuHealth` judges
one node's GPUs line by line as its stats arrive, saying since when a reason holds a GPU back (the
straggler alert uses it). :func:`link_causes` gives the link's causes in parts for doctor's "pcie link"
row, which judges a link under a load of doctor's own (remote/doctor/link.py).
"""

from __future__ import annotations

import time
from collections.abc import Collection, Hashable, Mapping

from homegpu.remote.events import GpuStats, HeldBack, NodeStats

LOAD_UTIL = 30  # % utilisation from which a GPU is under load (a starved card on a x1 link shows ~40 %)
SLOW_CLOCK_SHARE = 0.75  # an SM clock below this share of its maximum is "well below" it
# Longer than the agent repeats one health reading (stats_agent.HEALTH_INTERVAL_S, 5 s): a reason
# held this long was seen by two readings at least, not one moment.
HELD_FOR_S = 8.0
IDLE = "gpu_idle"
XID_RECENT_S = 3600.0  # an XID logged this long before the line is news; older ones stay in the figures only

# A reason's name (node_side/agent/gpu_health.py) -> (what it is, the fix).
REASONS = {
    "sw_power_cap": ("power cap", "raise the limit (nvidia-smi -pl) or accept it"),
    "hw_power_brake": ("power brake", "the power supply or its cables cannot feed it; check them"),
    "hw_thermal": ("thermal slowdown", "improve the case's airflow"),
    "sw_thermal": ("thermal slowdown", "improve the case's airflow"),
    "hw_slowdown": ("hardware slowdown", "the card protects itself from heat or power; check its fans "
                                         "and power cables"),
    "applications_clocks": ("application clocks", "reset them (nvidia-smi -rac)"),
    "sync_boost": ("sync boost", "it keeps pace with the slowest GPU it is synced with; look at that one"),
    "display_clocks": ("display clocks", "a display holds its clocks; train on a GPU without one"),
    "board_limit": ("board limit", "its board caps the clocks; nothing to change here"),
    "reliability": ("reliability limit", "the driver caps the clocks to protect the card; nothing to "
                                         "change here"),
}
THERMAL = ("hw_thermal", "sw_thermal")
# An XID's code -> (what it is, the fix), after NVIDIA's "Xid Errors" catalogue; other codes point there.
XIDS = {
    79: ("fallen off the bus", "reseat the card and its riser, and check its power cables"),
    48: ("double-bit ECC error", "reset the GPU (nvidia-smi -r) or reboot; if it comes back, the card needs service"),
    13: ("graphics engine exception", "usually the program: check its log"),
    31: ("memory page fault", "usually the program (a bad address): check its log"),
    43: ("stopped processing", "usually the program, which the driver stopped: check its log"),
    63: ("ECC row remapping pending", "reset the GPU (nvidia-smi -r) or reboot to apply it"),
    64: ("ECC row remapping failed", "reset the GPU or reboot; if it comes back, the card needs service"),
    92: ("high single-bit ECC error rate", "if it keeps rising, the card needs service"),
    94: ("contained ECC error", "the program using that memory was stopped; reset the GPU when you can"),
    95: ("uncontained ECC error", "reset the GPU (nvidia-smi -r) or reboot"),
    119: ("GSP firmware timeout", "reset the GPU or reboot; update the driver if it comes back"),
    120: ("GSP firmware error", "reset the GPU or reboot; update the driver if it comes back"),
}
XID_CATALOGUE = "see NVIDIA's XID catalogue (docs.nvidia.com/deploy/xid-errors)"


def under_load(gpu: GpuStats) -> bool:
    """Busy enough to be judged; a GPU without a utilisation reading (MIG) is not judged."""
    return isinstance(gpu.util, (int, float)) and gpu.util >= LOAD_UTIL


def held_back(gpu: GpuStats, active_s: Mapping[str, float] | None = None,
              since: Mapping[str, str] | None = None, at: float | None = None) -> list[str]:
    """What holds ``gpu`` back now, one sentence per cause with its fix; [] when nothing does.

    Args:
        gpu: one GPU's stats, health included.
        active_s: how long each active reason has been active (:class:`ReasonTimer`); a reason held
            for less than ``HELD_FOR_S`` is a moment and is not judged. None (one snapshot, as
            ``status`` has) judges every active reason.
        since: a reason's start as its sentence says it ("00:41"), where known.
        at: the unix time of ``gpu``'s line, against which an XID is recent (None: now).
    """
    xid = _xid_words(gpu, time.time() if at is None else at)
    if not under_load(gpu):
        return xid
    active = [name for name in gpu.throttle or () if name != IDLE]
    reasons = _one_per_cause([name for name in active if active_s is None or active_s.get(name, 0.0) >= HELD_FOR_S],
                             active_s or {})
    causes = [_reason_words(gpu, name, (since or {}).get(name)) for name in reasons]
    if not active and _well_below(gpu.sm_clock, gpu.sm_clock_max):  # a reason's first moment is not "none"
        why = "with no reason given by its driver" if gpu.throttle is None else "with no clock event reason"
        causes.append(f"GPU {gpu.index} runs at {_clocks(gpu)} under load {why}; "
                      "look at its clocks (nvidia-smi -q -d PERFORMANCE,CLOCK)")
    return xid + causes + _link_words(gpu)


def _one_per_cause(reasons: list[str], active_s: Mapping[str, float]) -> list[str]:
    """One reason for each cause a person is told (HW and SW thermal slowdown are one): the one held longest."""
    chosen: dict[str, str] = {}
    for name in reasons:
        cause_words = REASONS.get(name, (name, ""))[0]
        if cause_words not in chosen or active_s.get(name, 0.0) > active_s.get(chosen[cause_words], 0.0):
            chosen[cause_words] = name
    return list(chosen.values())


class ReasonTimer:
    """How long each GPU's clock event reasons have been active without a break, by its lines' times.

    Feed it every stats line in order (``update``); a reason missing from one line starts again.
    """

    def __init__(self) -> None:
        self._since: dict[Hashable, dict[str, float]] = {}

    def update(self, key: Hashable, gpu: GpuStats, at: float) -> dict[str, float]:
        """Note ``gpu``'s reasons at time ``at`` (its line's timestamp) under ``key`` (a node and GPU
        uuid); return each active reason's seconds active, for :func:`held_back`."""
        before = self._since.get(key, {})
        since = {name: before.get(name, at) for name in gpu.throttle or ()}
        self._since[key] = since
        return {name: at - start for name, start in since.items()}


class GpuHealth:
    """What holds one node's GPUs back now, judged from its stats lines as they arrive (:meth:`take`,
    every line in order): a reason counts once held ``HELD_FOR_S``, and its sentence says since when
    in local time. The node's session keeps one while it is online, the one judgement: its :meth:`judgement`
    travels on each NodeStatsUpdated."""

    def __init__(self) -> None:
        self._timer = ReasonTimer()
        self._latest: NodeStats | None = None
        self._active_s: dict[Hashable, dict[str, float]] = {}

    def take(self, stats: NodeStats) -> None:
        """Note one stats line, by its own timestamp."""
        self._latest = stats
        self._active_s = {_gpu_key(gpu): self._timer.update(_gpu_key(gpu), gpu, stats.timestamp)
                          for gpu in stats.gpus}

    def causes(self, indices: Collection[int] | None = None) -> list[str]:
        """:func:`held_back`'s sentences for the latest line's GPUs, or only those of ``indices``
        (a worker's GPUs on the node); [] before any line."""
        if self._latest is None:
            return []
        at, causes = self._latest.timestamp, []
        for gpu in self._latest.gpus:
            if indices is None or gpu.index in indices:
                active_s = self._active_s.get(_gpu_key(gpu), {})
                since = {name: _local_clock(at - seconds) for name, seconds in active_s.items()}
                causes += held_back(gpu, active_s, since, at)
        return causes

    def judgement(self) -> HeldBack:
        """:meth:`causes` of the latest line, GPU by GPU, as the value NodeStatsUpdated carries to every reader."""
        if self._latest is None:
            return HeldBack()
        return HeldBack(tuple((gpu.index, tuple(self.causes([gpu.index]))) for gpu in self._latest.gpus))


def _gpu_key(gpu: GpuStats) -> Hashable:
    return gpu.uuid or gpu.index  # the uuid stays with the card if the driver renumbers it


def _local_clock(at: float) -> str:
    return time.strftime("%H:%M", time.localtime(at))


# --- the words -----------------------------------------------------------------------------------

def _reason_words(gpu: GpuStats, name: str, since: str | None = None) -> str:
    what, fix = REASONS.get(name, (f"clock event {name}", "see nvidia-smi -q -d PERFORMANCE"))
    where = ""
    if name in THERMAL and isinstance(gpu.temp, (int, float)):
        where = f" at {gpu.temp:.0f} °C"
    if since:
        where += f" since {since}"
    clocks = _clocks(gpu)
    if name == "sw_power_cap" and isinstance(gpu.power_limit, (int, float)):
        clocks = f"{clocks} at its {gpu.power_limit:.0f} W limit" if clocks else f"at its {gpu.power_limit:.0f} W limit"
    return f"GPU {gpu.index} {what}{where}{': ' + clocks if clocks else ''}; {fix}"


def _clocks(gpu: GpuStats) -> str:
    """``clocks 1,200 of 1,860 MHz`` (SM), as much of it as is known; "" when nothing is."""
    if not _known(gpu.sm_clock):
        return ""
    if not _known(gpu.sm_clock_max):
        return f"clocks {gpu.sm_clock:,.0f} MHz"
    return f"clocks {gpu.sm_clock:,.0f} of {gpu.sm_clock_max:,.0f} MHz"


def _well_below(value, maximum) -> bool:
    return _known(value) and _known(maximum) and maximum > 0 and value < SLOW_CLOCK_SHARE * maximum


def _link_words(gpu: GpuStats) -> list[str]:
    return [f"{what}: {why}; {fix}" for what, why, fix in link_causes(gpu)]


def link_causes(gpu: GpuStats) -> list[tuple[str, str, str]]:
    """The link against what the card and slot can do together, and the slot against the card, as
    (what, its likely cause, the fix): ``("GPU 0 runs PCIe 3.0 x1 of 4.0 x16", "a riser or a card not
    fully seated", "seat it in the slot itself")``. Judged whatever the load: the caller knows the GPU
    is at work (its utilisation, or a load of its own as doctor's)."""
    link, causes = gpu.pcie, []
    if _below(link.gen, link.max_gen) or _below(link.width, link.max_width):
        causes.append((f"GPU {gpu.index} runs PCIe {link_text(link.gen, link.width)} of "
                       f"{link_text(link.max_gen, link.max_width)}", "a riser or a card not fully seated",
                       "seat it in the slot itself"))
    if _below(link.max_gen, link.gpu_max_gen) or _below(link.max_width, link.gpu_max_width):
        causes.append((f"GPU {gpu.index}'s slot allows PCIe {link_text(link.max_gen, link.max_width)} of the "
                       f"card's {link_text(link.gpu_max_gen, link.gpu_max_width)}",
                       "the board's second slot or an older board", "move it to the first x16 slot"))
    return causes


def _xid_words(gpu: GpuStats, at: float) -> list[str]:
    """The last XID, where it was logged within ``XID_RECENT_S`` of ``at``: its code, what it means and the fix."""
    xid = gpu.xid
    if xid is None or not _known(xid.last) or not _known(xid.last_at) or at - xid.last_at > XID_RECENT_S:
        return []
    what, fix = XIDS.get(int(xid.last), (None, XID_CATALOGUE))
    name = f"XID {xid.last:.0f}" + (f" ({what})" if what else "")
    return [f"GPU {gpu.index} {name} at {_local_clock(xid.last_at)}, {xid.count:.0f} since boot; {fix}"]


def link_text(gen, width) -> str:
    """``3.0 x16``: generation and width, as much as is known; "unknown" when neither is."""
    parts = ([f"{gen:.0f}.0"] if _known(gen) else []) + ([f"x{width:.0f}"] if _known(width) else [])
    return " ".join(parts) or "unknown"


def _below(value, limit) -> bool:
    return _known(value) and _known(limit) and value < limit


def _known(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)

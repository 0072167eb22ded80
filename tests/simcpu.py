"""A simulated node whose CPU is slow for real: a cgroup quota on everything its sshd starts."""

from __future__ import annotations

import contextlib
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import tiers
from simcluster import SimNode


@contextmanager
def cpu_share(node: SimNode, percent: int, weight: int = 100, period_us: int = 100_000,
              cores: str | None = None) -> Iterator[None]:
    """Every process `node`'s sshd starts from now on gets `percent` % of one core (a cgroup v1 cpu quota,
    else cgroup v2's cpu.max), the listener's children inheriting it: a machine that is slow for real. A
    `weight` over the default's 100 keeps that share when the suite keeps this machine's cores busy. `cores`
    ("1", "0-1") pins them there too (`cpu_set`)."""
    name = f"homegpu-cpu-{node.name}-{node.pid}"
    with cpu_quota(node.pid, name, percent, weight, period_us), \
            (cpu_set(node.pid, name, cores) if cores else contextlib.nullcontext()):
        yield


@contextmanager
def cpu_set(pid: int, name: str, cores: str) -> Iterator[None]:
    """Process `pid` and the children it starts from now on run on `cores` only (a cgroup v1 cpuset `name`): a
    machine with that many cores of its own. TensorFlow's and PyTorch's thread pools size themselves to the
    affinity this gives, as on such a machine; under a quota alone they run a thread per core of this machine
    and spend a period's quota in a burst across them."""
    tiers.need("root")
    group = Path("/sys/fs/cgroup/cpuset") / name
    group.mkdir()
    try:
        (group / "cpuset.cpus").write_text(cores)
        (group / "cpuset.mems").write_text((group.parent / "cpuset.mems").read_text())
        (group / "cgroup.procs").write_text(str(pid))
        yield
    finally:
        _remove(group)


@contextmanager
def own_core(node: SimNode) -> Iterator[None]:
    """`node`'s processes get a whole core that a busy suite cannot take (the top weight): the fast machine
    beside a slow one, which would otherwise get less of this machine's busy cores than the slow one's quota."""
    with cpu_share(node, 100, weight=10000):
        yield


@contextmanager
def cpu_quota(pid: int, name: str, percent: int, weight: int = 100, period_us: int = 100_000) -> Iterator[None]:
    """Process `pid` and the children it starts from now on get `percent` % of one core (cgroup `name`), and a
    share of a busy machine by cgroup v2's `weight` (1 to 10000; 100 is the default, as cgroup v1's 1024 shares),
    in periods of `period_us` (a short one slows every short step, not some steps a lot)."""
    tiers.need("root")
    v1 = Path("/sys/fs/cgroup/cpu")
    group = (v1 if (v1 / "cpu.cfs_quota_us").exists() else Path("/sys/fs/cgroup")) / name
    group.mkdir()
    try:
        if (group / "cpu.cfs_quota_us").exists():
            (group / "cpu.cfs_period_us").write_text(str(period_us))
            (group / "cpu.cfs_quota_us").write_text(str(period_us * percent // 100))
            (group / "cpu.shares").write_text(str(weight * 1024 // 100))
        else:
            (group / "cpu.max").write_text(f"{period_us * percent // 100} {period_us}")
            (group / "cpu.weight").write_text(str(weight))
        (group / "cgroup.procs").write_text(str(pid))
        yield
    finally:
        _remove(group)


def _remove(group: Path) -> None:
    """Cgroup `group` gone, its processes back in its parent."""
    for member in (group / "cgroup.procs").read_text().split():
        with contextlib.suppress(OSError):
            (group.parent / "cgroup.procs").write_text(member)
    group.rmdir()
